// ParallelismConfig's checks and the DeviceMesh's groups, with ranks as
// threads over Gloo: every dimension's group holds the ranks the layout
// says, sums over each group add up what they should, and the flattened
// dimensions are the products of theirs.
#include "accel/runtime/comm/device_mesh.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "tests/thread_ranks.h"

namespace accel {
namespace {

using ::testing::HasSubstr;

std::string UsageErrorOf(const ParallelismConfig& config, int processes) {
  try {
    config.Resolved(processes);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(ParallelismConfigTest, AcceleratesChecks) {
  ParallelismConfig zero;
  zero.tp_size = 0;
  EXPECT_THAT(UsageErrorOf(zero, 1), HasSubstr("tp_size must be at least 1"));
  ParallelismConfig tp_ddp;
  tp_ddp.dp_replicate_size = 2;
  tp_ddp.tp_size = 2;
  EXPECT_THAT(UsageErrorOf(tp_ddp, 4),
              HasSubstr("with pure replication (dp_replicate_size 2, "
                        "dp_shard_size 1) is not supported"));
  ParallelismConfig hsdp;
  hsdp.dp_replicate_size = 2;
  hsdp.dp_shard_size = 2;
  EXPECT_THAT(UsageErrorOf(hsdp, 8),
              HasSubstr("dp_replicate 2 x dp_shard 2 x cp 1 x tp 1 is 4 "
                        "processes, but the job has 8"));
  EXPECT_EQ(hsdp.Resolved(4).total_size(), 4);
  // All ones at several processes: plain DDP, as Accelerate sets it.
  EXPECT_EQ(ParallelismConfig{}.Resolved(3).dp_replicate_size, 3);
}

TEST(ParallelismConfigTest, ReadsAcceleratesEnvironment) {
  setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2", 1);
  setenv("PARALLELISM_CONFIG_TP_SIZE", "4", 1);
  ParallelismConfig base;
  base.cp_size = 3;
  const ParallelismConfig config = ParallelismConfig::FromEnvironment(base);
  EXPECT_EQ(config.dp_shard_size, 2);
  EXPECT_EQ(config.tp_size, 4);
  EXPECT_EQ(config.cp_size, 3);
  EXPECT_EQ(config.dp_replicate_size, 1);
  setenv("PARALLELISM_CONFIG_TP_SIZE", "two", 1);
  try {
    ParallelismConfig::FromEnvironment();
    ADD_FAILURE() << "a size that is not a number was taken";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("PARALLELISM_CONFIG_TP_SIZE must be a "
                                    "whole number, found 'two'"));
  }
  unsetenv("PARALLELISM_CONFIG_DP_SHARD_SIZE");
  unsetenv("PARALLELISM_CONFIG_TP_SIZE");
}

// 8 ranks as dp_replicate 2 x dp_shard 2 x tp 2 (and 2 x 2 x cp 2 with
// tp 1): each group holds the ranks that agree on every other dimension,
// in row-major order of its own.
void CheckMesh(const ParallelismConfig& config) {
  testing::RunRanks("gloo", config.total_size(), [&](Communicator& job) {
    DeviceMesh mesh(job, config);
    const std::vector<std::string> names = {
        "dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_shard_cp", "dp_cp"};
    for (const std::string& name : names) {
      Communicator& group = mesh.group(name);
      ASSERT_EQ(group.size(), mesh.size(name)) << name;
      EXPECT_EQ(group.rank(), mesh.coordinate(name)) << name;
      // Every member's job rank, gathered over the group: the ranks whose
      // coordinates differ from ours only along the group's dimensions.
      int32_t mine = job.rank();
      std::vector<int32_t> members(group.size());
      group.allgather(&mine, members.data(), 1, DType::kInt32);
      for (int g = 0; g < group.size(); ++g) {
        EXPECT_EQ(group.job_rank(g), members[g]) << name;
      }
      EXPECT_EQ(members[mesh.coordinate(name)], job.rank()) << name;
    }
    // The layout: rank = ((replicate * shard_size + shard) * cp + c) * tp + t.
    const int r = mesh.coordinate("dp_replicate"),
              s = mesh.coordinate("dp_shard"), c = mesh.coordinate("cp"),
              t = mesh.coordinate("tp");
    EXPECT_EQ(mesh.RankAt({r, s, c, t}), job.rank());
    EXPECT_EQ(
        ((r * config.dp_shard_size + s) * config.cp_size + c) * config.tp_size +
            t,
        job.rank());
    EXPECT_EQ(mesh.coordinate("dp"), r * config.dp_shard_size + s);
    try {
      mesh.group("pp");
      ADD_FAILURE() << "an unknown dimension was found";
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr("no dimension 'pp' (there are cp, dp"));
    }
  });
}

TEST(DeviceMeshTest, EightRanksAsReplicateShardTensor) {
  ParallelismConfig config;
  config.dp_replicate_size = 2;
  config.dp_shard_size = 2;
  config.tp_size = 2;
  CheckMesh(config.Resolved(8));
}

TEST(DeviceMeshTest, FourRanksAsShardAndContext) {
  ParallelismConfig config;
  config.dp_shard_size = 2;
  config.cp_size = 2;
  CheckMesh(config.Resolved(4));
}

TEST(DeviceMeshTest, AConfigForAnotherSizeIsRefused) {
  testing::RunRanks("gloo", 2, [](Communicator& job) {
    ParallelismConfig three;
    three.tp_size = 3;
    EXPECT_THROW(DeviceMesh(job, three), UsageError);
    job.barrier();
  });
}

}  // namespace
}  // namespace accel
