// The conformance suite's plumbing (conformance_internal.h): the backend's
// memory, buffers in it, its ranks; and the failure paths every backend
// whose failed collectives throw must take (a missing rank, different
// collectives, an interruption and a renewal). Every operation's tests are
// conformance_collectives.cc's.
#include "tests/conformance.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "accel/runtime/base/dtype.h"
#include "accel/runtime/base/errors.h"
#include "tests/conformance_internal.h"
#include "tests/thread_ranks.h"

namespace accel::testing {
namespace conformance_internal {
namespace {

ConformanceMemory& Memory() {
  static HostMemory host;
  ConformanceMemory* memory = GetConformanceSetup().memory;
  return memory != nullptr ? *memory : host;
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

}  // namespace

void RunOnRanks(const std::string& backend, int world_size,
                const std::function<void(Communicator&)>& body,
                const RankOptions& options) {
  RankRunner run = GetConformanceSetup().run_ranks;
  (run != nullptr ? run : RunRanks)(backend, world_size, body, options);
}

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

std::string BackendWorldName(
    const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
  return std::get<0>(info.param) + "_world" +
         std::to_string(std::get<1>(info.param));
}

Buffer::Buffer(DType dtype, size_t count)
    : dtype_(dtype),
      host_(count * ElementSize(dtype) + 1, 0),
      buffer_(Memory().Allocate(host_.size())) {}

Buffer::~Buffer() { Memory().Free(buffer_); }

void* Buffer::data() {
  Memory().CopyIn(buffer_, host_.data(), host_.size());
  fresh_ = false;
  return buffer_;
}

void Buffer::Set(size_t i, double v) { Put(dtype_, host_.data(), i, v); }

double Buffer::At(size_t i) {
  if (!fresh_) {
    Memory().CopyOut(host_.data(), buffer_, host_.size());
    fresh_ = true;
  }
  return Get(dtype_, host_.data(), i);
}

}  // namespace conformance_internal

namespace {

using conformance_internal::Buffer;
using conformance_internal::RunOnRanks;
using conformance_internal::Unsupported;
using ::testing::HasSubstr;

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
          // The cause leads: the barrier that failed, then this call.
          const std::string message = e.what();
          EXPECT_LT(message.find("barrier #1"), message.find("allreduce #2"))
              << message;
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
