// Accelerate's gather_object and broadcast_object_list: collectives on plain
// C++ values (strings, numbers, containers of them, your own types) instead
// of tensors.
//
//   // Every rank passes a list; every rank receives all lists, flattened in
//   // rank order (Accelerate flattens one level the same way).
//   std::vector<std::string> mine = {"rank" + std::to_string(comm.rank())};
//   std::vector<std::string> all = accel::GatherObject(comm, mine);
//   // 2 ranks: all == {"rank0", "rank1"} on both.
//
//   // Every rank's list becomes rank 0's (any length; see below).
//   std::vector<std::map<std::string, double>> config;
//   if (comm.rank() == 0) config = {{{"lr", 3e-4}, {"warmup", 100}}};
//   accel::BroadcastObjectList(comm, config);  // Rank 0's, everywhere.
//
// Accelerate pickles arbitrary Python objects; C++ has no reflection, so a
// value travels through an ObjectCodec<T>. Codecs are provided for bool,
// integral, floating and enum types, std::string, std::vector, std::map,
// std::pair and std::optional, nested freely. For your own type, specialize
// ObjectCodec in namespace accel, in a header every rank's code sees:
//
//   struct Score { std::string name; double value; };
//
//   template <>
//   struct accel::ObjectCodec<Score> {
//     static void Encode(const Score& score, std::string* out) {
//       accel::EncodeObject(score.name, out);
//       accel::EncodeObject(score.value, out);
//     }
//     static Score Decode(accel::ByteReader& in) {
//       Score score;
//       score.name = accel::DecodeObject<std::string>(in);
//       score.value = accel::DecodeObject<double>(in);
//       return score;
//     }
//   };
//
//   std::vector<Score> scores = accel::GatherObject(comm, my_scores);
//
// Every encoded value must take at least one byte (all the codecs above do;
// a codec for an empty type can write one marker byte): that lets decoding
// reject a hostile element count before it allocates anything.
//
// Decoding never trusts its input: a truncated, overlong or otherwise
// malformed buffer throws accel::UsageError naming the type and the byte
// offset, never reads out of bounds. Each rank's payload starts with the
// name of its C++ type, so ranks that pass different types get one clear
// error listing every rank's type rather than garbage.
//
// Differences from Accelerate: values take the same encode/decode path at
// one process as at many (so a codec bug shows in a one-process run), and
// BroadcastObjectList replaces the whole list, so receivers need not know
// its length in advance (torch requires equal lengths on every rank).
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/communicator.h"

namespace accel {

// Reads an encoded value front to back, checking every read against the
// end of the buffer.
class ByteReader {
 public:
  explicit ByteReader(std::string_view bytes) : bytes_(bytes) {}

  // The next `count` bytes; UsageError when fewer remain.
  std::string_view ReadBytes(size_t count);
  void Read(void* out, size_t count);
  // A length or element count written by WriteLength. UsageError when it
  // exceeds the bytes that remain: every element takes at least one byte,
  // so no valid buffer holds more.
  size_t ReadLength();

  size_t offset() const { return offset_; }
  size_t remaining() const { return bytes_.size() - offset_; }
  bool at_end() const { return offset_ == bytes_.size(); }

  // Throws UsageError "malformed object bytes at offset <n> of <size>:
  // <message>".
  [[noreturn]] void Fail(const std::string& message) const;

 private:
  std::string_view bytes_;
  size_t offset_ = 0;
};

// The counterpart of ByteReader::ReadLength.
void WriteLength(size_t length, std::string* out);

// Specialize for your own types (see the top of this file).
template <typename T, typename = void>
struct ObjectCodec;

template <typename T>
void EncodeObject(const T& value, std::string* out) {
  ObjectCodec<T>::Encode(value, out);
}

template <typename T>
T DecodeObject(ByteReader& in) {
  return ObjectCodec<T>::Decode(in);
}

// The whole buffer as one T; trailing bytes are malformed.
template <typename T>
std::string SerializeObject(const T& value) {
  std::string bytes;
  EncodeObject(value, &bytes);
  return bytes;
}

template <typename T>
T DeserializeObject(std::string_view bytes) {
  ByteReader in(bytes);
  T value = DecodeObject<T>(in);
  if (!in.at_end()) {
    in.Fail(std::to_string(in.remaining()) + " bytes left after the value");
  }
  return value;
}

template <>
struct ObjectCodec<bool> {
  static void Encode(bool value, std::string* out) {
    out->push_back(value ? 1 : 0);
  }
  static bool Decode(ByteReader& in) {
    const char byte = in.ReadBytes(1)[0];
    if (byte != 0 && byte != 1) {
      in.Fail("a bool must be byte 0 or 1, found " +
              std::to_string(static_cast<unsigned char>(byte)));
    }
    return byte == 1;
  }
};

// Integers, floating-point numbers and enums: their bytes, in the host's
// order (every rank of a job runs on the same architecture).
template <typename T>
struct ObjectCodec<
    T, std::enable_if_t<(std::is_arithmetic_v<T> ||
                         std::is_enum_v<T>)&&!std::is_same_v<T, bool>>> {
  static void Encode(T value, std::string* out) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    out->append(bytes, sizeof(T));
  }
  static T Decode(ByteReader& in) {
    T value;
    in.Read(&value, sizeof(T));
    return value;
  }
};

template <>
struct ObjectCodec<std::string> {
  static void Encode(const std::string& value, std::string* out) {
    WriteLength(value.size(), out);
    out->append(value);
  }
  static std::string Decode(ByteReader& in) {
    return std::string(in.ReadBytes(in.ReadLength()));
  }
};

template <typename T, typename Allocator>
struct ObjectCodec<std::vector<T, Allocator>> {
  static void Encode(const std::vector<T, Allocator>& values,
                     std::string* out) {
    WriteLength(values.size(), out);
    for (const auto& value : values) EncodeObject<T>(value, out);
  }
  static std::vector<T, Allocator> Decode(ByteReader& in) {
    const size_t count = in.ReadLength();
    std::vector<T, Allocator> values;
    values.reserve(count);
    for (size_t i = 0; i < count; ++i) values.push_back(DecodeObject<T>(in));
    return values;
  }
};

template <typename K, typename V, typename Compare, typename Allocator>
struct ObjectCodec<std::map<K, V, Compare, Allocator>> {
  using Map = std::map<K, V, Compare, Allocator>;
  static void Encode(const Map& values, std::string* out) {
    WriteLength(values.size(), out);
    for (const auto& [key, value] : values) {
      EncodeObject<K>(key, out);
      EncodeObject<V>(value, out);
    }
  }
  static Map Decode(ByteReader& in) {
    const size_t count = in.ReadLength();
    Map values;
    for (size_t i = 0; i < count; ++i) {
      K key = DecodeObject<K>(in);
      V value = DecodeObject<V>(in);
      if (!values.emplace(std::move(key), std::move(value)).second) {
        in.Fail("duplicate key in a map");
      }
    }
    return values;
  }
};

template <typename A, typename B>
struct ObjectCodec<std::pair<A, B>> {
  static void Encode(const std::pair<A, B>& value, std::string* out) {
    EncodeObject<A>(value.first, out);
    EncodeObject<B>(value.second, out);
  }
  static std::pair<A, B> Decode(ByteReader& in) {
    A first = DecodeObject<A>(in);
    B second = DecodeObject<B>(in);
    return {std::move(first), std::move(second)};
  }
};

template <typename T>
struct ObjectCodec<std::optional<T>> {
  static void Encode(const std::optional<T>& value, std::string* out) {
    EncodeObject<bool>(value.has_value(), out);
    if (value.has_value()) EncodeObject<T>(*value, out);
  }
  static std::optional<T> Decode(ByteReader& in) {
    if (!DecodeObject<bool>(in)) return std::nullopt;
    return DecodeObject<T>(in);
  }
};

namespace object_collectives_internal {

// "std::vector<int, std::allocator<int> >" for messages.
std::string Demangle(const char* name);

// Each rank's payload, in rank order, on every rank (allgather of sizes,
// then allgatherv of bytes).
std::vector<std::string> AllgatherBytes(Communicator& comm,
                                        const std::string& payload,
                                        const CollectiveOptions& options);
// from_process's payload, on every rank (broadcast of the size, then of the
// bytes).
std::string BroadcastBytes(Communicator& comm, const std::string& payload,
                           int from_process, const CollectiveOptions& options);

// A payload is the type's name then the encoded list.
std::string BeginPayload(const char* type_name);
// Checks the type name that opens `payload` (sent by `rank`) against this
// rank's and returns a reader positioned after it.
ByteReader OpenPayload(const Communicator& comm, const char* operation,
                       const std::string& payload, int rank,
                       const char* type_name);
// UsageError naming every rank whose type differs, or nothing.
void CheckSameTypes(const Communicator& comm, const char* operation,
                    const std::vector<std::string>& payloads,
                    const char* type_name);
// Rethrows a decode failure of `rank`'s payload with the operation and rank.
[[noreturn]] void FailDecode(const Communicator& comm, const char* operation,
                             int rank, const char* type_name,
                             const Error& error);

CollectiveOptions Named(const CollectiveOptions& options, const char* api);

template <typename T>
std::vector<T> DecodeList(const Communicator& comm, const char* operation,
                          const std::string& payload, int rank) {
  const char* type_name = typeid(std::vector<T>).name();
  ByteReader in = OpenPayload(comm, operation, payload, rank, type_name);
  try {
    std::vector<T> objects = DecodeObject<std::vector<T>>(in);
    if (!in.at_end()) {
      in.Fail(std::to_string(in.remaining()) + " bytes left after the list");
    }
    return objects;
  } catch (const Error& error) {
    FailDecode(comm, operation, rank, type_name, error);
  }
}

template <typename T>
std::string EncodeList(const std::vector<T>& objects) {
  std::string payload = BeginPayload(typeid(std::vector<T>).name());
  EncodeObject(objects, &payload);
  return payload;
}

}  // namespace object_collectives_internal

// Every rank passes its list; every rank receives the concatenation of all
// lists in rank order. Every rank must call it, with the same T.
template <typename T>
std::vector<T> GatherObject(Communicator& comm, const std::vector<T>& objects,
                            const CollectiveOptions& options = {}) {
  namespace internal = object_collectives_internal;
  const std::vector<std::string> payloads =
      internal::AllgatherBytes(comm, internal::EncodeList(objects),
                               internal::Named(options, "gather_object"));
  internal::CheckSameTypes(comm, "gather_object", payloads,
                           typeid(std::vector<T>).name());
  std::vector<T> gathered;
  for (int rank = 0; rank < comm.size(); ++rank) {
    std::vector<T> part =
        internal::DecodeList<T>(comm, "gather_object", payloads[rank], rank);
    for (T& object : part) gathered.push_back(std::move(object));
  }
  return gathered;
}

// In place: every rank's list becomes from_process's list (whatever length
// it had before); returns it.
template <typename T>
std::vector<T>& BroadcastObjectList(Communicator& comm, std::vector<T>& objects,
                                    int from_process = 0,
                                    const CollectiveOptions& options = {}) {
  namespace internal = object_collectives_internal;
  std::string payload;
  if (comm.rank() == from_process) payload = internal::EncodeList(objects);
  payload = internal::BroadcastBytes(
      comm, payload, from_process,
      internal::Named(options, "broadcast_object_list"));
  if (comm.rank() != from_process) {
    objects = internal::DecodeList<T>(comm, "broadcast_object_list", payload,
                                      from_process);
  }
  return objects;
}

}  // namespace accel
