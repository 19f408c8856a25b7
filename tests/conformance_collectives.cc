// The conformance suite's collectives: every operation (allgather,
// allgatherv, allreduce, reduce_scatter, broadcast, barrier, all_to_all),
// every dtype,
// counts 0, 1, 3, 1000 and 1M, world sizes 1 to 4, async operations in
// flight together, and invalid arguments (conformance.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "accel/runtime/base/dtype.h"
#include "accel/runtime/base/errors.h"
#include "tests/conformance.h"
#include "tests/conformance_internal.h"
#include "tests/thread_ranks.h"

namespace accel::testing {
namespace {

using conformance_internal::Buffer;
using conformance_internal::CheckAllgather;
using conformance_internal::CheckAllgathervWithUnequalAndZeroCounts;
using conformance_internal::CheckAllreduceEveryOperation;
using conformance_internal::CheckAllToAll;
using conformance_internal::CheckAllToAllvWithUnequalAndZeroCounts;
using conformance_internal::CheckBroadcastFromEveryRoot;
using conformance_internal::CheckReduceScatter;
using conformance_internal::CheckReduceScatterEveryOperation;
using conformance_internal::Counts;
using conformance_internal::Label;
using conformance_internal::UnequalCounts;
using ::testing::HasSubstr;

class ConformanceTest : public conformance_internal::BackendWorldTest {};

TEST_P(ConformanceTest, Allgather) {
  Run([](Communicator& comm) { CheckAllgather(comm); });
}

TEST_P(ConformanceTest, AllgathervWithUnequalAndZeroCounts) {
  Run([](Communicator& comm) {
    CheckAllgathervWithUnequalAndZeroCounts(comm);
  });
}

TEST_P(ConformanceTest, AllreduceEveryOperation) {
  Run([](Communicator& comm) { CheckAllreduceEveryOperation(comm); });
}

TEST_P(ConformanceTest, ReduceScatterEveryOperationWithUnequalAndZeroCounts) {
  Run([](Communicator& comm) { CheckReduceScatterEveryOperation(comm); });
}

TEST_P(ConformanceTest, AllToAll) {
  Run([](Communicator& comm) { CheckAllToAll(comm); });
}

TEST_P(ConformanceTest, AllToAllvWithUnequalAndZeroCounts) {
  Run([](Communicator& comm) { CheckAllToAllvWithUnequalAndZeroCounts(comm); });
}

// What rank q sends rank r must be what r expects from q: every rank finds
// the mismatch (a UsageError naming both), and the job goes on.
TEST_P(ConformanceTest, AllToAllvWithMismatchedCountsIsAUsageErrorOnEveryRank) {
  Run([](Communicator& comm) {
    const int n = comm.size();
    std::vector<size_t> send(n, 1), receive(n, 1);
    if (comm.rank() == n - 1) receive[0] = 2;  // Rank 0 sends it 1.
    std::vector<int32_t> input(n, 1), output(n + 1, 0);
    try {
      comm.all_to_allv(input.data(), send, output.data(), receive,
                       DType::kInt32);
      ADD_FAILURE() << "mismatched all_to_allv counts did not throw";
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(),
                  HasSubstr("rank 0 sends 1 element(s) to rank " +
                            std::to_string(n - 1) + ", which expects 2"));
    }
    int32_t one = 1;
    comm.allreduce(&one, 1, DType::kInt32, ReduceOp::kSum);
    EXPECT_EQ(one, n);
  });
}

TEST_P(ConformanceTest, ReduceScatterInPlaceIntoThisRanksSegment) {
  Run([&](Communicator& comm) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
      for (size_t count : Counts()) {
        CheckReduceScatter(comm, dtype, ReduceOp::kSum,
                           std::vector<size_t>(comm.size(), count), true);
        CheckReduceScatter(comm, dtype, ReduceOp::kSum,
                           UnequalCounts(comm.size(), count), true);
      }
    }
  });
}

TEST_P(ConformanceTest, ReduceScatterAsyncOverlapsOtherWork) {
  Run([&](Communicator& comm) {
    const size_t count = 1000;
    std::vector<float> input(count * comm.size(), 1.0f);
    std::vector<float> output(count);
    auto work = comm.reduce_scatter_async(
        input.data(), output.data(), std::vector<size_t>(comm.size(), count),
        DType::kFloat32, ReduceOp::kSum);
    int32_t value = 1;
    comm.allreduce(&value, 1, DType::kInt32, ReduceOp::kSum);
    work->wait();
    EXPECT_EQ(value, comm.size());
    EXPECT_VALUES(
        count, output[i_], static_cast<double>(comm.size()),
        "reduce_scatter_async on rank " + std::to_string(comm.rank()));
  });
}

TEST_P(ConformanceTest, BroadcastFromEveryRoot) {
  Run([](Communicator& comm) { CheckBroadcastFromEveryRoot(comm); });
}

TEST_P(ConformanceTest, BarrierWaitsForTheSlowestRank) {
  Run([&](Communicator& comm) {
    auto now_ns = [] {
      // CLOCK_MONOTONIC: comparable between the processes of one host.
      return static_cast<int64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(
              std::chrono::steady_clock::now().time_since_epoch())
              .count());
    };
    const int slowest = comm.size() - 1;
    comm.barrier();  // Ranks start at different times.
    int64_t arrived = 0;
    if (comm.rank() == slowest) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      arrived = now_ns();
    }
    comm.barrier();
    const int64_t passed = now_ns();
    Buffer arrival(DType::kInt64, 1);
    arrival.Set(0, static_cast<double>(arrived));
    comm.broadcast(arrival.data(), 1, DType::kInt64, slowest);
    EXPECT_GE(passed, static_cast<int64_t>(arrival.At(0)))
        << "rank " << comm.rank() << " left the barrier before rank " << slowest
        << " arrived";
  });
}

TEST_P(ConformanceTest, ManyAsyncOperationsInFlightCompleteInOrder) {
  Run([&](Communicator& comm) {
    constexpr int kOps = 16;
    constexpr size_t kCount = 4096;
    const int n = comm.size();
    std::vector<std::unique_ptr<Buffer>> buffers;
    std::vector<std::unique_ptr<Buffer>> gathered;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < kOps; ++k) {
      buffers.push_back(std::make_unique<Buffer>(DType::kInt64, kCount));
      gathered.push_back(std::make_unique<Buffer>(DType::kInt64, kCount * n));
      for (size_t i = 0; i < kCount; ++i) {
        buffers[k]->Set(i, k * 1000 + comm.rank() + static_cast<double>(i));
      }
      // Alternate kinds so that a reordering would mix them up.
      if (k % 2 == 0) {
        works.push_back(comm.allreduce_async(buffers[k]->data(), kCount,
                                             DType::kInt64, ReduceOp::kSum));
      } else {
        works.push_back(comm.allgather_async(
            buffers[k]->data(), gathered[k]->data(), kCount, DType::kInt64));
      }
    }
    for (int k = kOps - 1; k >= 0; --k) works[k]->wait();
    for (int k = 0; k < kOps; ++k) {
      for (size_t i = 0; i < kCount; ++i) {
        if (k % 2 == 0) {
          const double expected =
              n * (k * 1000 + static_cast<double>(i)) + n * (n - 1) / 2;
          ASSERT_EQ(buffers[k]->At(i), expected)
              << "op " << k << " index " << i;
        } else {
          for (int r = 0; r < n; ++r) {
            ASSERT_EQ(gathered[k]->At(r * kCount + i),
                      k * 1000 + r + static_cast<double>(i))
                << "op " << k << " index " << i << " from rank " << r;
          }
        }
      }
    }
    for (const auto& work : works) EXPECT_TRUE(work->is_completed());
  });
}

TEST_P(ConformanceTest, InvalidArgumentsAreUsageErrorsNamingTheOperation) {
  Run([&](Communicator& comm) {
    int32_t value = 1;
    try {
      comm.broadcast(&value, 1, DType::kInt32, comm.size());
      ADD_FAILURE() << "broadcast from a root out of range did not throw";
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr("broadcast"));
      EXPECT_THAT(e.what(), HasSubstr("root must be a rank in [0, " +
                                      std::to_string(comm.size()) + ")"));
      EXPECT_THAT(e.what(), HasSubstr("rank " + std::to_string(comm.rank())));
      EXPECT_THAT(e.what(), HasSubstr(comm.backend_name()));
    }
    std::vector<size_t> wrong_counts(comm.size() + 1, 1);
    EXPECT_THROW(comm.allgatherv(&value, &value, wrong_counts, DType::kInt32),
                 UsageError);
    std::vector<int32_t> values(2 * comm.size() + 1, 1);
    try {
      comm.reduce_scatter(values.data(), values.data(), wrong_counts,
                          DType::kInt32, ReduceOp::kSum);
      ADD_FAILURE() << "reduce_scatter with size + 1 counts did not throw";
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr("reduce_scatter: expected " +
                                      std::to_string(comm.size()) +
                                      " counts (one per rank), found " +
                                      std::to_string(comm.size() + 1)));
    }
    // Rank r's output starting one element into its segment overlaps
    // input it has not read yet (rank 0 at size 1 too).
    const std::vector<size_t> twos(comm.size(), 2);
    try {
      comm.reduce_scatter(values.data(), values.data() + 2 * comm.rank() + 1,
                          twos, DType::kInt32, ReduceOp::kSum);
      ADD_FAILURE() << "reduce_scatter into an overlapping output did not "
                       "throw";
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(),
                  HasSubstr("output overlaps input but is not this "
                            "rank's segment of it (elements " +
                            std::to_string(2 * comm.rank()) + " to " +
                            std::to_string(2 * comm.rank() + 2) + ")"));
    }
    bool flag = true;
    try {
      comm.allreduce(&flag, 1, DType::kBool, ReduceOp::kSum);
      ADD_FAILURE() << "sum of bool did not throw";
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr("'sum' is not defined for dtype bool"));
    }
    EXPECT_THROW(comm.barrier({std::chrono::milliseconds(-1)}), UsageError);
    // Usage errors are caught before anything is sent: the group still works.
    Buffer one(DType::kInt32, 1);
    one.Set(0, 1);
    comm.allreduce(one.data(), 1, DType::kInt32, ReduceOp::kSum);
    EXPECT_EQ(one.At(0), comm.size());
  });
}

INSTANTIATE_TEST_SUITE_P(
    Backends, ConformanceTest,
    ::testing::Combine(::testing::ValuesIn(GetConformanceSetup().backends),
                       ::testing::Values(1, 2, 3, 4)),
    conformance_internal::BackendWorldName);

}  // namespace
}  // namespace accel::testing
