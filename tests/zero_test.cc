// ZeRO stages 1 and 2 (accel/parallel/zero.h) against DDP (stage 0) in the same
// job: the same parameters after 50 AdamW steps, the same clipped norms, each
// rank holding 1/N of the optimizer state, fp16 overflow on one shard,
// misuse, and checkpoints. Every rank is a process (1, 2 and 3 of them); the
// gloo backend over shared memory, and over TCP in zero_tcp_test. Stage 3's
// units are zero_stage3_test.cc's (in the same test targets, linked first:
// gtest runs the tests in link order, and this file's checkpoint tests
// last).
#include "accel/parallel/zero.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "accel/checkpoint/checkpoint.h"
#include "tests/multiprocess_main.h"
#include "tests/usage_error.h"
#include "tests/zero_training.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

int64_t TrainableElements(bool freeze_first) {
  int64_t total = 0;
  for (const auto& p : MakeModel(freeze_first)->parameters()) {
    if (p.requires_grad()) total += p.numel();
  }
  return total;
}

// Rank `rank`'s share of `total` elements cut into n.
int64_t ShareOf(int64_t total, int n, int rank) {
  const int64_t share = (total + n - 1) / n;
  return std::min(total, (rank + 1) * share) - std::min(total, rank * share);
}

// The model's parameters by name, copied (get_state_dict: under stage 3
// the main process gets them, the others nothing).
torch::Tensor Snapshot(Accelerator& accelerator, torch::nn::Sequential& model) {
  std::vector<torch::Tensor> flat;
  for (const auto& [name, tensor] : accelerator.get_state_dict(model)) {
    flat.push_back(tensor.reshape({-1}).clone());
  }
  return flat.empty() ? torch::Tensor() : torch::cat(flat);
}

TEST(ShardLayoutTest, SharesPartitionTheTensorsInRankOrder) {
  for (int world : {1, 2, 3, 4, 7}) {
    const std::vector<int64_t> numels = {5, 0, 17, 1, 9};
    ShardLayout layout(numels, world);
    EXPECT_EQ(layout.total(), 32);
    EXPECT_EQ(layout.shard_size(), (32 + world - 1) / world);
    EXPECT_GE(layout.padded(), 32);
    int64_t covered = 0;
    for (int rank = 0; rank < world; ++rank) {
      EXPECT_EQ(layout.begin(rank), std::min<int64_t>(32, covered));
      int64_t in_pieces = 0;
      for (const auto& piece : layout.Pieces(rank)) {
        const int64_t at = layout.offset(piece.tensor) + piece.begin;
        EXPECT_EQ(at, layout.begin(rank) + in_pieces);
        EXPECT_LE(piece.begin + piece.length, numels[piece.tensor]);
        EXPECT_GT(piece.length, 0);
        in_pieces += piece.length;
      }
      EXPECT_EQ(in_pieces, layout.end(rank) - layout.begin(rank));
      covered = layout.end(rank);
    }
    EXPECT_EQ(covered, 32);
    // A bucket's counts add up to its size, each within a share.
    const std::vector<size_t> counts = layout.Counts(3, 23);
    size_t sum = 0;
    for (int rank = 0; rank < world; ++rank) {
      sum += counts[rank];
      EXPECT_LE(counts[rank], static_cast<size_t>(layout.shard_size()));
    }
    EXPECT_EQ(sum, 20u);
  }
}

TEST(ZeroTest, Stage1GivesDdpsParametersBitForBit) {
  const Result ddp = Train({});
  const Result zero = Train({.stage = 1});
  EXPECT_EQ(MaxDifference(zero.parameters, ddp.parameters), 0.0);
  // The comparison is not vacuous: training moved the weights.
  EXPECT_GT(MaxDifference(ddp.parameters, Train({.steps = 0}).parameters),
            1e-2);
}

TEST(ZeroTest, Stage2GivesDdpsParameters) {
  const Result ddp = Train({});
  const Result zero = Train({.stage = 2});
  // Reduce-scatter sums each element over the ranks as allreduce does: at
  // 2 ranks a + b either way; at 3 a backend may add in another order.
  const double difference = MaxDifference(zero.parameters, ddp.parameters);
  // Each rank kept only its share of the reduced gradients: the
  // parameters' own .grad were freed once reduce-scattered.
  EXPECT_EQ(ddp.parameters_with_grad, 6);
  EXPECT_EQ(zero.parameters_with_grad,
            SharedAccelerator().num_processes() == 1 ? 6 : 0);
  if (SharedAccelerator().is_main_process()) {
    std::printf(
        "stage 2 against DDP at %d process(es): max |difference| "
        "%.3g after %d steps\n",
        SharedAccelerator().num_processes(), difference, kSteps);
  }
  if (SharedAccelerator().num_processes() <= 2) {
    EXPECT_EQ(difference, 0.0);
  } else {
    EXPECT_LE(difference, 1e-6);
  }
}

// Accelerate prepares the models of a call first, so any order works:
// prepare(optimizer, model) was refused under stages 2 and 3 ("parameter 0
// is not a parameter of a prepared model").
TEST(ZeroTest, AnOptimizerBeforeItsModelInOnePrepareIsSharded) {
  for (int stage : {1, 2, 3}) {
    const Result in_order = Train({.stage = stage});
    const Result reversed = Train({.stage = stage, .optimizer_first = true});
    EXPECT_EQ(MaxDifference(reversed.parameters, in_order.parameters), 0.0)
        << "stage " << stage;
    EXPECT_EQ(reversed.state_elements, in_order.state_elements);
  }
}

// As Accelerate names a run under its DeepSpeed or FSDP plugin (stage 3
// printed MULTI_CPU).
TEST(ZeroTest, DistributedTypeIsDeepSpeedOrFsdp) {
  for (int stage : {1, 2, 3}) {
    Accelerator zero(Options({.stage = stage}));
    EXPECT_EQ(zero.distributed_type(), DistributedType::kDeepSpeed);
    EXPECT_STREQ(DistributedTypeName(zero.distributed_type()), "DEEPSPEED");
    AcceleratorOptions fsdp = Options({.stage = stage});
    fsdp.use_fsdp = true;
    EXPECT_EQ(Accelerator(fsdp).distributed_type(), DistributedType::kFsdp);
  }
  EXPECT_STREQ(DistributedTypeName(DistributedType::kFsdp), "FSDP");
  EXPECT_FALSE(SharedAccelerator().multi_device());  // No GPU here.
}

TEST(ZeroTest, EachRankHoldsItsShareOfTheOptimizerState) {
  const int n = SharedAccelerator().num_processes();
  const int rank = SharedAccelerator().process_index();
  const int64_t total = TrainableElements(false);
  // Stages 1-2 cut all parameters into N shares; stage 3 each unit (each
  // Linear of the model) on its own.
  int64_t unit_shares = 0;
  for (const auto& child : MakeModel()->children()) {
    int64_t elements = 0;
    for (const auto& p : child->parameters()) elements += p.numel();
    unit_shares += ShareOf(elements, n, rank);
  }
  for (int stage : {1, 2, 3}) {
    const Result zero = Train({.stage = stage, .steps = 2});
    EXPECT_EQ(zero.state_elements,
              stage == 3 ? unit_shares : ShareOf(total, n, rank))
        << "stage " << stage;
  }
  EXPECT_EQ(Train({.steps = 2}).state_elements, total);
}

// gradient_clipping (DeepSpeed's, from its JSON or --gradient_clipping):
// the prepared optimizer's step clips as clip_grad_norm_ does, under DDP
// and every stage.
TEST(ZeroTest, GradientClippingInTheStepEqualsClipGradNorm) {
  for (int stage : {0, 1, 2, 3}) {
    const Result by_hand = Train({.stage = stage, .clip = 0.5});
    const Result in_step = Train({.stage = stage, .auto_clip = 0.5});
    EXPECT_EQ(MaxDifference(in_step.parameters, by_hand.parameters), 0.0)
        << "stage " << stage;
  }
  // Not vacuous: clipping changed the result.
  EXPECT_GT(
      MaxDifference(Train({.auto_clip = 0.5}).parameters, Train({}).parameters),
      1e-3);
}

TEST(ZeroTest, ClippedNormIsTheGlobalOneOnEveryStage) {
  const Result ddp = Train({.clip = 0.5});
  for (int stage : {1, 2, 3}) {
    const Result zero = Train({.stage = stage, .clip = 0.5});
    ASSERT_EQ(zero.norms.size(), ddp.norms.size());
    for (size_t i = 0; i < ddp.norms.size(); ++i) {
      EXPECT_NEAR(zero.norms[i], ddp.norms[i], 1e-6 * ddp.norms[i])
          << "stage " << stage << ", step " << i;
    }
    double worst_norm = 0;
    for (size_t i = 0; i < ddp.norms.size(); ++i) {
      worst_norm = std::max(
          worst_norm, std::abs(zero.norms[i] - ddp.norms[i]) / ddp.norms[i]);
    }
    const double difference = MaxDifference(zero.parameters, ddp.parameters);
    if (SharedAccelerator().is_main_process()) {
      std::printf(
          "clipped, stage %d against DDP at %d process(es): norms "
          "within %.3g (relative), parameters within %.3g\n",
          stage, SharedAccelerator().num_processes(), worst_norm, difference);
    }
    // The norm is summed in float64 on every path, so the float32
    // coefficient, and then every parameter, is DDP's.
    EXPECT_EQ(difference, 0) << "stage " << stage;
  }
  // Clipping did clip: some norms were above max_norm.
  EXPECT_GT(*std::max_element(ddp.norms.begin(), ddp.norms.end()), 0.5);
}

TEST(ZeroTest, Bf16AutocastAndASchedulerAsUnderDdp) {
  const Result ddp =
      Train({.steps = 12, .precision = "bf16", .schedule = true});
  for (int stage : {1, 2, 3}) {
    // param_dtype float32: autocast alone, the parameters float32 (without
    // it ZeRO computes with bf16 parameters: the next test).
    const Result zero = Train({.stage = stage,
                               .steps = 12,
                               .precision = "bf16",
                               .schedule = true,
                               .param_dtype = torch::kFloat32});
    EXPECT_LE(MaxDifference(zero.parameters, ddp.parameters), 1e-6)
        << "stage " << stage;
  }
  // Autocast and the schedule did change the run.
  EXPECT_GT(MaxDifference(ddp.parameters, Train({.steps = 12}).parameters),
            1e-4);
}

// --mixed_precision=bf16 under ZeRO is FSDP's MixedPrecisionPolicy, as
// Accelerate sets it: the parameters are bf16 (gathered, computed and
// reduced in it) and the optimizer steps float32 master shards.
TEST(ZeroTest, Bf16ParametersKeepFloat32MasterShards) {
  const bool sharded = SharedAccelerator().num_processes() > 1;
  const Result fp32 = Train({});
  const std::set<c10::ScalarType> float32 = {torch::kFloat32};
  for (int stage : {1, 2, 3}) {
    const Result mixed = Train({.stage = stage, .precision = "bf16"});
    EXPECT_EQ(mixed.stepped_dtypes, float32) << "stage " << stage;
    EXPECT_EQ(mixed.state_dtypes, float32) << "stage " << stage;
    if (SharedAccelerator().is_main_process()) {
      EXPECT_EQ(mixed.state_dict_dtypes, float32) << "stage " << stage;
    }
    // One process shards nothing: its parameters stay float32 (autocast).
    const std::set<c10::ScalarType> computed = {sharded ? torch::kBFloat16
                                                        : torch::kFloat32};
    EXPECT_EQ(mixed.parameter_dtypes, computed) << "stage " << stage;
    // bf16's rounding moved the run, which still trains as float32 does.
    const double difference = MaxDifference(mixed.parameters, fp32.parameters);
    if (SharedAccelerator().is_main_process()) {
      EXPECT_GT(difference, 1e-4) << "stage " << stage;
      EXPECT_LT(difference, 0.1) << "stage " << stage;
      std::printf(
          "bf16 parameters, stage %d, %d process(es): max |difference| from "
          "float32 %.3g after %d steps; last loss %.4f (float32 %.4f)\n",
          stage, SharedAccelerator().num_processes(), difference, kSteps,
          mixed.last_loss, fp32.last_loss);
    }
    EXPECT_NEAR(mixed.last_loss, fp32.last_loss, 0.02 * fp32.last_loss)
        << "stage " << stage;
  }
}

// reduce_dtype: what gradients are summed in, under DDP and ZeRO.
TEST(ZeroTest, ReduceDtypeChoosesWhatGradientsAreSummedIn) {
  if (SharedAccelerator().num_processes() == 1) {
    GTEST_SKIP() << "one process reduces nothing";
  }
  const Result ddp = Train({.steps = 10});
  const Result ddp_bf16 =
      Train({.steps = 10, .reduce_dtype = torch::kBFloat16});
  const double rounded = MaxDifference(ddp_bf16.parameters, ddp.parameters);
  if (SharedAccelerator().is_main_process()) {
    EXPECT_GT(rounded, 0);
    EXPECT_LT(rounded, 0.05);
  }
  // bf16 parameters whose gradients are summed in float32 rather than bf16.
  for (int stage : {1, 2, 3}) {
    const Result in_bf16 =
        Train({.stage = stage, .steps = 10, .precision = "bf16"});
    const Result in_fp32 = Train({.stage = stage,
                                  .steps = 10,
                                  .precision = "bf16",
                                  .reduce_dtype = torch::kFloat32});
    // Under stages 2-3 the float32 sums land in float32 master gradients.
    // Stage 1's gradients stay bf16 (DDP's buckets of the bf16
    // parameters): float32 rounds each sum once, at the end, which for two
    // ranks' a + b (exact in float32) is bf16's one rounding too.
    const bool rounds_differently =
        stage >= 2 || SharedAccelerator().num_processes() > 2;
    if (SharedAccelerator().is_main_process() && rounds_differently) {
      EXPECT_GT(MaxDifference(in_fp32.parameters, in_bf16.parameters), 0)
          << "stage " << stage;
    }
    EXPECT_EQ(in_fp32.parameter_dtypes,
              std::set<c10::ScalarType>{torch::kBFloat16});
  }
}

TEST(ZeroTest, AMixedPrecisionPolicyOfAnIntegerDtypeIsAUsageError) {
  AcceleratorOptions options = Options({});
  options.mixed_precision_policy.reduce_dtype = torch::kInt32;
  EXPECT_THAT(UsageErrorOf([&] { Accelerator accelerator(options); }),
              HasSubstr("mixed_precision_policy.reduce_dtype must be a "
                        "floating-point dtype, found Int"));
}

TEST(ZeroTest, AccumulationAndFrozenParametersAsUnderDdp) {
  const Result ddp =
      Train({.freeze_first = true, .accumulation = 3, .steps = 12});
  for (int stage : {1, 2, 3}) {
    const Result zero = Train(
        {.stage = stage, .freeze_first = true, .accumulation = 3, .steps = 12});
    EXPECT_LE(MaxDifference(zero.parameters, ddp.parameters), 1e-6)
        << "stage " << stage;
  }
}

TEST(ZeroTest, AnOverflowOnOneShardSkipsTheStepOnEveryRank) {
  for (int stage : {1, 2, 3}) {
    AcceleratorOptions options = Options({.stage = stage});
    options.mixed_precision = "fp16";
    Accelerator accelerator(options);
    torch::nn::Sequential net = MakeModel();
    torch::optim::AdamW adamw(net->parameters(),
                              torch::optim::AdamWOptions(1e-2));
    auto [model, optimizer] = accelerator.prepare(net, adamw);
    const torch::Tensor before = Snapshot(accelerator, model);
    // The last bias lies in the last rank's share only: its gradient alone
    // becomes inf (a hook on the gradient, which reads no parameter).
    torch::Tensor last_bias = model->parameters().back();
    const float inf = std::numeric_limits<float>::infinity();
    const unsigned hook = last_bias.register_hook(
        [inf](const torch::Tensor& grad) { return grad * inf; });
    auto [x, y] = Batch(0, accelerator.process_index());
    accelerator.backward(
        torch::nn::functional::cross_entropy(model->forward(x), y));
    last_bias.remove_hook(hook);
    optimizer.step();
    optimizer.zero_grad();
    EXPECT_TRUE(optimizer.step_was_skipped()) << "stage " << stage;
    EXPECT_EQ(MaxDifference(Snapshot(accelerator, model), before), 0.0)
        << "stage " << stage;
    // And the next clean step steps.
    accelerator.backward(
        torch::nn::functional::cross_entropy(model->forward(x), y));
    optimizer.step();
    EXPECT_FALSE(optimizer.step_was_skipped()) << "stage " << stage;
    const double moved = MaxDifference(Snapshot(accelerator, model), before);
    if (accelerator.is_main_process()) {
      EXPECT_GT(moved, 0.0) << "stage " << stage;
    }
  }
}

TEST(ZeroTest, MisuseIsOneClearErrorOnEveryRank) {
  if (SharedAccelerator().num_processes() == 1) {
    GTEST_SKIP() << "one process shards nothing";
  }
  Accelerator accelerator(Options({.stage = 2}));
  {
    torch::nn::Sequential net = MakeModel();
    torch::optim::AdamW adamw(net->parameters(),
                              torch::optim::AdamWOptions(1e-2));
    net->forward(torch::ones({1, 12})).sum().backward();
    adamw.step();
    auto model = accelerator.prepare(net);
    EXPECT_THAT(UsageErrorOf([&] { accelerator.prepare(adamw); }),
                HasSubstr("already holds state for 6 parameter(s)"));
  }
  {
    torch::nn::Sequential net = MakeModel();
    torch::Tensor stray = torch::zeros({3}, torch::requires_grad());
    torch::optim::AdamW adamw(std::vector<torch::Tensor>{stray},
                              torch::optim::AdamWOptions(1e-2));
    auto model = accelerator.prepare(net);
    EXPECT_THAT(UsageErrorOf([&] { accelerator.prepare(adamw); }),
                HasSubstr("is not a parameter of a prepared model"));
  }
  {
    torch::nn::Sequential net = MakeModel();
    torch::optim::AdamW adamw(net[0]->parameters(),
                              torch::optim::AdamWOptions(1e-2));
    auto model = accelerator.prepare(net);
    EXPECT_THAT(UsageErrorOf([&] { accelerator.prepare(adamw); }),
                HasSubstr("must hold every trainable parameter of its "
                          "model, but parameter 2"));
  }
  AcceleratorOptions four = Options({});
  four.zero_stage = 4;
  EXPECT_THAT(UsageErrorOf([&] { four.Validate(); }),
              HasSubstr("or 3 (also the parameters), found 4"));
}

// A prepare() that throws part way (the optimizer refused after its model
// was prepared, at any stage and process count) leaves nothing prepared: the
// program mends the optimizer and prepares the same model again, which then
// trains as if the failed call never happened (a second synchronizer would
// reduce every gradient twice; under stage 3 the model would be wrapped twice).
TEST(ZeroTest, AFailedPrepareLeavesNothingPrepared) {
  for (int stage : {0, 1, 2, 3}) {
    const Result clean = Train({.stage = stage});
    const Result retried =
        Train({.stage = stage, .failed_prepare_first = true});
    EXPECT_EQ(MaxDifference(retried.parameters, clean.parameters), 0.0)
        << "stage " << stage;
  }
}

TEST(ZeroTest, AModelPreparedTwiceIsAUsageError) {
  Accelerator accelerator(Options({}));
  torch::nn::Sequential net = MakeModel();
  auto model = accelerator.prepare(net);
  EXPECT_THAT(UsageErrorOf([&] { accelerator.prepare(net); }),
              HasSubstr("the model was prepared already"));
  accelerator.free_memory(model);
  EXPECT_NO_THROW(accelerator.prepare(net));
}

TEST(ZeroTest, TwoBackwardsBeforeAStepAddUpAsUnderDdp) {
  const Result ddp = Train({.steps = 12, .backwards = 2});
  for (int stage : {1, 2, 3}) {
    const Result zero = Train({.stage = stage, .steps = 12, .backwards = 2});
    // DDP reduces the sum of both; ZeRO-2 adds the two reductions.
    EXPECT_LE(MaxDifference(zero.parameters, ddp.parameters), 1e-6)
        << "stage " << stage;
  }
  EXPECT_GT(MaxDifference(ddp.parameters, Train({.steps = 12}).parameters),
            1e-3);
}

TEST(ZeroTest, AParameterShardedTwiceIsAUsageError) {
  if (SharedAccelerator().num_processes() == 1) {
    GTEST_SKIP() << "one process shards nothing";
  }
  Accelerator accelerator(Options({.stage = 1}));
  torch::nn::Sequential net = MakeModel();
  torch::optim::AdamW first(net->parameters(), torch::optim::AdamWOptions(1));
  torch::optim::AdamW second(net->parameters(), torch::optim::AdamWOptions(1));
  auto prepared = accelerator.prepare(net, first);
  EXPECT_THAT(UsageErrorOf([&] { accelerator.prepare(second); }),
              HasSubstr("parameter 0 is already sharded by another prepared "
                        "optimizer"));
}

TEST(ZeroTest, AnInfinityNormWithANanIsNanOnEveryRank) {
  if (SharedAccelerator().num_processes() == 1) {
    GTEST_SKIP() << "one process shards nothing";
  }
  Accelerator accelerator(Options({.stage = 1}));
  torch::nn::Sequential net = MakeModel();
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1));
  auto [model, optimizer] = accelerator.prepare(net, adamw);
  auto [x, y] = Batch(0, accelerator.process_index());
  accelerator.backward(
      torch::nn::functional::cross_entropy(model->forward(x), y));
  // Under stage 1 every rank holds the full gradients: a NaN in the last
  // bias lies in the last rank's share only.
  model->parameters().back().mutable_grad()[0] = std::nan("");
  const double norm = accelerator.clip_grad_norm_(
      model->parameters(), 1.0, std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(norm)) << norm;
}

// The checkpoint tests last: the last one's failed load unwinds through an
// Accelerator, which then leaves the job (accelerator.cc), and no
// Accelerator can be made after that.
TEST(ZeroTest, ACheckpointResumesBitExactlyAtTheSameProcessCount) {
  for (int stage : {1, 2, 3}) {
    const std::string dir = Folder("zero" + std::to_string(stage));
    const Result whole = Train({.stage = stage, .steps = 20});
    Train({.stage = stage, .steps = 10, .save_to = dir});
    const Result resumed = Train(
        {.stage = stage, .steps = 10, .first_step = 10, .load_from = dir});
    EXPECT_EQ(MaxDifference(resumed.parameters, whole.parameters), 0.0)
        << "stage " << stage;
    EXPECT_EQ(resumed.state_elements, whole.state_elements);
  }
}

// The master shards are what a checkpoint keeps: a resumed bf16 run
// continues bit for bit.
TEST(ZeroTest, AMixedPrecisionCheckpointResumesBitExactly) {
  for (int stage : {1, 3}) {
    const std::string dir = Folder("zero_bf16_" + std::to_string(stage));
    const testing::Run run = {.stage = stage, .steps = 20, .precision = "bf16"};
    const Result whole = Train(run);
    testing::Run first = run;
    first.steps = 10;
    first.save_to = dir;
    Train(first);
    testing::Run second = run;
    second.steps = 10;
    second.first_step = 10;
    second.load_from = dir;
    const Result resumed = Train(second);
    EXPECT_EQ(MaxDifference(resumed.parameters, whole.parameters), 0.0)
        << "stage " << stage;
  }
}

TEST(ZeroTest, AShardedCheckpointLoadsAtEveryStage) {
  const int n = SharedAccelerator().num_processes();
  if (n == 1) GTEST_SKIP() << "one process shards nothing";
  // Each stage cuts the state its own way; the shards are read back into
  // any cut (other process counts: //tests:reshard_test).
  for (int saved : {1, 3}) {
    const std::string dir = Folder("zero_stages" + std::to_string(saved));
    Train({.stage = saved, .steps = 2, .save_to = dir});
    const Result ddp =
        Train({.stage = 0, .steps = 3, .first_step = 2, .load_from = dir});
    for (int stage : {1, 2, 3}) {
      const Result resumed = Train(
          {.stage = stage, .steps = 3, .first_step = 2, .load_from = dir});
      EXPECT_EQ(MaxDifference(resumed.parameters, ddp.parameters), 0.0)
          << "saved at stage " << saved << ", loaded at stage " << stage;
      EXPECT_GT(resumed.state_elements, 0);
    }
  }
}

TEST(ZeroTest, AMissingShardFileFailsOnEveryRankNamingIt) {
  const int n = SharedAccelerator().num_processes();
  if (n == 1) GTEST_SKIP() << "one process shards nothing";
  const std::string dir = Folder("zero_missing");
  Train({.stage = 2, .steps = 2, .save_to = dir});
  const std::string lost = ShardFileName(n - 1, n);
  if (SharedAccelerator().process_index() == 0) {
    std::remove((dir + "/" + lost).c_str());
  }
  SharedAccelerator().wait_for_everyone();
  try {
    Train({.stage = 2, .steps = 1, .load_from = dir});
    ADD_FAILURE() << "loaded without rank " << n - 1 << "'s shard";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr(lost));
  }
}

}  // namespace
}  // namespace accel::testing
