#include "accel/runtime/base/random_hex.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "accel/runtime/base/errors.h"

namespace accel {

std::string RandomHex(size_t bytes) {
  std::vector<unsigned char> random(bytes);
  size_t filled = 0;
  while (filled < bytes) {
    const ssize_t n = getrandom(random.data() + filled, bytes - filled, 0);
    if (n < 0 && errno != EINTR) {
      throw Error(std::string("getrandom: ") + std::strerror(errno));
    }
    if (n > 0) filled += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string text;
  for (unsigned char b : random) {
    text += kHex[b >> 4];
    text += kHex[b & 15];
  }
  return text;
}

}  // namespace accel
