// ZeRO stage 3 on a model written the usual C++ way (examples/gpt_model.h: a
// ModuleList of blocks and a hand-written forward(tokens, mask), each block
// called through accel::forward): its parameters after 30 AdamW steps equal
// DDP's bit for bit (within 1e-6 relative with clipping), activation
// checkpointing changes no gradient bit (dropout on), and a block called
// around accel::forward is a clear death. Every rank a real process, at 1 to
// 4 processes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "accel/accelerator.h"
#include "accel/memory/released_memory.h"
#include "examples/gpt_model.h"
#include "tests/multiprocess_main.h"

namespace accel::testing {
namespace {

constexpr int kGptSteps = 30;
constexpr int64_t kBatchPerRank = 2;

// A run's losses (this rank's, per step) and its dtypes at the end: the
// model's parameters, what the optimizer steps and its state.
struct Trace {
  std::vector<double> losses;
  std::set<c10::ScalarType> parameter_dtypes;
  std::set<c10::ScalarType> stepped_dtypes;
  std::set<c10::ScalarType> state_dtypes;
};

struct GptRun {
  int stage = 0;
  double clip = 0;
  bool activation_checkpointing = false;  // accel::checkpoint in forward.
  // Each block marked fully_shard(block, {.activation_checkpointing = true}).
  bool checkpointed_units = false;
  // Each block marked fully_shard(block, {.reshard_after_forward = false}).
  bool units_kept_gathered = false;
  int steps = kGptSteps;
  std::string precision = "no";  // mixed_precision.
  bool learnable = false;        // LearnableTokens rather than Tokens.
  Trace* trace = nullptr;        // When set, what the run saw.
};

examples::GptConfig SmallGpt(bool activation_checkpointing) {
  examples::GptConfig config;
  config.vocab_size = 32;
  config.block_size = 16;
  config.n_layer = 3;
  config.n_head = 2;
  config.n_embd = 32;
  config.dropout = 0.1;  // On: the recompute must draw the same masks.
  config.activation_checkpointing = activation_checkpointing;
  return config;
}

// This rank's tokens and targets of a step: the same on every run.
std::pair<torch::Tensor, torch::Tensor> Tokens(int step, int rank) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 * step + rank);
  const torch::Tensor text =
      torch::randint(0, 32, {kBatchPerRank, 17}, generator);
  return {text.narrow(1, 0, 16), text.narrow(1, 1, 16)};
}

// Text with something to learn: each token follows from the one before
// (t -> 5t + 3 mod 32) but for one in five, drawn at random. A model that
// learns the rule reaches a loss near 0.2 * ln(32) + 0.5 = 1.2 nats.
std::pair<torch::Tensor, torch::Tensor> LearnableTokens(int step, int rank) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 * step + rank);
  torch::Tensor text = torch::randint(0, 32, {kBatchPerRank, 17}, generator);
  const torch::Tensor keep =
      torch::rand({kBatchPerRank, 17}, generator).lt(0.8);
  for (int64_t i = 1; i < 17; ++i) {
    const torch::Tensor next = (text.select(1, i - 1) * 5 + 3).remainder(32);
    text.select(1, i).copy_(
        torch::where(keep.select(1, i), next, text.select(1, i)));
  }
  return {text.narrow(1, 0, 16), text.narrow(1, 1, 16)};
}

// The weights after the run, gathered on the main process (empty on the
// others), in state_dict order.
std::map<std::string, torch::Tensor> TrainGpt(const GptRun& run) {
  AcceleratorOptions options = TestAcceleratorOptions();
  options.zero_stage = run.stage;
  options.mixed_precision = run.precision;
  options.gradient_sync.first_bucket_bytes = 4096;
  options.gradient_sync.bucket_cap_bytes = 16384;
  Accelerator accelerator(options);
  torch::manual_seed(7);
  examples::Gpt gpt(SmallGpt(run.activation_checkpointing));
  if (run.checkpointed_units || run.units_kept_gathered) {
    for (const examples::Block& block : gpt->blocks()) {
      fully_shard(block, {.activation_checkpointing = run.checkpointed_units,
                          .reshard_after_forward = !run.units_kept_gathered});
    }
  }
  torch::optim::AdamW adamw(gpt->parameters(),
                            torch::optim::AdamWOptions(1e-3));
  auto [model, optimizer] = accelerator.prepare(gpt, adamw);
  // The same dropout draws on every run of a rank.
  torch::manual_seed(100 + accelerator.process_index());
  const torch::Tensor mask = examples::CausalMask(16);
  for (int step = 0; step < run.steps; ++step) {
    auto [tokens, targets] = (run.learnable ? LearnableTokens : Tokens)(
        step, accelerator.process_index());
    const torch::Tensor loss =
        examples::LanguageModelLoss(model->forward(tokens, mask), targets);
    if (run.trace != nullptr) run.trace->losses.push_back(loss.item<double>());
    accelerator.backward(loss);
    if (run.clip > 0)
      accelerator.clip_grad_norm_(model->parameters(), run.clip);
    optimizer.step();
    optimizer.zero_grad();
  }
  if (run.trace != nullptr) {
    for (const auto& p : model->parameters()) {
      run.trace->parameter_dtypes.insert(p.scalar_type());
    }
    for (const auto& group : adamw.param_groups()) {
      for (const auto& p : group.params()) {
        run.trace->stepped_dtypes.insert(p.scalar_type());
      }
    }
    for (const auto& [key, state] : adamw.state()) {
      run.trace->state_dtypes.insert(
          static_cast<torch::optim::AdamWParamState&>(*state)
              .exp_avg_sq()
              .scalar_type());
    }
  }
  std::map<std::string, torch::Tensor> weights =
      accelerator.get_state_dict(model);
  if (!accelerator.is_main_process()) weights.clear();
  return weights;
}

// The largest of ||a - b|| / ||b|| over the tensors.
double MaxRelativeDifference(const std::map<std::string, torch::Tensor>& a,
                             const std::map<std::string, torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (const auto& [name, tensor] : a) {
    const torch::Tensor other = b.at(name).to(torch::kFloat64);
    const double norm = std::max(other.norm().item<double>(), 1e-30);
    worst = std::max(
        worst,
        (tensor.to(torch::kFloat64) - other).norm().item<double>() / norm);
  }
  return worst;
}

// The largest |a - b| over the tensors' elements.
double MaxAbsoluteDifference(const std::map<std::string, torch::Tensor>& a,
                             const std::map<std::string, torch::Tensor>& b) {
  double worst = 0;
  for (const auto& [name, tensor] : a) {
    worst = std::max(worst, (tensor - b.at(name)).abs().max().item<double>());
  }
  return worst;
}

bool BitIdentical(const std::map<std::string, torch::Tensor>& a,
                  const std::map<std::string, torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, tensor] : a) {
    if (b.count(name) == 0 || !torch::equal(tensor, b.at(name))) return false;
  }
  return true;
}

void Report(const char* what, double figure) {
  if (SharedAccelerator().is_main_process()) {
    std::printf("gpt at %d process(es): %s %.3g\n",
                SharedAccelerator().num_processes(), what, figure);
  }
}

TEST(GptTest, Stage3EqualsDdpBitForBit) {
  const auto ddp = TrainGpt({});
  const auto untrained = TrainGpt({.steps = 0});
  for (int stage : {1, 2, 3}) {
    const auto zero = TrainGpt({.stage = stage});
    EXPECT_TRUE(BitIdentical(zero, ddp)) << "stage " << stage;
    Report(("stage " + std::to_string(stage) +
            " against DDP, max relative difference")
               .c_str(),
           MaxRelativeDifference(zero, ddp));
  }
  // The runs trained: the comparison could fail.
  if (SharedAccelerator().is_main_process()) {
    EXPECT_GT(MaxRelativeDifference(ddp, untrained), 1e-2);
  }
}

TEST(GptTest, Stage3WithClippingIsWithinAMillionth) {
  const auto ddp = TrainGpt({.clip = 0.05});
  const auto zero = TrainGpt({.stage = 3, .clip = 0.05});
  const double difference = MaxRelativeDifference(zero, ddp);
  Report("stage 3 with clipping against DDP, max relative difference",
         difference);
  Report("stage 3 with clipping against DDP, max absolute difference",
         MaxAbsoluteDifference(zero, ddp));
  EXPECT_LE(difference, 1e-6);
  // Clipping changed the run.
  if (SharedAccelerator().is_main_process()) {
    EXPECT_GT(MaxRelativeDifference(ddp, TrainGpt({})), 1e-4);
  } else {
    TrainGpt({});
  }
}

// The configuration: stage 3, bf16 and activation checkpointing.
// The blocks compute in bf16 while AdamW steps float32 master shards, and
// after 200 steps the loss is within 2% of float32's.
TEST(GptTest, Bf16UnitsTrainAsFloat32DoesOnFloat32MasterShards) {
  constexpr int kSteps = 200;
  Trace fp32_trace;
  TrainGpt(
      {.stage = 3, .steps = kSteps, .learnable = true, .trace = &fp32_trace});
  Trace bf16_trace;
  const auto bf16 = TrainGpt({.stage = 3,
                              .activation_checkpointing = true,
                              .steps = kSteps,
                              .precision = "bf16",
                              .learnable = true,
                              .trace = &bf16_trace});
  const std::set<c10::ScalarType> float32 = {torch::kFloat32};
  const bool sharded = SharedAccelerator().num_processes() > 1;
  EXPECT_EQ(
      bf16_trace.parameter_dtypes,
      std::set<c10::ScalarType>{sharded ? torch::kBFloat16 : torch::kFloat32});
  EXPECT_EQ(bf16_trace.stepped_dtypes, float32);
  EXPECT_EQ(bf16_trace.state_dtypes, float32);
  for (const auto& [name, tensor] : bf16) {
    EXPECT_EQ(tensor.scalar_type(), torch::kFloat32) << name;
  }
  // The mean of the last 20 steps' losses (one step's is noisy).
  const auto tail_mean = [](const std::vector<double>& losses) {
    double sum = 0;
    for (size_t i = losses.size() - 20; i < losses.size(); ++i) {
      sum += losses[i];
    }
    return sum / 20;
  };
  const double fp32_loss = tail_mean(fp32_trace.losses);
  const double bf16_loss = tail_mean(bf16_trace.losses);
  Report("float32 loss after 200 steps (mean of the last 20)", fp32_loss);
  Report("bf16 loss after 200 steps (mean of the last 20)", bf16_loss);
  Report("bf16 against float32: |loss difference| / loss",
         std::abs(bf16_loss - fp32_loss) / fp32_loss);
  EXPECT_LT(fp32_loss, 0.75 * fp32_trace.losses.front()) << "no training";
  EXPECT_NEAR(bf16_loss, fp32_loss, 0.02 * fp32_loss);
  EXPECT_NE(bf16_trace.losses, fp32_trace.losses);  // bf16 did compute.
}

TEST(GptTest, ActivationCheckpointingChangesNoBit) {
  for (int stage : {0, 3}) {
    const auto kept = TrainGpt({.stage = stage});
    const auto recomputed =
        TrainGpt({.stage = stage, .activation_checkpointing = true});
    EXPECT_TRUE(BitIdentical(recomputed, kept)) << "stage " << stage;
    const auto per_unit =
        TrainGpt({.stage = stage, .checkpointed_units = true});
    EXPECT_TRUE(BitIdentical(per_unit, kept)) << "stage " << stage;
  }
}

TEST(GptTest, BlocksAreUnitsFreedOutsideTheirForward) {
  if (SharedAccelerator().num_processes() == 1) {
    GTEST_SKIP() << "one process shards nothing";
  }
  AcceleratorOptions options = TestAcceleratorOptions();
  options.zero_stage = 3;
  Accelerator accelerator(options);
  examples::Gpt gpt(SmallGpt(false));
  torch::optim::AdamW adamw(gpt->parameters(),
                            torch::optim::AdamWOptions(1e-3));
  auto [model, optimizer] = accelerator.prepare(gpt, adamw);
  // The ModuleList's entries are the units; the embeddings and the final
  // LayerNorm stay whole.
  int freed = 0, whole = 0;
  for (const auto& p : model->named_parameters()) {
    const bool released = IsReleasedMemory(p.value().storage().data());
    EXPECT_EQ(released, p.key().rfind("blocks.", 0) == 0) << p.key();
    ++(released ? freed : whole);
  }
  EXPECT_EQ(whole, 4);  // Two embeddings, ln_f's weight and bias.
  EXPECT_GT(freed, 0);
  auto [tokens, targets] = Tokens(0, accelerator.process_index());
  const torch::Tensor mask = examples::CausalMask(16);
  accelerator.backward(
      examples::LanguageModelLoss(model->forward(tokens, mask), targets));
  optimizer.step();
  for (const auto& p : model->named_parameters()) {
    if (p.key().rfind("blocks.", 0) == 0) {
      EXPECT_TRUE(IsReleasedMemory(p.value().storage().data())) << p.key();
    }
  }
  // A block called directly, not through accel::forward, reads freed
  // parameters: the process dies saying so; also a later block, whose
  // unit the one before prefetched (the prefetch becomes its storage only
  // when it runs).
  ::testing::FLAGS_gtest_death_test_style = "fast";
  const auto blocks = model->named_children()["blocks"]->children();
  EXPECT_DEATH(blocks[0]->as<examples::BlockImpl>()->forward(
                   torch::randn({1, 16, 32}), mask),
               "accel::forward\\(layer, ...\\), not layer->forward");
  // Every rank: block 0 runs (no grad) and starts block 1's gather.
  torch::NoGradGuard no_grad;
  const torch::Tensor x =
      forward(gpt->blocks()[0], torch::randn({1, 16, 32}), mask);
  EXPECT_DEATH(blocks[1]->as<examples::BlockImpl>()->forward(x, mask),
               "parameter 'blocks\\.1\\.[a-z0-9_.]+' of a ZeRO stage-3 unit "
               "was read");
  forward(gpt->blocks()[1], x, mask);  // Its gather ends on every rank.
}

// reshard_after_forward = false: the units' parameters stay from their
// forward to their backward (no second all-gather); nothing else changes.
TEST(GptTest, UnitsKeptGatheredAfterForwardChangeNoBit) {
  const auto resharded = TrainGpt({.stage = 3});
  const auto kept = TrainGpt({.stage = 3, .units_kept_gathered = true});
  if (SharedAccelerator().is_main_process()) {
    EXPECT_TRUE(BitIdentical(kept, resharded));
  }
}

TEST(GptTest, AUnitThatDoesNotReshardHoldsItsParametersUntilBackward) {
  if (SharedAccelerator().num_processes() == 1) {
    GTEST_SKIP() << "one process shards nothing";
  }
  AcceleratorOptions options = TestAcceleratorOptions();
  options.zero_stage = 3;
  Accelerator accelerator(options);
  examples::Gpt gpt(SmallGpt(false));
  const auto& blocks = gpt->blocks();
  for (size_t b = 0; b < blocks.size(); ++b) {
    fully_shard(blocks[b], {.reshard_after_forward = b != 0});
  }
  torch::optim::AdamW adamw(gpt->parameters(),
                            torch::optim::AdamWOptions(1e-3));
  auto [model, optimizer] = accelerator.prepare(gpt, adamw);
  const auto released = [](const examples::Block& block) {
    for (const auto& p : block->parameters()) {
      if (!IsReleasedMemory(p.storage().data())) return false;
    }
    return true;
  };
  auto [tokens, targets] = Tokens(0, accelerator.process_index());
  const torch::Tensor loss = examples::LanguageModelLoss(
      model->forward(tokens, examples::CausalMask(16)), targets);
  EXPECT_FALSE(released(blocks[0]));  // Kept for its backward.
  EXPECT_TRUE(released(blocks[1]));
  EXPECT_TRUE(released(blocks[2]));
  accelerator.backward(loss);
  EXPECT_TRUE(released(blocks[0]));  // Its gradients are in.
  optimizer.step();
  optimizer.zero_grad();
}

// A block run twice in one forward, each run inside activation
// checkpointing: its reentrant backward hands two gradients over
// separately, which DDP's and ZeRO's reductions cannot take once the first
// is being reduced: a clear error on every rank, never a dropped gradient.
struct TwiceImpl : torch::nn::Module {
  TwiceImpl() {
    embedding = register_module("embedding", torch::nn::Embedding(32, 32));
    auto list = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < 3; ++i) {
      blocks.emplace_back(SmallGpt(false));
      list->push_back(blocks.back());
    }
  }
  torch::Tensor forward(torch::Tensor tokens, torch::Tensor mask) {
    torch::Tensor x = embedding(tokens);
    for (int i : {0, 1, 2, 0}) {
      x = checkpoint(
          [block = blocks[i], mask](const torch::Tensor& h) {
            return accel::forward(block, h, mask);
          },
          x);
    }
    return torch::nn::functional::linear(x, embedding->weight);
  }
  torch::nn::Embedding embedding{nullptr};
  std::vector<examples::Block> blocks;
};
TORCH_MODULE(Twice);

TEST(GptTest, ABlockRunTwiceUnderCheckpointingIsAClearError) {
  if (SharedAccelerator().num_processes() == 1) {
    GTEST_SKIP() << "one process reduces nothing";
  }
  for (int stage : {2, 3}) {
    AcceleratorOptions options = TestAcceleratorOptions();
    options.zero_stage = stage;
    options.gradient_sync.first_bucket_bytes = 4096;
    Accelerator accelerator(options);
    Twice twice;
    torch::optim::AdamW adamw(twice->parameters(),
                              torch::optim::AdamWOptions(1e-3));
    auto [model, optimizer] = accelerator.prepare(twice, adamw);
    auto [tokens, targets] = Tokens(0, accelerator.process_index());
    const torch::Tensor loss = examples::LanguageModelLoss(
        model->forward(tokens, examples::CausalMask(16)), targets);
    try {
      accelerator.backward(loss);
      ADD_FAILURE() << "stage " << stage << ": no error";
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(),
                  ::testing::HasSubstr("got a second gradient in one backward"))
          << "stage " << stage;
    }
  }
}

// Last: a sharded checkpoint of another model (wider, or deeper) is refused
// by every rank before anything changes, naming the tensor.
TEST(GptTest, ACheckpointOfAnotherModelIsRefusedOnEveryRank) {
  if (SharedAccelerator().num_processes() == 1) {
    GTEST_SKIP() << "one process writes no sharded checkpoint";
  }
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) +
                          "/gpt_changed_" +
                          std::to_string(SharedAccelerator().num_processes());
  AcceleratorOptions options = TestAcceleratorOptions();
  options.zero_stage = 3;
  {
    Accelerator accelerator(options);
    examples::Gpt gpt(SmallGpt(false));
    torch::optim::AdamW adamw(gpt->parameters(),
                              torch::optim::AdamWOptions(1e-3));
    auto [model, optimizer] = accelerator.prepare(gpt, adamw);
    auto [tokens, targets] = Tokens(0, accelerator.process_index());
    accelerator.backward(examples::LanguageModelLoss(
        model->forward(tokens, examples::CausalMask(16)), targets));
    optimizer.step();
    accelerator.save_state(dir);
    accelerator.wait_for_everyone();
  }
  examples::GptConfig wider = SmallGpt(false);
  wider.n_embd = 48;
  examples::GptConfig deeper = SmallGpt(false);
  deeper.n_layer = 4;
  for (const auto& [config, expected] :
       {std::make_pair(wider,
                       std::string("token_embedding.weight of shape [32, 32], "
                                   "but this program's is [32, 48]")),
        std::make_pair(
            deeper,
            std::string(
                "hold no model_0/blocks.3.ln1.weight: the model changed"))}) {
    Accelerator accelerator(options);
    examples::Gpt gpt(config);
    torch::optim::AdamW adamw(gpt->parameters(),
                              torch::optim::AdamWOptions(1e-3));
    auto [model, optimizer] = accelerator.prepare(gpt, adamw);
    const auto before = model->parameters().front().detach().clone();
    try {
      accelerator.load_state(dir);
      ADD_FAILURE() << "loaded a checkpoint of another model";
    } catch (const CheckpointError& e) {
      std::printf("rank %d: %s\n", accelerator.process_index(), e.what());
      EXPECT_THAT(e.what(), ::testing::HasSubstr(expected));
    }
    EXPECT_TRUE(torch::equal(model->parameters().front(), before));
  }
}

}  // namespace
}  // namespace accel::testing
