// N-D parallelism through the Accelerator (AcceleratorOptions::
// parallelism_config, accel/runtime/comm/device_mesh.h) at 4 processes:
// hybrid sharding (dp_replicate 2 x dp_shard 2) against DDP at ZeRO stages
// 1-3, what each rank keeps, the mesh's coordinates and data-parallel
// collectives, loaders that give the ranks of a tp group the same batches,
// checkpoints written at one mesh and resumed at another, and the errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "accel/accelerator.h"
#include "tests/multiprocess_main.h"
#include "tests/usage_error.h"
#include "tests/zero_training.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

ParallelismConfig Mesh(int dp_replicate, int dp_shard, int tp = 1, int cp = 1) {
  ParallelismConfig config;
  config.dp_replicate_size = dp_replicate;
  config.dp_shard_size = dp_shard;
  config.tp_size = tp;
  config.cp_size = cp;
  return config;
}

int64_t ModelElements() {
  int64_t total = 0;
  for (const auto& p : MakeModel()->parameters()) total += p.numel();
  return total;
}

class NdParallelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (SharedAccelerator().num_processes() != 4) {
      GTEST_SKIP() << "the meshes here are of 4 processes";
    }
  }
};

// HSDP's gradients are a reduce-scatter over 2 ranks then an all-reduce
// over 2: the same sum as DDP's over 4, in another order.
TEST_F(NdParallelTest, HybridShardingTrainsAsDdp) {
  const Result ddp = Train({.clip = 0.5});
  for (int stage = 1; stage <= 3; ++stage) {
    const Result hsdp =
        Train({.stage = stage, .clip = 0.5, .parallelism = Mesh(2, 2)});
    EXPECT_LE(MaxDifference(hsdp.parameters, ddp.parameters), 1e-6)
        << "stage " << stage;
    ASSERT_EQ(hsdp.norms.size(), ddp.norms.size());
    for (size_t i = 0; i < ddp.norms.size(); ++i) {
      // The norm is over one replica's shards, not both (which would count
      // every gradient twice).
      EXPECT_NEAR(hsdp.norms[i], ddp.norms[i], 1e-6 * ddp.norms[i])
          << "stage " << stage << ", step " << i;
    }
    // The optimizer state is sharded over dp_shard (2), not over all 4.
    const int64_t total = ModelElements();
    const int shard = SharedAccelerator().process_index() % 2;
    EXPECT_EQ(hsdp.state_elements, shard == 0 ? (total + 1) / 2 : total / 2)
        << "stage " << stage;
    EXPECT_EQ(hsdp.parameters_with_grad, stage == 1 ? 6 : 0);
  }
  // Not vacuous: the weights moved.
  EXPECT_GT(MaxDifference(ddp.parameters, Train({.steps = 0}).parameters),
            1e-2);
}

// Two backwards before a step (the shards' held gradients add) and
// accumulation inside no_sync.
TEST_F(NdParallelTest, HybridShardingAccumulatesAsDdp) {
  const Result ddp = Train({.accumulation = 2, .steps = 10, .backwards = 2});
  const Result hsdp = Train({.stage = 2,
                             .accumulation = 2,
                             .steps = 10,
                             .backwards = 2,
                             .parallelism = Mesh(2, 2)});
  EXPECT_LE(MaxDifference(hsdp.parameters, ddp.parameters), 1e-6);
}

// A reduce_dtype other than the master's: reduce-scattered in bf16, then
// all-reduced across replicas in float32; close to ZeRO over all 4.
TEST_F(NdParallelTest, HybridShardingWithMixedPrecision) {
  const Result zero = Train({.stage = 2,
                             .steps = 10,
                             .param_dtype = torch::kBFloat16,
                             .reduce_dtype = torch::kBFloat16});
  const Result hsdp = Train({.stage = 2,
                             .steps = 10,
                             .param_dtype = torch::kBFloat16,
                             .reduce_dtype = torch::kBFloat16,
                             .parallelism = Mesh(2, 2)});
  EXPECT_LE(MaxDifference(hsdp.parameters, zero.parameters), 2e-2);
  EXPECT_EQ(hsdp.stepped_dtypes, std::set<c10::ScalarType>{torch::kFloat32});
}

// Plain data parallelism on a mesh (all ones: dp_replicate = 4) is DDP.
TEST_F(NdParallelTest, AllOnesIsDdp) {
  const Result ddp = Train({.steps = 10});
  const Result mesh = Train({.steps = 10, .parallelism = ParallelismConfig()});
  EXPECT_EQ(MaxDifference(mesh.parameters, ddp.parameters), 0.0);
}

TEST_F(NdParallelTest, MeshCoordinatesAndDataParallelCollectives) {
  AcceleratorOptions options = Options({.stage = 1});
  options.parallelism_config = Mesh(1, 2, /*tp=*/2);
  Accelerator accelerator(options);
  const int rank = accelerator.process_index();
  ASSERT_NE(accelerator.torch_device_mesh(), nullptr);
  EXPECT_EQ(accelerator.parallelism_config()->ToString(),
            "dp_replicate 1 x dp_shard 2 x cp 1 x tp 2");
  EXPECT_EQ(accelerator.tensor_parallel_rank(), rank % 2);
  EXPECT_EQ(accelerator.data_parallel_shard_rank(), rank / 2);
  EXPECT_EQ(accelerator.data_parallel_rank(), 0);
  EXPECT_EQ(accelerator.context_parallel_rank(), 0);
  EXPECT_EQ(accelerator.data_parallel_size(), 2);
  EXPECT_EQ(accelerator.data_parallel_index(), rank / 2);
  // gather and reduce run over the data-parallel ranks: 2 of them.
  const torch::Tensor index =
      torch::tensor({static_cast<int64_t>(accelerator.data_parallel_index())});
  const torch::Tensor gathered = accelerator.gather(index);
  EXPECT_TRUE(gathered.equal(torch::tensor({int64_t{0}, int64_t{1}})))
      << gathered;
  EXPECT_EQ(accelerator.reduce(index + 1, "sum").item<int64_t>(), 3);
  // Loaders shard over them: the two ranks of a tp group read the same
  // batches, the two tp groups different ones.
  struct Samples {
    torch::data::Example<> get(size_t i) const {
      return {torch::tensor({static_cast<float>(i)}), torch::tensor(0)};
    }
    size_t size() const { return 16; }
  };
  DataLoaderOptions loader_options;
  loader_options.batch_size = 2;
  loader_options.shuffle = true;
  auto loader =
      accelerator.prepare(DataLoader<Samples>(Samples(), loader_options));
  std::vector<int64_t> seen;
  for (const auto& batch : loader) {
    for (int64_t i = 0; i < batch.data.size(0); ++i) {
      seen.push_back(static_cast<int64_t>(batch.data[i][0].item<float>()));
    }
  }
  EXPECT_EQ(seen.size(), 8u);
  const std::vector<int64_t> all = accelerator.gather_object(seen);
  ASSERT_EQ(all.size(), 32u);
  const auto of = [&](int r) {
    return std::vector<int64_t>(all.begin() + 8 * r, all.begin() + 8 * r + 8);
  };
  EXPECT_EQ(of(0), of(1));
  EXPECT_EQ(of(2), of(3));
  EXPECT_NE(of(0), of(2));
  // gather_for_metrics over an epoch: each sample once, not once per tp
  // rank.
  int64_t samples = 0;
  for (const auto& batch : loader) {
    samples += accelerator.gather_for_metrics(batch.data).size(0);
  }
  EXPECT_EQ(samples, 16);
}

// Written under HSDP at 2 x 2, resumed at 1 x 4 and without a mesh (ZeRO
// over 4): the same weights as the run that did not stop.
TEST_F(NdParallelTest, CheckpointResumesAtAnotherMesh) {
  const std::string folder = Folder("nd_checkpoint");
  const Result whole =
      Train({.stage = 2, .steps = 20, .parallelism = Mesh(2, 2)});
  Train(
      {.stage = 2, .steps = 10, .save_to = folder, .parallelism = Mesh(2, 2)});
  const Result at_1x4 = Train({.stage = 2,
                               .steps = 10,
                               .first_step = 10,
                               .load_from = folder,
                               .parallelism = Mesh(1, 4)});
  EXPECT_LE(MaxDifference(at_1x4.parameters, whole.parameters), 1e-6);
  const Result stage3 =
      Train({.stage = 3, .steps = 10, .first_step = 10, .load_from = folder});
  EXPECT_LE(MaxDifference(stage3.parameters, whole.parameters), 1e-6);
  const Result hsdp_again = Train({.stage = 1,
                                   .steps = 10,
                                   .first_step = 10,
                                   .load_from = folder,
                                   .parallelism = Mesh(2, 2)});
  EXPECT_LE(MaxDifference(hsdp_again.parameters, whole.parameters), 1e-6);
}

// FSDP's HYBRID_SHARD: machines are replicas. These 4 processes are one
// machine's: the stage alone, no mesh.
TEST_F(NdParallelTest, HybridShardStrategyShardsWithinAMachine) {
  EXPECT_EQ(HybridShardingConfig(8, 4), Mesh(2, 4));
  EXPECT_EQ(HybridShardingConfig(4, 4), Mesh(1, 4));
  EXPECT_THAT(UsageErrorOf([] { HybridShardingConfig(6, 4); }),
              HasSubstr("the 6 processes do not split evenly into machines "
                        "of 4"));
  EXPECT_EQ(ParseShardingStrategy("HYBRID_SHARD"), 3);
  EXPECT_EQ(ParseShardingStrategy("5"), 2);
  EXPECT_TRUE(IsHybridShardingStrategy("HYBRID_SHARD_ZERO2"));
  EXPECT_FALSE(IsHybridShardingStrategy("FULL_SHARD"));
  AcceleratorOptions options = Options({.stage = 3});
  options.hybrid_shard = true;
  {
    Accelerator accelerator(options);
    EXPECT_FALSE(accelerator.parallelism_config().has_value());
    EXPECT_EQ(accelerator.torch_device_mesh(), nullptr);
  }
  options.zero_stage = 0;
  EXPECT_THAT(UsageErrorOf([&] { Accelerator a(options); }),
              HasSubstr("give zero_stage 2 or 3"));
}

TEST_F(NdParallelTest, ConfigErrorsSayWhatToChange) {
  AcceleratorOptions options = Options({.stage = 2});
  options.parallelism_config = Mesh(2, 1, 1, 1);
  EXPECT_THAT(UsageErrorOf([&] { Accelerator a(options); }),
              HasSubstr("is 2 processes, but the job has 4"));
  options.parallelism_config = Mesh(1, 4);
  options.zero_stage = 0;
  EXPECT_THAT(UsageErrorOf([&] { Accelerator a(options); }),
              HasSubstr("dp_shard_size 4 shards the training state"));
  options.parallelism_config = Mesh(2, 1, 2);
  EXPECT_THAT(UsageErrorOf([&] { Accelerator a(options); }),
              HasSubstr("with pure replication"));
  options.parallelism_config = Mesh(0, 4);
  EXPECT_THAT(UsageErrorOf([&] { Accelerator a(options); }),
              HasSubstr("dp_replicate_size must be at least 1, found 0"));
  EXPECT_THAT(UsageErrorOf([] { SharedAccelerator().tensor_parallel_rank(); }),
              HasSubstr("no parallelism_config was given"));
}

}  // namespace
}  // namespace accel::testing
