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

#include <cstdio>
#include <map>
#include <memory>
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

struct GptRun {
  int stage = 0;
  double clip = 0;
  bool activation_checkpointing = false;  // accel::checkpoint in forward.
  // Each block marked fully_shard(block, {.activation_checkpointing = true}).
  bool checkpointed_units = false;
  int steps = kGptSteps;
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

// The weights after the run, gathered on the main process (empty on the
// others), in state_dict order.
std::map<std::string, torch::Tensor> TrainGpt(const GptRun& run) {
  AcceleratorOptions options = TestAcceleratorOptions();
  options.zero_stage = run.stage;
  options.gradient_sync.first_bucket_bytes = 4096;
  options.gradient_sync.bucket_cap_bytes = 16384;
  Accelerator accelerator(options);
  torch::manual_seed(7);
  examples::Gpt gpt(SmallGpt(run.activation_checkpointing));
  if (run.checkpointed_units) {
    for (const examples::Block& block : gpt->blocks()) {
      fully_shard(block, {.activation_checkpointing = true});
    }
  }
  torch::optim::AdamW adamw(gpt->parameters(),
                            torch::optim::AdamWOptions(1e-3));
  auto [model, optimizer] = accelerator.prepare(gpt, adamw);
  // The same dropout draws on every run of a rank.
  torch::manual_seed(100 + accelerator.process_index());
  const torch::Tensor mask = examples::CausalMask(16);
  for (int step = 0; step < run.steps; ++step) {
    auto [tokens, targets] = Tokens(step, accelerator.process_index());
    accelerator.backward(
        examples::LanguageModelLoss(model->forward(tokens, mask), targets));
    if (run.clip > 0)
      accelerator.clip_grad_norm_(model->parameters(), run.clip);
    optimizer.step();
    optimizer.zero_grad();
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
    const bool released = p.value().storage().data() == ReleasedMemory(0);
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
      EXPECT_EQ(p.value().storage().data(), ReleasedMemory(0)) << p.key();
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
               "a parameter of a ZeRO stage-3 unit was read");
  forward(gpt->blocks()[1], x, mask);  // Its gather ends on every rank.
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

}  // namespace
}  // namespace accel::testing
