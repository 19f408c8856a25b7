#include "tests/conformance.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "accel/runtime/base/dtype.h"
#include "accel/runtime/base/errors.h"
#include "tests/thread_ranks.h"

namespace accel::testing {
namespace {

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

ConformanceMemory& Memory() {
  static HostMemory host;
  ConformanceMemory* memory = GetConformanceSetup().memory;
  return memory != nullptr ? *memory : host;
}

void RunOnRanks(const std::string& backend, int world_size,
                const std::function<void(Communicator&)>& body,
                const RankOptions& options = {}) {
  RankRunner run = GetConformanceSetup().run_ranks;
  (run != nullptr ? run : RunRanks)(backend, world_size, body, options);
}

// Why `world_size` cannot run in this process, or "" when it can.
std::string Unsupported(int world_size) {
  const char* limit = std::getenv("ACCEL_CONFORMANCE_MAX_WORLD_SIZE");
  if (limit != nullptr && world_size > std::atoi(limit)) {
    return "world size above ACCEL_CONFORMANCE_MAX_WORLD_SIZE";
  }
  const int only = GetConformanceSetup().only_world_size;
  if (only != 0 && world_size != only) {
    return "this process runs world size " + std::to_string(only) + " only";
  }
  return "";
}

// Writes `value` (an integer that `dtype` represents exactly) at index i.
void Put(DType dtype, void* buffer, size_t i, double value) {
  switch (dtype) {
    case DType::kFloat32:
      static_cast<float*>(buffer)[i] = static_cast<float>(value);
      return;
    case DType::kFloat64:
      static_cast<double*>(buffer)[i] = value;
      return;
    case DType::kFloat16:
      static_cast<uint16_t*>(buffer)[i] =
          FloatToHalf(static_cast<float>(value));
      return;
    case DType::kBFloat16:
      static_cast<uint16_t*>(buffer)[i] =
          FloatToBFloat16(static_cast<float>(value));
      return;
    case DType::kInt8:
      static_cast<int8_t*>(buffer)[i] = static_cast<int8_t>(value);
      return;
    case DType::kUInt8:
    case DType::kBool:
      static_cast<uint8_t*>(buffer)[i] = static_cast<uint8_t>(value);
      return;
    case DType::kInt32:
      static_cast<int32_t*>(buffer)[i] = static_cast<int32_t>(value);
      return;
    case DType::kInt64:
      static_cast<int64_t*>(buffer)[i] = static_cast<int64_t>(value);
      return;
  }
}

double Get(DType dtype, const void* buffer, size_t i) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(buffer)[i];
    case DType::kFloat64:
      return static_cast<const double*>(buffer)[i];
    case DType::kFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(buffer)[i]);
    case DType::kBFloat16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(buffer)[i]);
    case DType::kInt8:
      return static_cast<const int8_t*>(buffer)[i];
    case DType::kUInt8:
    case DType::kBool:
      return static_cast<const uint8_t*>(buffer)[i];
    case DType::kInt32:
      return static_cast<const int32_t*>(buffer)[i];
    case DType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(buffer)[i]);
  }
  return 0;
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

// Values prepared and checked on the host; data() hands the backend a
// buffer in its memory holding them, and At() reads its result back.
class Buffer {
 public:
  Buffer(DType dtype, size_t count)
      : dtype_(dtype),
        host_(count * ElementSize(dtype) + 1, 0),
        buffer_(Memory().Allocate(host_.size())) {}
  ~Buffer() { Memory().Free(buffer_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() {
    Memory().CopyIn(buffer_, host_.data(), host_.size());
    fresh_ = false;
    return buffer_;
  }
  void Set(size_t i, double v) { Put(dtype_, host_.data(), i, v); }
  double At(size_t i) {
    if (!fresh_) {
      Memory().CopyOut(host_.data(), buffer_, host_.size());
      fresh_ = true;
    }
    return Get(dtype_, host_.data(), i);
  }

 private:
  DType dtype_;
  std::vector<char> host_;
  void* buffer_;
  bool fresh_ = true;
};

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

class ConformanceFailureTest : public ::testing::TestWithParam<std::string> {
 protected:
  const std::string& backend() const { return GetParam(); }
  void SetUp() override {
    if (!GetConformanceSetup().failures_throw) {
      GTEST_SKIP() << "a failed collective ends this backend's job: its own "
                      "tests check its failures";
    }
  }
  void Run(int world_size, const std::function<void(Communicator&)>& body,
           const RankOptions& options) {
    const std::string why = Unsupported(world_size);
    if (!why.empty()) GTEST_SKIP() << why;
    RunOnRanks(backend(), world_size, body, options);
  }
};

TEST_P(ConformanceFailureTest, MissingRankTimesOutNamingOperationAndRank) {
  RankOptions options;
  options.timeout = std::chrono::milliseconds(500);
  Run(
      2,
      [](Communicator& comm) {
        if (comm.rank() == 1) {
          // Skips the barrier, then waits until rank 0 has given up: rank 0
          // must not wait for it.
          std::this_thread::sleep_for(std::chrono::seconds(6));
          return;
        }
        const auto start = std::chrono::steady_clock::now();
        try {
          comm.barrier({std::chrono::milliseconds(300)});
          ADD_FAILURE() << "barrier without rank 1 did not fail";
        } catch (const TimeoutError& e) {
          EXPECT_THAT(e.what(), HasSubstr("rank 0/2"));
          EXPECT_THAT(e.what(), HasSubstr("barrier #1 (conformance.cc:"));
          EXPECT_THAT(e.what(), HasSubstr("timed out after 300 ms: rank 1 "
                                          "has not called a collective yet "
                                          "while rank 0 waits in barrier #1"));
        }
        // Well before rank 1 returns (the 300 ms, plus the departure grace
        // and diagnosis, with room for a loaded machine).
        EXPECT_LT(std::chrono::steady_clock::now() - start,
                  std::chrono::seconds(5));
        // The communicator is broken now: later calls fail at once.
        int32_t value = 0;
        try {
          comm.allreduce(&value, 1, DType::kInt32, ReduceOp::kSum);
          ADD_FAILURE() << "allreduce after a timeout did not fail";
        } catch (const PeerError& e) {
          EXPECT_THAT(e.what(), HasSubstr("allreduce #2"));
          EXPECT_THAT(
              e.what(),
              HasSubstr("not run because an earlier collective failed"));
        }
      },
      options);
}

TEST_P(ConformanceFailureTest,
       DifferentCollectivesFailFastNamingEachRanksCall) {
  RankOptions options;
  options.timeout = std::chrono::seconds(30);
  for (int world_size : {2, 3})
    Run(
        world_size,
        [](Communicator& comm) {
          Buffer values(DType::kFloat32, 3);
          const auto start = std::chrono::steady_clock::now();
          try {
            if (comm.rank() == 0) {
              CollectiveOptions gather{};  // {}: records this line.
              gather.api = "gather";
              comm.allgather(values.data(), values.data(), 1, DType::kFloat32,
                             gather);
            } else {
              CollectiveOptions wait{};
              wait.api = "wait_for_everyone";
              comm.barrier(wait);
            }
            ADD_FAILURE() << "different collectives did not fail";
          } catch (const UsageError& e) {
            const std::string other = comm.rank() == 0 ? "1" : "0";
            EXPECT_THAT(e.what(),
                        HasSubstr("ranks called different collectives"));
            // "left" when that rank's own watchdog failed its call first.
            EXPECT_THAT(e.what(), ::testing::ContainsRegex("rank " + other +
                                                           " (is in|left) "));
            EXPECT_THAT(e.what(), HasSubstr("gather #1 (conformance.cc:"));
            EXPECT_THAT(e.what(),
                        HasSubstr("wait_for_everyone #1 (conformance.cc:"));
            EXPECT_THAT(e.what(), HasSubstr("[allgather float32 x 1]"));
            EXPECT_THAT(e.what(), HasSubstr("[barrier]"));
          }
          // Found by the watchdog, long before the 30 s timeout.
          EXPECT_LT(std::chrono::steady_clock::now() - start,
                    std::chrono::seconds(10));
        },
        options);
}

TEST_P(ConformanceFailureTest,
       ReduceScattersOfDifferentCountsFailFastNamingEachRanksCall) {
  RankOptions options;
  options.timeout = std::chrono::seconds(30);
  Run(
      2,
      [](Communicator& comm) {
        // Rank 1 thinks rank 0's segment is one element longer.
        const std::vector<size_t> counts = comm.rank() == 0
                                               ? std::vector<size_t>{2, 2}
                                               : std::vector<size_t>{3, 2};
        Buffer input(DType::kFloat32, 5);
        Buffer output(DType::kFloat32, 3);
        const auto start = std::chrono::steady_clock::now();
        try {
          comm.reduce_scatter(input.data(), output.data(), counts,
                              DType::kFloat32, ReduceOp::kSum);
          ADD_FAILURE() << "reduce_scatters of different counts did not fail";
        } catch (const UsageError& e) {
          EXPECT_THAT(e.what(),
                      HasSubstr("ranks called different collectives"));
          EXPECT_THAT(e.what(),
                      HasSubstr("[reduce_scatter sum float32 [2, 2]]"));
          EXPECT_THAT(e.what(),
                      HasSubstr("[reduce_scatter sum float32 [3, 2]]"));
        }
        EXPECT_LT(std::chrono::steady_clock::now() - start,
                  std::chrono::seconds(10));
      },
      options);
}

// How long an interrupting rank keeps its connections open, below.
constexpr std::chrono::seconds kHoldBack(6);

TEST_P(ConformanceFailureTest,
       InterruptedCollectivesFailOnEveryRankAndRenewConnectsAgain) {
  RankOptions options;
  options.timeout = std::chrono::seconds(30);
  for (int world_size : {2, 3})
    Run(
        world_size,
        [](Communicator& comm) {
          auto sum = [&] {
            int32_t value = comm.rank() + 1;
            comm.allreduce(&value, 1, DType::kInt32, ReduceOp::kSum);
            return value;
          };
          const int32_t expected = comm.size() * (comm.size() + 1) / 2;
          EXPECT_EQ(sum(), expected);
          // Twice: rank 0 gives up, then the last rank, each leaving the
          // others in a collective it never calls.
          for (int quitter : {0, comm.size() - 1}) {
            const int generation = comm.generation();
            const auto start = std::chrono::steady_clock::now();
            if (comm.rank() == quitter) {
              comm.Interrupt("the test gives up");
              // First the others' watchdogs must find the interruption in
              // the store; then they learn it from connections that close.
              if (quitter == 0) std::this_thread::sleep_for(kHoldBack);
            } else {
              try {
                comm.barrier();
                ADD_FAILURE()
                    << "a barrier without rank " << quitter << " did not fail";
              } catch (const InterruptedError& e) {
                EXPECT_EQ(e.failed_rank(), quitter);
                EXPECT_THAT(e.what(), HasSubstr("barrier #"));
                EXPECT_THAT(e.what(),
                            HasSubstr("rank " + std::to_string(quitter) +
                                      " interrupted the collectives of every "
                                      "rank: the test gives up"));
              }
              // Broken now: later calls fail at once, with the same cause.
              EXPECT_THROW(sum(), InterruptedError);
            }
            if (comm.rank() != quitter) {
              // Before rank 0 closed its connections, in the first round.
              EXPECT_LT(std::chrono::steady_clock::now() - start,
                        quitter == 0 ? kHoldBack - std::chrono::seconds(1)
                                     : std::chrono::seconds(10));
            }
            comm.Renew();
            EXPECT_EQ(comm.generation(), generation + 1);
            EXPECT_EQ(sum(), expected) << "after renewal " << generation + 1;
            // Numbered from 1 again, so the first is the next call's #2.
            std::vector<int32_t> all(comm.size());
            int32_t mine = comm.rank();
            comm.allgather(&mine, all.data(), 1, DType::kInt32);
            for (int r = 0; r < comm.size(); ++r) EXPECT_EQ(all[r], r);
          }
        },
        options);
}

INSTANTIATE_TEST_SUITE_P(Backends, ConformanceFailureTest,
                         ::testing::ValuesIn(GetConformanceSetup().backends),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace accel::testing
