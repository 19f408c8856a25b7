// invariant_micro_batches at 1, 2 and 4 processes: every rank ends with the
// weights that one process gets by running the K micro-batches itself and
// adding their gradients as one balanced tree, to the last bit, in float32
// and under bf16 autocast; DDP's allreduce does not (the test can tell).
// And the misuses: each a UsageError that says what to do.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <string>
#include <vector>

#include "accel/parallel/invariant_reduction.h"
#include "tests/multiprocess_main.h"
#include "tests/usage_error.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kGlobalBatch = 32;
constexpr int kSteps = 6;

Accelerator& A() { return SharedAccelerator(); }

AcceleratorOptions Invariant(int micro_batches,
                             const std::string& precision = "no") {
  AcceleratorOptions options = TestAcceleratorOptions();
  options.invariant_micro_batches = micro_batches;
  options.mixed_precision = precision;
  return options;
}

torch::nn::Sequential MakeModel() {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(6, 64), torch::nn::Tanh(),
                               torch::nn::Linear(64, 64), torch::nn::Tanh(),
                               torch::nn::Linear(64, 3));
}

// Step `step`'s global batch, the same on every rank.
torch::data::Example<> GlobalBatch(int step) {
  torch::manual_seed(100 + step);
  return {torch::randn({kGlobalBatch, 6}) * 3,
          torch::randint(0, 3, {kGlobalBatch})};
}

torch::Tensor Loss(torch::nn::Sequential& model,
                   const torch::data::Example<>& batch) {
  return torch::nn::functional::cross_entropy(model->forward(batch.data),
                                              batch.target);
}

torch::Tensor Flat(torch::nn::Module& model) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : model.parameters()) flat.push_back(p.detach().flatten());
  return torch::cat(flat);
}

// Trains through `accelerator`: each rank takes its share of every global
// batch (as split_batches gives it) and runs backward on each of its
// micro-batches.
torch::Tensor TrainDistributed(Accelerator& accelerator) {
  torch::nn::Sequential net = MakeModel();
  torch::optim::AdamW adamw(net->parameters(),
                            torch::optim::AdamWOptions(1e-2));
  auto [model, optimizer] = accelerator.prepare(net, adamw);
  const int n = accelerator.num_processes();
  const int share = kGlobalBatch / n;
  for (int step = 0; step < kSteps; ++step) {
    const torch::data::Example<> global = GlobalBatch(step);
    const torch::data::Example<> mine = {
        global.data.narrow(0, accelerator.process_index() * share, share),
        global.target.narrow(0, accelerator.process_index() * share, share)};
    for (const auto& micro : accelerator.micro_batches(mine)) {
      torch::Tensor loss;
      {
        auto autocast = accelerator.autocast();
        loss = Loss(model, micro);
      }
      accelerator.backward(loss);
    }
    optimizer.step();
    optimizer.zero_grad();
  }
  return Flat(*model);
}

// The definition, in one process without accel: the K micro-batches'
// gradients, each leaf a flat tensor, summed as ((g0 + g1) + (g2 + g3))
// (for K = 4), divided by K.
torch::Tensor TrainReference(int micro_batches, bool bf16) {
  torch::nn::Sequential model = MakeModel();
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(1e-2));
  const int rows = kGlobalBatch / micro_batches;
  for (int step = 0; step < kSteps; ++step) {
    const torch::data::Example<> global = GlobalBatch(step);
    std::vector<torch::Tensor> level{};
    for (int i = 0; i < micro_batches; ++i) {
      torch::Tensor loss;
      {
        AutocastScope autocast(
            torch::kCPU,
            bf16 ? std::optional<c10::ScalarType>(c10::ScalarType::BFloat16)
                 : std::nullopt);
        loss = Loss(model, {global.data.narrow(0, i * rows, rows),
                            global.target.narrow(0, i * rows, rows)});
      }
      optimizer.zero_grad();
      loss.backward();
      std::vector<torch::Tensor> flat;
      for (const auto& p : model->parameters())
        flat.push_back(p.grad().flatten());
      level.push_back(torch::cat(flat));
    }
    while (level.size() > 1) {
      std::vector<torch::Tensor> up;
      for (size_t i = 0; i < level.size(); i += 2) {
        up.push_back(level[i] + level[i + 1]);
      }
      level = up;
    }
    const torch::Tensor total = level[0] / micro_batches;
    int64_t offset = 0;
    for (auto& p : model->parameters()) {
      p.mutable_grad() = total.narrow(0, offset, p.numel()).view_as(p).clone();
      offset += p.numel();
    }
    optimizer.step();
  }
  return Flat(*model);
}

TEST(InvariantTest, SameBitsAsOneProcessRunningTheTree) {
  for (const std::string precision : {"no", "bf16"}) {
    Accelerator accelerator(Invariant(4, precision));
    const torch::Tensor trained = TrainDistributed(accelerator);
    const torch::Tensor reference = TrainReference(4, precision == "bf16");
    EXPECT_TRUE(trained.equal(reference))
        << precision << " at " << accelerator.num_processes()
        << " processes: largest difference "
        << (trained - reference).abs().max().item<double>();
    EXPECT_EQ(accelerator.step(), kSteps) << "one step per global batch";
  }
}

// What the mode is for: DDP's average of the ranks' batch gradients rounds
// otherwise than one process does, so the test above can fail.
TEST(InvariantTest, DdpPartsFromOneProcess) {
  if (A().num_processes() == 1) GTEST_SKIP() << "one process: no allreduce";
  Accelerator accelerator(Invariant(0));
  const torch::Tensor trained = TrainDistributed(accelerator);
  const torch::Tensor reference = TrainReference(1, false);
  EXPECT_FALSE(trained.equal(reference));
  EXPECT_LT((trained - reference).abs().max().item<double>(), 1e-3);
}

TEST(InvariantTest, PairwiseSumIsABalancedTree) {
  const std::vector<float> leaves = {1e8f, 1.0f, -1e8f, 1.0f};
  PairwiseSum one_at_a_time;
  for (float leaf : leaves) one_at_a_time.Add(torch::tensor({leaf}));
  // (1e8 + 1) + (-1e8 + 1) in float32: both ones are lost; in order
  // ((1e8 + 1) - 1e8) + 1 would give 1.
  EXPECT_EQ(one_at_a_time.Take().item<float>(), 0.0f);
  PairwiseSum subtrees;
  subtrees.Add(torch::tensor({1e8f + 1.0f}), 1);
  subtrees.Add(torch::tensor({-1e8f + 1.0f}), 1);
  EXPECT_EQ(subtrees.Take().item<float>(), 0.0f);
  EXPECT_TRUE(subtrees.empty());
}

TEST(InvariantTest, BadCountsAreClearErrors) {
  EXPECT_THAT(UsageErrorOf([] { Accelerator bad(Invariant(3)); }),
              HasSubstr("invariant_micro_batches (--invariant_micro_batches) "
                        "is 3; it must be 0 (off) or a power of two"));
  EXPECT_THAT(UsageErrorOf([] { CheckInvariantMicroBatches(2, 4); }),
              HasSubstr("is 2, which 4 processes do not divide"));
  AcceleratorOptions zero = Invariant(4);
  zero.zero_stage = 2;
  EXPECT_THAT(UsageErrorOf([&] { Accelerator bad(zero); }),
              HasSubstr("invariant_micro_batches=4 does not combine with ZeRO "
                        "(zero_stage 2)"));
  AcceleratorOptions accumulation = Invariant(4);
  accumulation.gradient_accumulation_steps = 2;
  EXPECT_THAT(UsageErrorOf([&] { Accelerator bad(accumulation); }),
              HasSubstr("does not combine with gradient_accumulation_steps 2"));
  AcceleratorOptions hook = Invariant(4);
  hook.gradient_sync.comm_hook = DDPCommunicationHookType::kBf16;
  EXPECT_THAT(UsageErrorOf([&] { Accelerator bad(hook); }),
              HasSubstr("does not combine with a DDP comm hook"));
}

TEST(InvariantTest, MisusedLoopsAreClearErrors) {
  Accelerator accelerator(Invariant(4));
  torch::nn::Sequential net = MakeModel();
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions());
  auto [model, optimizer] = accelerator.prepare(net, adamw);
  const int n = accelerator.num_processes();
  const torch::data::Example<> batch = GlobalBatch(0);
  if (n < 4) {  // At 4 processes each runs one micro-batch: any size.
    EXPECT_THAT(
        UsageErrorOf([&] {
          accelerator.micro_batches(torch::data::Example<>{
              batch.data.narrow(0, 0, 5), batch.target.narrow(0, 0, 5)});
        }),
        HasSubstr("the batch's data has 5 rows, which do not split into " +
                  std::to_string(4 / n) + " equal micro-batches"));
  }
  EXPECT_THAT(UsageErrorOf([&] {
                accelerator.micro_batches(torch::data::Example<>{
                    batch.data.narrow(0, 0, 8), batch.target.narrow(0, 0, 4)});
              }),
              HasSubstr("the batch's data has 8 rows and its target 4"));
  const auto unlabelled = accelerator.micro_batches(
      torch::data::Example<>{batch.data.narrow(0, 0, 8), torch::Tensor()});
  ASSERT_EQ(unlabelled.size(), static_cast<size_t>(4 / n));
  EXPECT_EQ(unlabelled[0].data.size(0), 8 / (4 / n));
  EXPECT_FALSE(unlabelled[0].target.defined());
  EXPECT_THAT(UsageErrorOf([&] { auto scope = accelerator.no_sync(model); }),
              HasSubstr("no_sync (or accumulate, LocalSGD, "
                        "join_uneven_inputs) is not available"));
  if (n < 4) {
    // One backward for the whole share: the step's gradient is incomplete,
    // and whatever would use it mid-step says so.
    accelerator.backward(Loss(model, batch));
    EXPECT_FALSE(accelerator.sync_gradients());
    const std::string incomplete =
        " after 1 of the " + std::to_string(4 / n) + " micro-batches";
    EXPECT_THAT(UsageErrorOf([&] { optimizer.step(); }),
                HasSubstr("optimizer.step" + incomplete));
    EXPECT_THAT(UsageErrorOf([&] {
                  accelerator.clip_grad_norm_(model->parameters(), 1.0);
                }),
                HasSubstr("clip_grad_norm_" + incomplete));
    EXPECT_THAT(UsageErrorOf([&] {
                  accelerator.clip_grad_value_(model->parameters(), 1.0);
                }),
                HasSubstr("clip_grad_value_" + incomplete));
    EXPECT_THAT(UsageErrorOf([&] { accelerator.unscale_gradients(); }),
                HasSubstr("unscale_gradients" + incomplete));
    EXPECT_THAT(UsageErrorOf([&] { accelerator.save_state("unused"); }),
                HasSubstr("save_state" + incomplete));
  }
}

// A slice's backward run twice (two losses) would add a second tree on
// top of the first: refused until the step's gradient is used.
TEST(InvariantTest, BackwardBeyondTheStepsMicroBatchesIsAClearError) {
  Accelerator accelerator(Invariant(4));
  torch::nn::Sequential net = MakeModel();
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions());
  auto [model, optimizer] = accelerator.prepare(net, adamw);
  const int share = kGlobalBatch / accelerator.num_processes();
  const torch::data::Example<> mine = {
      GlobalBatch(0).data.narrow(0, 0, share),
      GlobalBatch(0).target.narrow(0, 0, share)};
  for (const auto& micro : accelerator.micro_batches(mine)) {
    accelerator.backward(Loss(model, micro));
  }
  EXPECT_TRUE(accelerator.sync_gradients());
  EXPECT_THAT(
      UsageErrorOf([&] {
        accelerator.backward(Loss(model, accelerator.micro_batches(mine)[0]));
      }),
      HasSubstr("micro-batch(es) of the step have run backward "
                "already"));
  EXPECT_EQ(accelerator.step(), 1);
  optimizer.step();
  optimizer.zero_grad();
  // After the step, the next step's micro-batches run as usual.
  for (const auto& micro : accelerator.micro_batches(mine)) {
    accelerator.backward(Loss(model, micro));
  }
  optimizer.step();
  EXPECT_EQ(accelerator.step(), 2);
}

}  // namespace
}  // namespace accel::testing
