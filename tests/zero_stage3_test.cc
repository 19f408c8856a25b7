// ZeRO stage 3 (accel/parallel/zero.h): the units it wraps, DDP's
// parameters from them, each unit's parameters freed outside its forward
// and backward (a read or a write of one is a clear death), misuse, and the
// weights gathered on the main process when saved. Part of zero_test (and
// zero_tcp_test, zero_mpi_test).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accel/checkpoint/checkpoint.h"
#include "accel/checkpoint/model_weights.h"
#include "accel/memory/released_memory.h"
#include "accel/parallel/zero.h"
#include "tests/multiprocess_main.h"
#include "tests/usage_error.h"
#include "tests/zero_training.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

// A layer holding a Sequential (LibTorch cannot nest Sequentials directly).
struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    layers = register_module(
        "layers",
        torch::nn::Sequential(torch::nn::Linear(4, 4), torch::nn::Tanh(),
                              torch::nn::Linear(4, 4)));
  }
  torch::Tensor forward(torch::Tensor x) { return layers->forward(x); }
  torch::nn::Sequential layers{nullptr};
};
TORCH_MODULE(Block);

std::vector<std::string> UnitPaths(const std::string& layer_type) {
  torch::manual_seed(3);
  torch::nn::Sequential outer(Block(), torch::nn::ReLU(),
                              torch::nn::Linear(4, 2));
  std::vector<std::string> names_before;
  for (const auto& p : outer->named_parameters())
    names_before.push_back(p.key());
  const torch::Tensor x = torch::randn({3, 4});
  const torch::Tensor before = outer->forward(x);
  std::vector<std::string> paths;
  for (const auto& unit : WrapUnits(*outer, layer_type)) {
    paths.push_back(unit.path);
  }
  // Unattached units run their layers as they are; names do not change.
  EXPECT_TRUE(torch::equal(outer->forward(x), before));
  std::vector<std::string> names_after;
  for (const auto& p : outer->named_parameters())
    names_after.push_back(p.key());
  EXPECT_EQ(names_after, names_before);
  return paths;
}

TEST(WrapUnitsTest, PicksTheOutermostChildrenOrEveryLayerOfAType) {
  using Paths = std::vector<std::string>;
  EXPECT_EQ(UnitPaths(""), (Paths{"0", "2"}));
  EXPECT_EQ(UnitPaths("Linear"), (Paths{"0.layers.0", "0.layers.2", "2"}));
  EXPECT_EQ(UnitPaths("torch::nn::LinearImpl"),
            (Paths{"0.layers.0", "0.layers.2", "2"}));
  EXPECT_EQ(UnitPaths("Block"), (Paths{"0"}));
  EXPECT_EQ(UnitPaths("Conv2d"), Paths{});
}

TEST(ZeroTest, Stage3GivesDdpsParameters) {
  const Result ddp = Train({});
  const Result zero = Train({.stage = 3});
  const double difference = MaxDifference(zero.parameters, ddp.parameters);
  EXPECT_EQ(zero.parameters_with_grad,
            SharedAccelerator().num_processes() == 1 ? 6 : 0);
  if (SharedAccelerator().is_main_process()) {
    std::printf(
        "stage 3 against DDP at %d process(es): max |difference| "
        "%.3g after %d steps\n",
        SharedAccelerator().num_processes(), difference, kSteps);
  }
  EXPECT_LE(difference, 1e-6);
  EXPECT_GT(MaxDifference(ddp.parameters, Train({.steps = 0}).parameters),
            1e-2);
}

TEST(ZeroTest, Stage3FreesEachUnitsParametersOutsideItsForwardAndBackward) {
  if (SharedAccelerator().num_processes() == 1) {
    GTEST_SKIP() << "one process shards nothing";
  }
  Accelerator accelerator(Options({.stage = 3}));
  torch::nn::Sequential net = MakeModel();
  std::shared_ptr<torch::nn::LinearImpl> first =
      net->ptr<torch::nn::LinearImpl>(0);
  torch::optim::AdamW adamw(net->parameters(),
                            torch::optim::AdamWOptions(1e-2));
  auto [model, optimizer] = accelerator.prepare(net, adamw);
  // Released storage points at the guarded range (released_memory.h).
  const auto all_freed = [&] {
    for (const auto& p : model->parameters()) {
      if (!IsReleasedMemory(p.storage().data())) return false;
    }
    return true;
  };
  EXPECT_TRUE(all_freed());
  for (int step = 0; step < 2; ++step) {
    auto [x, y] = Batch(step, accelerator.process_index());
    torch::Tensor loss =
        torch::nn::functional::cross_entropy(model->forward(x), y);
    EXPECT_TRUE(all_freed()) << "after forward";
    accelerator.backward(loss);
    EXPECT_TRUE(all_freed()) << "after backward";
    optimizer.step();
    optimizer.zero_grad();
    EXPECT_TRUE(all_freed()) << "after the step";
  }
  // Under no_sync too, a unit's parameters go once its gradients are in:
  // when the first layer's weight gets its gradient, the last layer's unit
  // is freed (it stayed whole to the end of backward, 4 bytes a parameter
  // more, before that was mended).
  {
    std::vector<torch::Tensor> params = model->parameters();
    int calls = 0;
    bool last_freed = false;
    const unsigned hook = params[0].register_hook([&](const torch::Tensor&) {
      ++calls;
      last_freed = IsReleasedMemory(params[4].storage().data()) &&
                   IsReleasedMemory(params[5].storage().data());
    });
    for (bool sync : {false, true}) {
      auto [x, y] = Batch(10 + sync, accelerator.process_index());
      std::optional<NoSyncScope> no_sync;
      if (!sync) no_sync.emplace(accelerator.no_sync(model));
      accelerator.backward(
          torch::nn::functional::cross_entropy(model->forward(x), y));
      EXPECT_EQ(calls, sync ? 2 : 1);
      EXPECT_TRUE(last_freed) << (sync ? "syncing" : "under no_sync");
      EXPECT_TRUE(all_freed()) << "after backward";
    }
    params[0].remove_hook(hook);
    optimizer.step();
    optimizer.zero_grad();
  }
  // Through the model a layer gathers; outside it (or reading a parameter)
  // the process ends, saying why, instead of reading freed memory. Under a
  // sanitizer its own SIGSEGV handler reports instead.
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // The message names the parameter whose bytes were touched.
  std::string weight, bias;
  for (const auto& p : model->named_parameters()) {
    if (p.value().is_same(first->weight)) weight = p.key();
    if (p.value().is_same(first->bias)) bias = p.key();
  }
  ASSERT_FALSE(weight.empty() || bias.empty());
  ::testing::FLAGS_gtest_death_test_style = "fast";
  EXPECT_DEATH(first->forward(torch::ones({2, 12})),
               "parameter '(" + weight + "|" + bias +
                   ")' of a ZeRO stage-3 unit was read while its unit was "
                   "not running");
  EXPECT_DEATH(
      std::printf("%f\n", first->weight.sum().item<double>()),
      "parameter '" + weight + "' .*accelerator.get_state_dict\\(model\\)");
  // A write is said to be one (it was reported as a read).
  EXPECT_DEATH(
      {
        torch::NoGradGuard no_grad;
        first->weight.fill_(1.0);
      },
      "parameter '" + weight +
          "' of a ZeRO stage-3 unit was written while its unit was not "
          "running");
#endif
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(
        model->forward(torch::ones({2, 12})).isfinite().all().item<bool>());
  }
  EXPECT_TRUE(all_freed());
  // free_memory gives the model back whole on every rank.
  const auto weights = accelerator.get_state_dict(model);
  accelerator.free_memory();
  EXPECT_FALSE(all_freed());
  if (accelerator.is_main_process()) {
    for (const auto& p : model->named_parameters()) {
      EXPECT_TRUE(torch::equal(p.value(), weights.at(p.key()))) << p.key();
    }
  }
}

TEST(ZeroTest, Stage3MisuseIsOneClearErrorOnEveryRank) {
  if (SharedAccelerator().num_processes() == 1) {
    GTEST_SKIP() << "one process shards nothing";
  }
  Accelerator accelerator(Options({.stage = 3}));
  auto alone = accelerator.prepare(MakeModel());
  EXPECT_THAT(
      UsageErrorOf([&] {
        accelerator.backward(alone->forward(torch::ones({1, 12})).sum());
      }),
      HasSubstr("prepared without one"));
  EXPECT_THAT(
      UsageErrorOf([&] { accelerator.prepare(torch::nn::Linear(3, 3)); }),
      HasSubstr("has no Sequential child or ModuleList entry with trainable "
                "parameters"));
  AcceleratorOptions typed = Options({.stage = 3});
  typed.fsdp_layer_to_wrap = "TransformerEncoderLayer";
  Accelerator by_type(typed);
  EXPECT_THAT(UsageErrorOf([&] { by_type.prepare(MakeModel()); }),
              HasSubstr("module of type 'TransformerEncoderLayer'"));
}

// cast_forward_inputs (FSDP2's, on by default): bf16 parameters without
// autocast, FSDP's way; a unit given the float32 batch computes in bf16.
// Turned off, LibTorch's linear refuses the two dtypes, on every rank.
TEST(ZeroTest, Stage3UnitsCastFloatInputsToTheParametersDtype) {
  if (SharedAccelerator().num_processes() == 1) {
    GTEST_SKIP() << "one process shards nothing";
  }
  for (const bool cast : {true, false}) {
    SCOPED_TRACE(cast ? "cast" : "not cast");
    AcceleratorOptions options = Options({.stage = 3,
                                          .param_dtype = torch::kBFloat16,
                                          .cast_forward_inputs = cast});
    options.autocast.enabled = false;
    Accelerator accelerator(options);
    torch::nn::Sequential net = MakeModel();
    torch::optim::AdamW adamw(net->parameters(),
                              torch::optim::AdamWOptions(1e-2));
    auto [model, optimizer] = accelerator.prepare(net, adamw);
    const auto [x, y] = Batch(0, accelerator.process_index());
    ASSERT_EQ(x.scalar_type(), torch::kFloat32);
    if (!cast) {
      EXPECT_THROW(model->forward(x), c10::Error);
      continue;
    }
    const torch::Tensor out = model->forward(x);
    EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
    accelerator.backward(torch::nn::functional::cross_entropy(out, y));
    optimizer.step();
  }
}

// A block of a hand-written forward that notes the dtypes it was given.
class NotingBlockImpl : public torch::nn::Module {
 public:
  NotingBlockImpl()
      : linear_(register_module("linear", torch::nn::Linear(12, 12))) {}
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& mask) {
    seen = {x.scalar_type(), mask.scalar_type()};
    return linear_->forward(x) * mask;
  }
  // A layer that takes a tensor by non-const reference gets the caller's.
  torch::Tensor forward(torch::Tensor& x) {
    seen = {x.scalar_type()};
    return x;
  }
  std::vector<c10::ScalarType> seen;

 private:
  torch::nn::Linear linear_;
};
TORCH_MODULE(NotingBlock);

// The trial's finding: accel::forward(block, x, mask) with named tensors
// (non-const lvalues) left the float32 mask uncast.
TEST(ZeroTest, Stage3CastsNamedTensorArgumentsOfAHandWrittenForward) {
  if (SharedAccelerator().num_processes() == 1) {
    GTEST_SKIP() << "one process shards nothing";
  }
  AcceleratorOptions options =
      Options({.stage = 3, .param_dtype = torch::kBFloat16});
  options.autocast.enabled = false;
  Accelerator accelerator(options);
  NotingBlock first, second;
  torch::nn::ModuleList blocks(first, second);
  torch::optim::AdamW adamw(blocks->parameters(),
                            torch::optim::AdamWOptions(1e-2));
  auto [model, optimizer] = accelerator.prepare(blocks, adamw);
  torch::Tensor x = Batch(0, accelerator.process_index()).first;
  torch::Tensor mask = torch::ones_like(x);
  torch::Tensor hidden = x;
  for (NotingBlock* block : {&first, &second}) {
    hidden = accel::forward(*block, hidden, mask);
    EXPECT_EQ((*block)->seen, (std::vector<c10::ScalarType>{torch::kBFloat16,
                                                            torch::kBFloat16}));
  }
  EXPECT_EQ(mask.scalar_type(), torch::kFloat32);  // The caller's is kept.
  accelerator.backward(hidden.to(torch::kFloat32).sum());
  optimizer.step();
  torch::Tensor& same = x;
  EXPECT_EQ(accel::forward(first, same).scalar_type(), torch::kFloat32);
}

// A weight tied by registering it under two names (the head's weight is
// the input layer's), the way a port of a Python model often ties it.
class TiedNetImpl : public torch::nn::Module {
 public:
  TiedNetImpl()
      : input_(register_module("input", torch::nn::Linear(12, 12))),
        blocks_(register_module(
            "blocks", torch::nn::ModuleList(torch::nn::Linear(12, 12),
                                            torch::nn::Linear(12, 12)))),
        head_weight_(register_parameter("head_weight", input_->weight)) {}
  torch::Tensor forward(torch::Tensor x) {
    x = input_->forward(x);
    for (const auto& block : *blocks_) {
      x = accel::forward(*block->as<torch::nn::Linear>(), x).tanh();
    }
    return torch::nn::functional::linear(x, head_weight_);
  }

 private:
  torch::nn::Linear input_;
  torch::nn::ModuleList blocks_;
  torch::Tensor head_weight_;
};
TORCH_MODULE(TiedNet);

// The trial's finding: stages 2-3 refused such a model ("this one holds 52
// trainable parameters and its model 53") though the optimizer held each
// parameter once; and an optimizer given model->parameters() as it is
// (the tied weight twice) failed only at the first save_state, under DDP.
TEST(ZeroTest, AWeightRegisteredUnderTwoNamesTrainsAtEveryStage) {
  torch::Tensor reference;
  for (const int stage : {0, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    Accelerator accelerator(Options({.stage = stage}));
    torch::manual_seed(0);
    TiedNet net;
    std::vector<torch::Tensor> once;
    for (const torch::Tensor& p : net->parameters()) {
      bool seen = false;
      for (const torch::Tensor& q : once) seen = seen || q.is_same(p);
      if (!seen) once.push_back(p);
    }
    ASSERT_EQ(once.size(), net->parameters().size() - 1);
    {
      // On a model of its own: a prepare that failed has prepared the
      // model already, and preparing it again would sync it twice.
      Accelerator refusing(Options({.stage = stage}));
      TiedNet other;
      torch::optim::AdamW twice(other->parameters(),
                                torch::optim::AdamWOptions(1e-2));
      EXPECT_THAT(UsageErrorOf([&] { refusing.prepare(other, twice); }),
                  HasSubstr("the optimizer holds parameter 'input.weight' "
                            "twice"));
    }
    torch::optim::AdamW adamw(once, torch::optim::AdamWOptions(1e-2));
    auto [model, optimizer] = accelerator.prepare(net, adamw);
    for (int step = 0; step < 5; ++step) {
      const auto [x, y] = Batch(step, accelerator.process_index());
      accelerator.backward(
          torch::nn::functional::cross_entropy(model->forward(x), y % 12));
      optimizer.step();
      optimizer.zero_grad();
    }
    std::vector<torch::Tensor> values;
    for (const auto& [name, value] : accelerator.get_state_dict(model)) {
      values.push_back(value.flatten());
    }
    if (values.empty()) continue;  // Stage 3 gathers on the main process.
    const torch::Tensor all = torch::cat(values);
    if (!reference.defined()) reference = all;
    EXPECT_LE(MaxDifference(all, reference), 1e-6);
  }
}

TEST(ZeroTest, Stage3SavesDdpsWeightsGatheredOnTheMainProcess) {
  const std::string ddp_dir = Folder("weights_ddp");
  const std::string zero_dir = Folder("weights_zero3");
  const std::string checkpoint = Folder("checkpoint_zero3");
  Train({.steps = 5, .save_model_to = ddp_dir});
  Train({.stage = 3,
         .steps = 5,
         .save_to = checkpoint,
         .save_model_to = zero_dir});
  SharedAccelerator().wait_for_everyone();
  if (!SharedAccelerator().is_main_process()) return;
  const auto ddp = LoadModelWeights(ddp_dir);
  const auto zero = LoadModelWeights(zero_dir);
  // What accel-merge-weights writes: the checkpoint's gathered weights.
  const auto merged = ReadCheckpointWeights(checkpoint);
  ASSERT_EQ(zero.size(), ddp.size());
  ASSERT_EQ(merged.size(), ddp.size());
  for (const auto& [name, tensor] : merged) {
    ASSERT_EQ(ddp.count(name), 1u) << name;
    EXPECT_TRUE(torch::equal(tensor, ddp.at(name))) << name;
    EXPECT_TRUE(torch::equal(zero.at(name), ddp.at(name))) << name;
  }
}

}  // namespace
}  // namespace accel::testing
