// accel's Store over torchrun's agent store (a c10d TCPStore), with an
// in-process c10d server standing in for the agent.
#include "accel/c10d_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "accel/core/libtorch_compat.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/process_group.h"
#include "tests/store_semantics.h"

namespace accel {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// What torchrun's agent runs on MASTER_PORT.
std::unique_ptr<c10d::TCPStore> AgentStore() {
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  compat::UseTcpStoreWithoutLibuv(options);
  return std::make_unique<c10d::TCPStore>("127.0.0.1", options);
}

TEST(C10dStoreTest, Semantics) {
  auto agent = AgentStore();
  C10dStore a("127.0.0.1", agent->getPort(), 0, 2, "accel/attempt_0/",
              seconds(10));
  C10dStore b("127.0.0.1", agent->getPort(), 1, 2, "accel/attempt_0/",
              seconds(10));
  testing::ExpectStoreSemantics(a, b);
}

TEST(C10dStoreTest, RanksThatExitAreDepartures) {
  auto agent = AgentStore();
  C10dStore staying("127.0.0.1", agent->getPort(), 0, 3, "p/", seconds(10));
  EXPECT_TRUE(staying.departures().empty());
  { C10dStore leaving("127.0.0.1", agent->getPort(), 2, 3, "p/", seconds(10)); }
  EXPECT_EQ(staying.departures(),
            (std::map<int, Departure>{{2, {Departure::Kind::kExited, ""}}}));
  // Another attempt (prefix) starts clean.
  C10dStore next("127.0.0.1", agent->getPort(), 0, 3, "q/", seconds(10));
  EXPECT_TRUE(next.departures().empty());
}

TEST(C10dStoreTest, NoAgentIsATimeoutNamingTheAddress) {
  try {
    C10dStore store("127.0.0.1", 1, 0, 2, "p/", milliseconds(500));
    FAIL() << "joined a store nobody serves";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("torchrun's agent at "
                                               "127.0.0.1:1"));
  }
}

TEST(C10dStoreTest, ProcessGroupsJoinTheAgentsStoreInTorchrunsDefaultMode) {
  auto agent = AgentStore();
  constexpr int kRanks = 2;
  std::vector<double> sums(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        DistributedEnvironment env;
        env.launched = true;
        env.engine = "torchrun";
        env.rank = rank;
        env.world_size = kRanks;
        env.local_rank = rank;
        env.local_world_size = kRanks;
        env.master_port = agent->getPort();
        env.use_agent_store = true;
        ProcessGroupOptions options;
        options.backend = "gloo";
        options.rendezvous_timeout = seconds(30);
        auto group = ProcessGroup::Join(env, options);
        double value = rank + 1;
        group->communicator().allreduce(&value, 1, DType::kFloat64,
                                        ReduceOp::kSum);
        sums[rank] = value;
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& rank : ranks) rank.join();
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(errors[rank], "");
    EXPECT_EQ(sums[rank], 3.0);
  }
}

}  // namespace
}  // namespace accel
