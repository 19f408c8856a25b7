#include "accel/runtime/comm/object_collectives.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

namespace accel {

std::string_view ByteReader::ReadBytes(size_t count) {
  if (count > remaining()) {
    Fail("needed " + std::to_string(count) + " more bytes, " +
         std::to_string(remaining()) + " remain");
  }
  std::string_view bytes = bytes_.substr(offset_, count);
  offset_ += count;
  return bytes;
}

void ByteReader::Read(void* out, size_t count) {
  std::string_view bytes = ReadBytes(count);
  if (count > 0) std::memcpy(out, bytes.data(), count);
}

size_t ByteReader::ReadLength() {
  uint64_t length;
  Read(&length, sizeof(length));
  if (length > remaining()) {
    Fail("length " + std::to_string(length) + " exceeds the " +
         std::to_string(remaining()) + " bytes that remain");
  }
  return static_cast<size_t>(length);
}

void ByteReader::Fail(const std::string& message) const {
  throw UsageError("malformed object bytes at offset " +
                   std::to_string(offset_) + " of " +
                   std::to_string(bytes_.size()) + ": " + message);
}

void WriteLength(size_t length, std::string* out) {
  EncodeObject<uint64_t>(length, out);
}

namespace object_collectives_internal {
namespace {

std::string Prefix(const Communicator& comm, const char* operation) {
  return std::string(operation) + " on rank " + std::to_string(comm.rank()) +
         "/" + std::to_string(comm.size()) + ": ";
}

// The type name at the start of a payload, or why there is none.
std::string ReadTypeName(ByteReader& in) {
  return DecodeObject<std::string>(in);
}

}  // namespace

std::string Demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && demangled != nullptr ? demangled.get() : name;
}

std::vector<std::string> AllgatherBytes(Communicator& comm,
                                        const std::string& payload,
                                        const CollectiveOptions& options) {
  const int64_t my_size = static_cast<int64_t>(payload.size());
  std::vector<int64_t> sizes(comm.size());
  comm.allgather(&my_size, sizes.data(), 1, DType::kInt64, options);
  std::vector<size_t> counts(sizes.begin(), sizes.end());
  size_t total = 0;
  for (size_t count : counts) total += count;
  std::string all(total, '\0');
  comm.allgatherv(payload.data(), all.data(), counts, DType::kUInt8, options);
  std::vector<std::string> payloads;
  size_t offset = 0;
  for (size_t count : counts) {
    payloads.push_back(all.substr(offset, count));
    offset += count;
  }
  return payloads;
}

std::string BroadcastBytes(Communicator& comm, const std::string& payload,
                           int from_process, const CollectiveOptions& options) {
  if (from_process < 0 || from_process >= comm.size()) {
    throw UsageError(Prefix(comm, options.api) +
                     "from_process must be a rank in [0, " +
                     std::to_string(comm.size()) + "), found " +
                     std::to_string(from_process));
  }
  int64_t size = static_cast<int64_t>(payload.size());
  comm.broadcast(&size, 1, DType::kInt64, from_process, options);
  std::string received = payload;
  received.resize(static_cast<size_t>(size));
  comm.broadcast(received.data(), received.size(), DType::kUInt8, from_process,
                 options);
  return received;
}

std::string BeginPayload(const char* type_name) {
  return SerializeObject(std::string(type_name));
}

ByteReader OpenPayload(const Communicator& comm, const char* operation,
                       const std::string& payload, int rank,
                       const char* type_name) {
  ByteReader in(payload);
  std::string sent_type;
  try {
    sent_type = ReadTypeName(in);
  } catch (const Error& error) {
    FailDecode(comm, operation, rank, type_name, error);
  }
  if (sent_type != type_name) {
    throw UsageError(Prefix(comm, operation) + "rank " + std::to_string(rank) +
                     " sent " + Demangle(sent_type.c_str()) +
                     " but this rank expects " + Demangle(type_name) +
                     "; every rank must pass the same type");
  }
  return in;
}

void CheckSameTypes(const Communicator& comm, const char* operation,
                    const std::vector<std::string>& payloads,
                    const char* type_name) {
  bool differ = false;
  std::string listing;
  for (size_t rank = 0; rank < payloads.size(); ++rank) {
    ByteReader in(payloads[rank]);
    std::string sent_type;
    try {
      sent_type = ReadTypeName(in);
    } catch (const Error&) {
      sent_type = "<unreadable>";
    }
    listing += (listing.empty() ? "" : ", ") + std::string("rank ") +
               std::to_string(rank) + ": " + Demangle(sent_type.c_str());
    differ = differ || sent_type != type_name;
  }
  if (differ) {
    throw UsageError(Prefix(comm, operation) +
                     "ranks passed different types (" + listing +
                     "); every rank must pass the same type");
  }
}

void FailDecode(const Communicator& comm, const char* operation, int rank,
                const char* type_name, const Error& error) {
  throw UsageError(Prefix(comm, operation) + "cannot decode rank " +
                   std::to_string(rank) + "'s " + Demangle(type_name) + ": " +
                   error.what());
}

CollectiveOptions Named(const CollectiveOptions& options, const char* api) {
  CollectiveOptions named = options;
  if (named.api == nullptr) named.api = api;
  return named;
}

}  // namespace object_collectives_internal
}  // namespace accel
