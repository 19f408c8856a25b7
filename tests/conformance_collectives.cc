// The conformance suite's collectives: every operation (allgather,
// allgatherv, allreduce, reduce_scatter, broadcast, barrier), every dtype,
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
using conformance_internal::RunOnRanks;
using conformance_internal::Unsupported;
using ::testing::HasSubstr;

// The element counts every operation runs with. The largest crosses many
// shared-memory slots and Gloo's chunks; ACCEL_CONFORMANCE_LARGE_COUNT
// lowers it where each element costs much more (the sanitizer runs,
// tools/sanitize.sh: the tiny-slot backends still cross many slots there).
const std::vector<size_t>& Counts() {
  static const std::vector<size_t> counts = [] {
    const char* large = std::getenv("ACCEL_CONFORMANCE_LARGE_COUNT");
    const size_t largest = large != nullptr && *large != '\0'
                               ? std::stoul(large)
                               : size_t{1} << 20;
    return std::vector<size_t>{0, 1, 3, 1000, std::max<size_t>(largest, 1001)};
  }();
  return counts;
}

// A value per (rank, index) that every dtype holds exactly and whose sums
// over 4 ranks, and products for kProduct, stay exact too.
double Value(DType dtype, int rank, size_t i, ReduceOp op = ReduceOp::kSum) {
  if (dtype == DType::kBool) return static_cast<double>((rank + i) % 2);
  if (op == ReduceOp::kProduct) return static_cast<double>(1 + (rank + i) % 3);
  return static_cast<double>((rank * 7 + i) % 31);
}

double Combine(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
  }
  return 0;
}

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

class ConformanceTest
    : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  const std::string& backend() const { return std::get<0>(GetParam()); }
  int world_size() const { return std::get<1>(GetParam()); }
  void SetUp() override {
    const std::string why = Unsupported(world_size());
    if (!why.empty()) GTEST_SKIP() << why;
  }
  void Run(const std::function<void(Communicator&)>& body) {
    RunOnRanks(backend(), world_size(), body);
  }
};

std::string Label(const char* op, DType dtype, size_t count, int rank) {
  return std::string(op) + " " + DTypeName(dtype) + " count " +
         std::to_string(count) + " on rank " + std::to_string(rank);
}

// counts[r] for a reduce-scatter or allgatherv around `count`: rank 1 gets
// nothing, odd ranks half, the others `count`.
std::vector<size_t> UnequalCounts(int ranks, size_t count) {
  std::vector<size_t> counts(ranks);
  for (int r = 0; r < ranks; ++r) {
    counts[r] = r == 1 ? 0 : (r % 2 ? count / 2 : count);
  }
  return counts;
}

// Runs a reduce-scatter of `counts` and checks this rank's segment;
// `in_place` passes this rank's segment of the input as the output.
void CheckReduceScatter(Communicator& comm, DType dtype, ReduceOp op,
                        const std::vector<size_t>& counts, bool in_place) {
  size_t total = 0;
  size_t before = 0;
  for (int r = 0; r < comm.size(); ++r) {
    if (r == comm.rank()) before = total;
    total += counts[r];
  }
  const size_t mine = counts[comm.rank()];
  Buffer input(dtype, total);
  for (size_t i = 0; i < total; ++i) {
    input.Set(i, Value(dtype, comm.rank(), i, op));
  }
  Buffer output(dtype, mine);
  char* in = static_cast<char*>(input.data());
  void* out = in_place ? in + before * ElementSize(dtype) : output.data();
  comm.reduce_scatter(in, out, counts, dtype, op);
  auto expected = [&](size_t i) {
    double result = Value(dtype, 0, before + i, op);
    for (int r = 1; r < comm.size(); ++r) {
      result = Combine(op, result, Value(dtype, r, before + i, op));
    }
    return result;
  };
  Buffer& result = in_place ? input : output;
  const size_t at = in_place ? before : 0;
  std::string counts_text;
  for (size_t c : counts) counts_text += " " + std::to_string(c);
  EXPECT_VALUES(mine, result.At(at + i_), expected(i_),
                Label("reduce_scatter", dtype, mine, comm.rank()) + " " +
                    ReduceOpName(op) + (in_place ? " in place" : "") +
                    ", counts" + counts_text);
}

TEST_P(ConformanceTest, Allgather) {
  Run([&](Communicator& comm) {
    const int n = comm.size();
    for (DType dtype : kAllDTypes) {
      for (size_t count : Counts()) {
        Buffer input(dtype, count);
        for (size_t i = 0; i < count; ++i)
          input.Set(i, Value(dtype, comm.rank(), i));
        Buffer output(dtype, count * n);
        comm.allgather(input.data(), output.data(), count, dtype);
        EXPECT_VALUES(count * n, output.At(i_),
                      Value(dtype, static_cast<int>(i_ / count), i_ % count),
                      Label("allgather", dtype, count, comm.rank()));
      }
    }
  });
}

TEST_P(ConformanceTest, AllgathervWithUnequalAndZeroCounts) {
  Run([&](Communicator& comm) {
    const int n = comm.size();
    for (DType dtype : kAllDTypes) {
      for (size_t count : Counts()) {
        const std::vector<size_t> counts = UnequalCounts(n, count);
        std::vector<size_t> offsets(n);
        size_t total = 0;
        for (int r = 0; r < n; ++r) {
          offsets[r] = total;
          total += counts[r];
        }
        Buffer input(dtype, counts[comm.rank()]);
        for (size_t i = 0; i < counts[comm.rank()]; ++i) {
          input.Set(i, Value(dtype, comm.rank(), i));
        }
        Buffer output(dtype, total);
        comm.allgatherv(input.data(), output.data(), counts, dtype);
        for (int r = 0; r < n; ++r) {
          EXPECT_VALUES(counts[r], output.At(offsets[r] + i_),
                        Value(dtype, r, i_),
                        Label("allgatherv", dtype, count, comm.rank()) +
                            " from rank " + std::to_string(r));
        }
      }
    }
  });
}

TEST_P(ConformanceTest, AllreduceEveryOperation) {
  Run([&](Communicator& comm) {
    const int n = comm.size();
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        if (!SupportsReduction(dtype, op)) continue;
        for (size_t count : Counts()) {
          Buffer buffer(dtype, count);
          for (size_t i = 0; i < count; ++i) {
            buffer.Set(i, Value(dtype, comm.rank(), i, op));
          }
          comm.allreduce(buffer.data(), count, dtype, op);
          auto expected = [&](size_t i) {
            double result = Value(dtype, 0, i, op);
            for (int r = 1; r < n; ++r) {
              result = Combine(op, result, Value(dtype, r, i, op));
            }
            return result;
          };
          EXPECT_VALUES(count, buffer.At(i_), expected(i_),
                        Label("allreduce", dtype, count, comm.rank()) + " " +
                            ReduceOpName(op));
        }
      }
    }
  });
}

TEST_P(ConformanceTest, ReduceScatterEveryOperationWithUnequalAndZeroCounts) {
  Run([&](Communicator& comm) {
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        if (!SupportsReduction(dtype, op)) continue;
        for (size_t count : Counts()) {
          // The largest (many slots' worth) only as sharded training sends
          // it: summed float32 and bfloat16 gradients.
          if (count > 1000 &&
              (op != ReduceOp::kSum ||
               (dtype != DType::kFloat32 && dtype != DType::kBFloat16))) {
            continue;
          }
          const std::vector<size_t> equal(comm.size(), count);
          CheckReduceScatter(comm, dtype, op, equal, false);
          CheckReduceScatter(comm, dtype, op, UnequalCounts(comm.size(), count),
                             false);
        }
      }
    }
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
  Run([&](Communicator& comm) {
    for (DType dtype : kAllDTypes) {
      for (size_t count : Counts()) {
        // The largest count from one root only, to keep the suite fast.
        const int roots = count > 1000 ? 1 : comm.size();
        for (int root = comm.size() - 1; root >= comm.size() - roots; --root) {
          Buffer buffer(dtype, count);
          for (size_t i = 0; i < count; ++i) {
            buffer.Set(i, Value(dtype, comm.rank(), i));
          }
          comm.broadcast(buffer.data(), count, dtype, root);
          EXPECT_VALUES(count, buffer.At(i_), Value(dtype, root, i_),
                        Label("broadcast", dtype, count, comm.rank()) +
                            " from root " + std::to_string(root));
        }
      }
    }
  });
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
    [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
      return std::get<0>(info.param) + "_world" +
             std::to_string(std::get<1>(info.param));
    });

}  // namespace
}  // namespace accel::testing
