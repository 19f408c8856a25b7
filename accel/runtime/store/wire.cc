#include "accel/runtime/store/wire.h"

namespace accel::store_wire {

std::string Framed(const std::string& body) {
  std::string framed(4, '\0');
  const uint32_t n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) framed[i] = static_cast<char>(n >> (8 * i));
  return framed + body;
}

uint32_t DecodeLength(const char* p) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) {
    n |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  }
  return n;
}

bool SecretsEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

}  // namespace accel::store_wire
