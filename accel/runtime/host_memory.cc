#include "accel/runtime/host_memory.h"

#include <malloc.h>

#include <climits>
#include <cstdlib>
#include <cstring>

namespace accel {

std::string ReuseFreedHostMemory() {
  for (const char* name : {"MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_",
                           "MALLOC_MMAP_THRESHOLD_"}) {
    if (std::getenv(name) != nullptr) {
      return std::string("left malloc as ") + name + " sets it";
    }
  }
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc") != nullptr) {
    return "left malloc as GLIBC_TUNABLES sets it";
  }
  // The trim threshold first: with it set, glibc also stops adapting its
  // mmap threshold on its own.
  if (mallopt(M_TRIM_THRESHOLD, INT_MAX) != 1 || mallopt(M_MMAP_MAX, 0) != 1) {
    return "malloc refused the settings; freed memory goes back to the system";
  }
  return "freed memory stays in the process for reuse (no mmap per large "
         "block, no heap trimming)";
}

}  // namespace accel
