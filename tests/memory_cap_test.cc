// find_executable_batch_size under a memory limit, at 2 processes: memory
// that the process kept for reuse before the search must not end it early.
// Each rank caps its private writable memory (RLIMIT_DATA's soft limit,
// what malloc's heap and mappings draw on) at what it holds plus 160 MB and
// searches twice from batch 512: the first search starts with the heap as
// the Accelerator left it (freed memory kept for reuse), the second after
// the first has returned everything. Both must end at the same size. (Both
// end at 243 here; when kept memory went back only before each retry, the
// first try's heap stayed mapped and scattered: 114, then 91.)
#include "tests/memory_cap.h"

#include <gtest/gtest.h>

#include "accel/accelerator.h"
#include "accel/memory.h"
#include "tests/multiprocess_main.h"

namespace accel::testing {
namespace {

Accelerator& A() { return SharedAccelerator(); }

int64_t Search() {
  return find_executable_batch_size(
      A(),
      [&](int64_t batch_size) {
        TrainScaleModel(A(), {.batch_size = batch_size});
        return batch_size;
      },
      512);
}

TEST(MemoryCapTest, KeptMemoryDoesNotEndTheSearchEarly) {
  const DataLimit limit(160 << 20);
  const int64_t first = Search();
  const int64_t second = Search();
  EXPECT_LT(first, 512);  // The cap bites.
  EXPECT_EQ(first, second);
  A().print("batch sizes found:", first, second);
}

}  // namespace
}  // namespace accel::testing
