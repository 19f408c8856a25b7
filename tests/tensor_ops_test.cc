// The tensor collectives' cross-rank checks and coalesced broadcast, ranks
// as threads over the gloo backend.
#include "accel/core/tensor_ops.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "tests/thread_ranks.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

// Collectives a call issues, from the communicator's sequence numbers.
template <typename Fn>
uint64_t CollectivesOf(Communicator& comm, Fn&& fn) {
  const uint64_t before = comm.barrier();
  fn();
  return comm.barrier() - before - 1;
}

// Each rank's own values: rank r's tensors are filled with r.
std::vector<torch::Tensor> RankTensors(int rank) {
  return {torch::full({3, 4}, rank, torch::kFloat32),
          torch::full({5}, rank, torch::kInt64),
          torch::full({2, 2}, rank, torch::kFloat32),
          torch::full({7}, rank, torch::kFloat64),
          torch::full({0}, rank, torch::kFloat32),
          torch::full({6}, rank, torch::kFloat32).narrow(0, 1, 4)};
}

std::vector<std::string> Names(size_t count) {
  std::vector<std::string> names;
  for (size_t i = 0; i < count; ++i) names.push_back("t" + std::to_string(i));
  return names;
}

TEST(BroadcastCoalescedTest, EveryRankGetsTheRootsValuesInOneCallPerBucket) {
  for (int world : {2, 3}) {
    RunRanks("gloo", world, [](Communicator& comm) {
      const int root = comm.size() - 1;
      std::vector<torch::Tensor> tensors = RankTensors(comm.rank());
      // Buckets: float32 (48 + 16 + 16 bytes, in one), int64, float64.
      const uint64_t calls = CollectivesOf(comm, [&] {
        BroadcastCoalesced(comm, Names(tensors.size()), tensors, root);
      });
      EXPECT_EQ(calls, 1u + 3u);
      for (const torch::Tensor& t : tensors) {
        EXPECT_TRUE(torch::equal(t, torch::full_like(t, root)))
            << t.sizes() << " " << t.dtype();
      }
      // At most 20 bytes per bucket: every float32 tensor alone.
      tensors = RankTensors(comm.rank());
      const uint64_t small = CollectivesOf(comm, [&] {
        BroadcastCoalesced(comm, Names(tensors.size()), tensors, 0, {}, 20);
      });
      EXPECT_EQ(small, 1u + 5u);
      for (const torch::Tensor& t : tensors) {
        EXPECT_TRUE(torch::equal(t, torch::zeros_like(t)));
      }
    });
  }
}

TEST(BroadcastCoalescedTest, AHundredTensorsCostTwoCollectives) {
  RunRanks("gloo", 2, [](Communicator& comm) {
    std::vector<torch::Tensor> tensors;
    for (int i = 0; i < 100; ++i) {
      tensors.push_back(torch::full({8, 8}, comm.rank() * 100 + i));
    }
    const uint64_t calls = CollectivesOf(comm, [&] {
      BroadcastCoalesced(comm, Names(tensors.size()), tensors, 0);
    });
    EXPECT_EQ(calls, 2u);
    for (int i = 0; i < 100; ++i) {
      EXPECT_EQ(tensors[i][7][7].item<float>(), i);
    }
  });
}

TEST(BroadcastCoalescedTest, ListsThatDifferFailOnEveryRankNamingTheTensor) {
  RunRanks("gloo", 3, [](Communicator& comm) {
    std::vector<torch::Tensor> tensors = {
        torch::zeros({4}), torch::zeros({comm.rank() == 2 ? 5 : 4, 2})};
    try {
      BroadcastCoalesced(comm, {"fc.bias", "fc.weight"}, tensors, 0);
      ADD_FAILURE() << "no error on rank " << comm.rank();
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(),
                  HasSubstr("tensor 1 is 'fc.weight' shape [4, 2] float32 on "
                            "rank 0 and 'fc.weight' shape [5, 2] float32 on "
                            "rank 2"));
      EXPECT_THAT(e.what(), HasSubstr("prepare the same model"));
    }
    // A rank with fewer tensors.
    std::vector<torch::Tensor> fewer(comm.rank() == 1 ? 1 : 2,
                                     torch::zeros({2}));
    try {
      BroadcastCoalesced(comm, Names(fewer.size()), fewer, 0);
      ADD_FAILURE() << "no error on rank " << comm.rank();
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr("tensor 1 is 't1' shape [2] float32 on "
                                      "rank 0 and nothing (it passed 1) on "
                                      "rank 1"));
    }
    comm.barrier();  // The communicator still works.
  });
}

TEST(CollectiveChecksTest, TheSwitchTurnsOffTheShapeExchangeToo) {
  for (bool checks : {true, false}) {
    RankOptions options;
    options.check_collectives = checks;
    RunRanks(
        "gloo", 2,
        [checks](Communicator& comm) {
          const torch::Tensor t = torch::ones({3});
          EXPECT_EQ(CollectivesOf(comm, [&] { ReduceTensor(comm, t, "sum"); }),
                    checks ? 2u : 1u);
          EXPECT_EQ(CollectivesOf(comm, [&] { BroadcastTensor(comm, t, 0); }),
                    checks ? 2u : 1u);
          std::vector<torch::Tensor> list = {t.clone()};
          EXPECT_EQ(
              CollectivesOf(comm,
                            [&] { BroadcastCoalesced(comm, {"t"}, list, 0); }),
              checks ? 2u : 1u);
        },
        options);
  }
}

}  // namespace
}  // namespace accel::testing
