// The conformance suite on process subgroups (Communicator::Split and
// NewGroup): every operation on groups of 2 and 3 ranks of a 4 to 6 rank
// job, two groups at once, the job's own communicator beside them, the
// order of a group's ranks, and a rank missing from one group: that group
// fails, naming the group and the rank in the job; the other goes on.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "accel/runtime/base/dtype.h"
#include "accel/runtime/base/errors.h"
#include "tests/conformance.h"
#include "tests/conformance_internal.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

class ConformanceGroupTest : public conformance_internal::BackendWorldTest {};

// Two groups: even and odd ranks (4 and 6 ranks: 2 + 2, 3 + 3), or the
// first three and the last two (5 ranks).
int ColorOf(int world_size, int rank) {
  return world_size == 5 ? (rank < 3 ? 0 : 1) : rank % 2;
}

const char* NameOf(int color) { return color == 0 ? "even" : "odd"; }

// Larger than a shared memory slot (256 KiB): many chunks, every part.
const std::vector<size_t> kGroupCounts = {0, 1, 3, 1000, 70000};

TEST_P(ConformanceGroupTest, EveryOperationOnTwoGroupsAtOnce) {
  Run([](Communicator& comm) {
    const int color = ColorOf(comm.size(), comm.rank());
    std::unique_ptr<Communicator> group =
        comm.Split(color, comm.rank(), NameOf(color));
    ASSERT_NE(group, nullptr);
    int members = 0;
    for (int r = 0; r < comm.size(); ++r) {
      members += ColorOf(comm.size(), r) == color;
    }
    EXPECT_EQ(group->size(), members);
    EXPECT_EQ(group->group_name(), NameOf(color));
    EXPECT_EQ(group->job_rank(group->rank()), comm.rank());
    using namespace conformance_internal;
    CheckAllgather(*group, kGroupCounts);
    CheckAllgathervWithUnequalAndZeroCounts(*group, kGroupCounts);
    CheckAllreduceEveryOperation(*group, kGroupCounts);
    CheckReduceScatterEveryOperation(*group, kGroupCounts);
    CheckBroadcastFromEveryRoot(*group, kGroupCounts);
    CheckAllToAll(*group, kGroupCounts);
    CheckAllToAllvWithUnequalAndZeroCounts(*group, kGroupCounts);
    // The job's communicator beside the group's, both in flight: a sum
    // over the group and one over the job.
    int64_t in_group = comm.rank(), in_job = comm.rank();
    auto work =
        group->allreduce_async(&in_group, 1, DType::kInt64, ReduceOp::kSum);
    comm.allreduce(&in_job, 1, DType::kInt64, ReduceOp::kSum);
    work->wait();
    int64_t expected = 0;
    for (int r = 0; r < comm.size(); ++r) {
      if (ColorOf(comm.size(), r) == color) expected += r;
    }
    EXPECT_EQ(in_group, expected);
    EXPECT_EQ(in_job, comm.size() * (comm.size() - 1) / 2);
  });
}

// A group's ranks come in the order of their keys (NewGroup: the order
// listed); a rank in no group gets null; a group of a group names both.
TEST_P(ConformanceGroupTest, RanksComeInKeyOrderAndGroupsNest) {
  Run([](Communicator& comm) {
    const int n = comm.size();
    // Reversed: key -rank puts the last rank first.
    std::unique_ptr<Communicator> reversed = comm.Split(0, -comm.rank(), "rev");
    ASSERT_NE(reversed, nullptr);
    EXPECT_EQ(reversed->rank(), n - 1 - comm.rank());
    int32_t rank = comm.rank();
    std::vector<int32_t> order(n);
    reversed->allgather(&rank, order.data(), 1, DType::kInt32);
    for (int g = 0; g < n; ++g) EXPECT_EQ(order[g], n - 1 - g);
    // Ranks 3 and 1, in that order; the others get none.
    std::unique_ptr<Communicator> pair = comm.NewGroup({3, 1}, "pair");
    if (comm.rank() == 3 || comm.rank() == 1) {
      ASSERT_NE(pair, nullptr);
      EXPECT_EQ(pair->rank(), comm.rank() == 3 ? 0 : 1);
      EXPECT_EQ(pair->job_rank(0), 3);
      // Its first rank alone, a group of the group.
      std::unique_ptr<Communicator> first =
          pair->Split(pair->rank() == 0 ? 0 : -1, 0, "first");
      EXPECT_EQ(first != nullptr, pair->rank() == 0);
      if (first != nullptr) {
        EXPECT_EQ(first->group_name(), "pair/first");
        EXPECT_EQ(first->job_rank(0), 3);
        first->barrier();
      }
    } else {
      EXPECT_EQ(pair, nullptr);
    }
    EXPECT_THROW(comm.NewGroup({0, 0}, "twice"), UsageError);
    EXPECT_THROW(comm.Split(0, 0, ""), UsageError);
    comm.barrier();  // Still in step after the refused calls.
  });
}

// The last rank of the job never calls its group's allreduce: that group
// fails, each of its ranks naming the group and the missing rank in the
// job; the other group's allreduce completes, and so does its next one.
// The failure paths, apart: a backend whose failed collectives end the job
// (MPI) runs only ConformanceGroupTest.
class ConformanceGroupFailureTest : public ConformanceGroupTest {};

TEST_P(ConformanceGroupFailureTest, AMissingRankFailsOnlyItsGroupNamingIt) {
  if (!GetConformanceSetup().failures_throw) {
    GTEST_SKIP() << "a failed collective ends this backend's job";
  }
  RankOptions options;
  options.timeout = std::chrono::seconds(3);
  Run(
      [](Communicator& comm) {
        const int color = ColorOf(comm.size(), comm.rank());
        std::unique_ptr<Communicator> group =
            comm.Split(color, comm.rank(), NameOf(color));
        ASSERT_NE(group, nullptr);
        const int missing = comm.size() - 1;  // Odd at 4 and 6, last at 5.
        const bool broken_group = color == ColorOf(comm.size(), missing);
        int32_t value = 1;
        if (comm.rank() == missing) {
          // Alive past the others' 500 ms and their diagnosis.
          std::this_thread::sleep_for(std::chrono::seconds(3));
          return;
        }
        if (!broken_group) {
          group->allreduce(&value, 1, DType::kInt32, ReduceOp::kSum);
          EXPECT_EQ(value, group->size());
          group->allreduce(&value, 1, DType::kInt32, ReduceOp::kSum);
          EXPECT_EQ(value, group->size() * group->size());
          return;
        }
        try {
          group->allreduce(&value, 1, DType::kInt32, ReduceOp::kSum,
                           {std::chrono::milliseconds(500)});
          ADD_FAILURE() << "allreduce without rank " << missing
                        << " did not fail";
        } catch (const Error& e) {
          // The first to give up times out, naming what each rank does;
          // the others of the group fail with it (a peer failed).
          const std::string name = NameOf(color);
          const std::string job_rank = "rank " + std::to_string(missing);
          EXPECT_THAT(e.what(), HasSubstr("of group " + name + "): "));
          EXPECT_THAT(
              e.what(),
              ::testing::AnyOf(HasSubstr(job_rank + " (" +
                                         std::to_string(group->size() - 1) +
                                         " of group " + name +
                                         ") has not called a collective "
                                         "yet"),
                               HasSubstr("waited for " + job_rank)));
        }
      },
      options);
}

INSTANTIATE_TEST_SUITE_P(
    Backends, ConformanceGroupTest,
    ::testing::Combine(::testing::ValuesIn(GetConformanceSetup().backends),
                       ::testing::Values(4, 5, 6)),
    conformance_internal::BackendWorldName);

INSTANTIATE_TEST_SUITE_P(
    Backends, ConformanceGroupFailureTest,
    ::testing::Combine(::testing::ValuesIn(GetConformanceSetup().backends),
                       ::testing::Values(4, 5, 6)),
    conformance_internal::BackendWorldName);

}  // namespace
}  // namespace accel::testing
