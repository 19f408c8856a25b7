// Unpredictable hex strings, for secrets and names that strangers must not
// guess.
//
//   std::string secret = accel::RandomHex(16);  // 32 hex digits
#pragma once

#include <cstddef>
#include <string>

namespace accel {

// `bytes` bytes from the kernel's random source, as 2 * bytes hex digits.
std::string RandomHex(size_t bytes);

}  // namespace accel
