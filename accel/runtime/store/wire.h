// The TCP store's wire format, shared by its server and its client.
//
//   std::string frame = store_wire::Framed(
//       store_wire::Writer().U64(id).U8(Op::kGet).Str(key).bytes());
//   store_wire::Reader reader(body);  // a message without its length
//   uint64_t id = reader.U64();
//
// Every message is a little-endian u32 length followed by that many bytes.
// A request is a u64 id, an Op and its fields; its response is the same id,
// a Status and its fields. Ids let several threads share one connection;
// waits are answered when their keys arrive, out of order. The hello
// carries kProtocolVersion (bumped whenever a message changes), so that
// processes of different accel versions are told apart instead of
// misreading each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace accel::store_wire {

inline constexpr uint64_t kProtocolVersion = 2;

enum class Op : uint8_t {
  kHello = 1,  // secret, rank, job id, protocol version
  kSet,        // key, value
  kGet,        // key
  kWait,       // count, keys..., timeout in ms
  kAdd,        // key, delta
  kDepartures,
  kGoodbye,  // no response
  kLeaving,  // how the rank is leaving ("exited with an error"...)
};

enum class Status : uint8_t {
  kOk = 0,
  kMissing,
  kTimeout,
  kDenied,        // Another run secret.
  kOtherJob,      // Same secret, another job id.
  kRankTaken,     // That rank is connected already.
  kOtherVersion,  // Another protocol version (another accel).
};

// A hello and a request before it fit in this; bigger ones from a client
// that has not presented the secret are refused.
inline constexpr size_t kMaxUnauthenticatedMessage = 4096;
// How a rank says it is leaving, as its peers' errors will quote it.
inline constexpr size_t kMaxLeavingText = 600;
inline constexpr size_t kMaxResponseBytes = size_t{1} << 30;

class Writer {
 public:
  Writer& U8(uint8_t v) {
    bytes_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& U8(Op op) { return U8(static_cast<uint8_t>(op)); }
  Writer& U8(Status status) { return U8(static_cast<uint8_t>(status)); }
  Writer& U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      bytes_.push_back(static_cast<char>(v >> (8 * i)));
    }
    return *this;
  }
  Writer& Str(const std::string& s) {
    U64(s.size());
    bytes_ += s;
    return *this;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// Reads fields of a message; a malformed message throws std::length_error.
class Reader {
 public:
  explicit Reader(const std::string& bytes) : bytes_(bytes) {}
  uint8_t U8() {
    Need(1);
    return static_cast<uint8_t>(bytes_[pos_++]);
  }
  uint64_t U64() {
    Need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) {
      v |= static_cast<uint64_t>(static_cast<uint8_t>(bytes_[pos_ + i]))
           << (8 * i);
    }
    pos_ += 8;
    return v;
  }
  std::string Str() {
    const uint64_t n = U64();
    Need(n);
    std::string s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  size_t remaining() const { return bytes_.size() - pos_; }

 private:
  void Need(uint64_t n) const {
    if (n > bytes_.size() - pos_) throw std::length_error("truncated message");
  }
  const std::string& bytes_;
  size_t pos_ = 0;
};

// `body` with its length prefix.
std::string Framed(const std::string& body);
// The length in a frame's first 4 bytes.
uint32_t DecodeLength(const char* p);
// Compares secrets in time independent of where they differ.
bool SecretsEqual(const std::string& a, const std::string& b);

}  // namespace accel::store_wire
