#include "accel/runtime/base/host_memory.h"

#include <sys/resource.h>

#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace accel {
namespace {

constexpr size_t kBlockBytes = 64 << 20;  // Above glibc's largest threshold.
constexpr long kPages = kBlockBytes / 4096;

long MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Page faults taken by allocating a large block, writing it and freeing it.
long FaultsOfOneLargeBlock() {
  const long before = MinorFaults();
  void* block = std::malloc(kBlockBytes);
  if (block == nullptr) return -1;
  std::memset(block, 1, kBlockBytes);
  // Keeps the compiler from dropping the writes.
  volatile char last = static_cast<char*>(block)[kBlockBytes - 1];
  (void)last;
  std::free(block);
  return MinorFaults() - before;
}

// One test, since the setting is for the whole process and cannot be undone.
TEST(HostMemoryTest, LargeBlocksAreFaultedInOnceInsteadOfEveryTime) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "malloc is the sanitizer's, not glibc's";
#endif
  if (std::getenv("MALLOC_MMAP_MAX_") ||
      std::getenv("MALLOC_MMAP_THRESHOLD_") ||
      std::getenv("MALLOC_TRIM_THRESHOLD_") || std::getenv("GLIBC_TUNABLES")) {
    GTEST_SKIP() << "malloc is tuned through the environment";
  }
  // Without it, every large block costs a fault per page.
  FaultsOfOneLargeBlock();
  EXPECT_GT(FaultsOfOneLargeBlock(), kPages / 2);

  EXPECT_NE(ReuseFreedHostMemory().find("stays in the process"),
            std::string::npos);
  FaultsOfOneLargeBlock();  // Grows the heap once.
  EXPECT_LT(FaultsOfOneLargeBlock(), kPages / 20);
  EXPECT_LT(FaultsOfOneLargeBlock(), kPages / 20);
}

TEST(HostMemoryTest, TheEnvironmentsChoiceWins) {
  setenv("MALLOC_TRIM_THRESHOLD_", "131072", 1);
  EXPECT_EQ(ReuseFreedHostMemory(),
            "left malloc as MALLOC_TRIM_THRESHOLD_ sets it");
  unsetenv("MALLOC_TRIM_THRESHOLD_");
  setenv("GLIBC_TUNABLES",
         "glibc.malloc.tcache_count=0:glibc.malloc.mmap_max=4", 1);
  EXPECT_EQ(ReuseFreedHostMemory(),
            "left malloc as GLIBC_TUNABLES sets glibc.malloc.mmap_max");
  unsetenv("GLIBC_TUNABLES");
}

}  // namespace
}  // namespace accel
