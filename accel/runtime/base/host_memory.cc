#include "accel/runtime/base/host_memory.h"

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
  for (const char* tunable :
       {"glibc.malloc.mmap_max", "glibc.malloc.mmap_threshold",
        "glibc.malloc.trim_threshold"}) {
    if (tunables != nullptr && std::strstr(tunables, tunable) != nullptr) {
      return std::string("left malloc as GLIBC_TUNABLES sets ") + tunable;
    }
  }
  // The trim threshold first: with it set, glibc also stops adapting its
  // mmap threshold on its own.
  if (mallopt(M_TRIM_THRESHOLD, INT_MAX) != 1) {
    return "malloc refused M_TRIM_THRESHOLD; freed memory goes back to the "
           "system";
  }
  if (mallopt(M_MMAP_MAX, 0) != 1) {
    return "malloc refused M_MMAP_MAX: the heap is no longer trimmed, but "
           "large blocks are still mapped and unmapped one by one";
  }
  return "freed memory stays in the process for reuse (no mmap per large "
         "block, no heap trimming)";
}

std::string ReturnFreedHostMemory() {
  // glibc's defaults again (M_MMAP_THRESHOLD's, 128 KiB, fixes it instead
  // of letting it adapt, which is the point here): large blocks get their
  // own mapping, unmapped when freed, and the heap is trimmed.
  const bool restored = mallopt(M_MMAP_MAX, 65536) == 1 &&
                        mallopt(M_MMAP_THRESHOLD, 128 * 1024) == 1 &&
                        mallopt(M_TRIM_THRESHOLD, 128 * 1024) == 1;
  malloc_trim(0);
  return restored ? "freed memory goes back to the system from now on"
                  : "malloc refused its defaults; freed memory was trimmed";
}

}  // namespace accel
