// Private to the conformance suite (conformance.cc,
// conformance_collectives.cc): buffers in the backend's memory whose values
// are prepared and checked on the host, and a test run on a backend's ranks.
//
//   Buffer values(DType::kInt32, 1);
//   values.Set(0, 1);
//   comm.allreduce(values.data(), 1, DType::kInt32, ReduceOp::kSum);
//   EXPECT_EQ(values.At(0), comm.size());
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "accel/runtime/base/dtype.h"
#include "tests/conformance.h"
#include "tests/thread_ranks.h"

namespace accel::testing::conformance_internal {

// Runs `body` on every rank of a `world_size` group of `backend`, as the
// backend's setup runs ranks (threads unless it says otherwise).
void RunOnRanks(const std::string& backend, int world_size,
                const std::function<void(Communicator&)>& body,
                const RankOptions& options = {});

// Why `world_size` cannot run in this process, or "" when it can.
std::string Unsupported(int world_size);

// A test of every backend at each world size: the parameter is (backend,
// world size); skipped where the world size cannot run in this process.
class BackendWorldTest
    : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  const std::string& backend() const { return std::get<0>(GetParam()); }
  int world_size() const { return std::get<1>(GetParam()); }
  void SetUp() override {
    const std::string why = Unsupported(world_size());
    if (!why.empty()) GTEST_SKIP() << why;
  }
  void Run(const std::function<void(Communicator&)>& body,
           const RankOptions& options = {}) {
    RunOnRanks(backend(), world_size(), body, options);
  }
};

// "gloo_world4", the instantiations' test names.
std::string BackendWorldName(
    const ::testing::TestParamInfo<std::tuple<std::string, int>>& info);

// Values prepared and checked on the host; data() hands the backend a
// buffer in its memory holding them, and At() reads its result back.
class Buffer {
 public:
  Buffer(DType dtype, size_t count);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data();
  void Set(size_t i, double v);
  double At(size_t i);

 private:
  DType dtype_;
  std::vector<char> host_;
  void* buffer_;
  bool fresh_ = true;
};

// The checks of each operation (conformance_checks.cc): each runs the
// operation on `comm` with every count in `counts` (and every dtype, and
// reduction, as it says) and expects exact results.
// The element counts every operation runs with: 0, 1, 3, 1000 and 1M
// (ACCEL_CONFORMANCE_LARGE_COUNT lowers the largest).
const std::vector<size_t>& Counts();
// A value per (rank, index) that every dtype holds exactly and whose sums
// over 4 ranks, and products for kProduct, stay exact too.
double Value(DType dtype, int rank, size_t i, ReduceOp op = ReduceOp::kSum);
double Combine(ReduceOp op, double a, double b);
// "allgather float32 count 3 on rank 1".
std::string Label(const char* op, DType dtype, size_t count, int rank);
// counts[r] for a reduce-scatter or allgatherv around `count`: rank 1 gets
// nothing, odd ranks half, the others `count`.
std::vector<size_t> UnequalCounts(int ranks, size_t count);
// One reduce-scatter of `counts`, checking this rank's segment; `in_place`
// passes this rank's segment of the input as the output.
void CheckReduceScatter(Communicator& comm, DType dtype, ReduceOp op,
                        const std::vector<size_t>& counts, bool in_place);
void CheckAllgather(Communicator& comm,
                    const std::vector<size_t>& counts = Counts());
void CheckAllgathervWithUnequalAndZeroCounts(
    Communicator& comm, const std::vector<size_t>& counts = Counts());
void CheckAllreduceEveryOperation(Communicator& comm,
                                  const std::vector<size_t>& counts = Counts());
void CheckReduceScatterEveryOperation(
    Communicator& comm, const std::vector<size_t>& counts = Counts());
void CheckBroadcastFromEveryRoot(Communicator& comm,
                                 const std::vector<size_t>& counts = Counts());
void CheckAllToAll(Communicator& comm,
                   const std::vector<size_t>& counts = Counts());
void CheckAllToAllvWithUnequalAndZeroCounts(
    Communicator& comm, const std::vector<size_t>& counts = Counts());

// Checks the first mismatch only, so a wrong 1M-element buffer prints once.
#define EXPECT_VALUES(n, actual, expected, what)                  \
  for (size_t i_ = 0; i_ < (n); ++i_) {                           \
    const double a_ = (actual), e_ = (expected);                  \
    if (a_ != e_) {                                               \
      ADD_FAILURE() << what << ": element " << i_ << " is " << a_ \
                    << ", expected " << e_;                       \
      break;                                                      \
    }                                                             \
  }

}  // namespace accel::testing::conformance_internal
