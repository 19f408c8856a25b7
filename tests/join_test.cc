// join_uneven_inputs at 1-3 processes: with even_batches off, ranks get
// different numbers of batches; those that finish early take part in the
// others' gradient syncs with zero gradients, so training ends without a
// hang, every rank ends with the same parameters, and they equal a
// reference computed here step by step (each step's gradient: the sum over
// the ranks that trained, divided by num_processes, as DDP's default).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/data/example.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include "accel/accelerator.h"
#include "accel/data/data_loader.h"
#include "accel/runtime/base/errors.h"
#include "tests/multiprocess_main.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

Accelerator& A() { return SharedAccelerator(); }

constexpr int64_t kSamples = 10;
constexpr int64_t kBatch = 2;  // 5 batches: uneven at 2 and 3 processes.
constexpr double kLr = 0.1;

struct Points {
  torch::Tensor x, y;
  Points() {
    torch::manual_seed(11);
    x = torch::randn({kSamples, 3});
    y = torch::randn({kSamples, 1});
  }
  torch::data::Example<> get(size_t i) const {
    return {x[static_cast<int64_t>(i)], y[static_cast<int64_t>(i)]};
  }
  size_t size() const { return kSamples; }
};

torch::nn::Linear MakeModel() {
  torch::manual_seed(5);
  return torch::nn::Linear(3, 1);
}

torch::Tensor Loss(torch::nn::Linear& model, const torch::Tensor& x,
                   const torch::Tensor& y) {
  return (model->forward(x) - y).pow(2).mean();
}

torch::Tensor Flat(torch::nn::Module& model) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : model.parameters()) flat.push_back(p.detach().flatten());
  return torch::cat(flat);
}

// What the job must end with: at step k, rank r trains on batch r + N k
// while there is one; the gradients of those that do are summed and
// divided by N.
// Under accumulation of `steps` micro-steps, a sync happens at the end of
// a cycle in which some rank still trains; it carries every batch of the
// cycle (early ranks give theirs to it); a cycle no rank completes is not
// applied.
torch::Tensor ReferenceParameters(int n, int steps = 1) {
  const Points points;
  torch::nn::Linear model = MakeModel();
  const int64_t batches = kSamples / kBatch;
  for (int64_t cycle = 0; cycle * steps * n < batches; ++cycle) {
    const int64_t last_step = (cycle + 1) * steps - 1;
    // No rank syncs this cycle (one process: its loader's end does).
    if (n > 1 && n * last_step >= batches) break;
    std::vector<torch::Tensor> sum;
    for (const auto& p : model->parameters()) {
      sum.push_back(torch::zeros_like(p));
    }
    for (int64_t step = cycle * steps; step <= last_step; ++step) {
      for (int r = 0; r < n; ++r) {
        const int64_t batch = r + n * step;
        if (batch >= batches) continue;
        model->zero_grad();
        (Loss(model, points.x.narrow(0, batch * kBatch, kBatch),
              points.y.narrow(0, batch * kBatch, kBatch)) /
         steps)
            .backward();
        auto params = model->parameters();
        for (size_t i = 0; i < params.size(); ++i) sum[i] += params[i].grad();
      }
    }
    torch::NoGradGuard no_grad;
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      params[i] -= kLr * sum[i] / n;
    }
  }
  return Flat(*model);
}

DataLoaderOptions LoaderOptions() {
  DataLoaderOptions options;
  options.batch_size = kBatch;
  return options;
}

TEST(JoinTest, RanksThatRunOutShadowTheOthersToTheSameParameters) {
  const int n = A().num_processes();
  torch::nn::Linear net = MakeModel();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(kLr));
  auto [model, optimizer, loader] =
      A().prepare(net, sgd, DataLoader<Points>(Points(), LoaderOptions()));
  int steps = 0;
  {
    auto join = A().join_uneven_inputs({model}, /*even_batches=*/false);
    EXPECT_EQ(join.enabled(), n > 1);
    // Batches r, r + N, ...: 5 batches over N ranks, unpadded.
    const int64_t mine = (5 - A().process_index() + n - 1) / n;
    EXPECT_EQ(static_cast<int64_t>(loader.size()), mine);
    for (auto& batch : loader) {
      A().backward(Loss(model, batch.data, batch.target));
      optimizer.step();
      optimizer.zero_grad();
      ++steps;
    }
    EXPECT_EQ(steps, mine);
  }  // The early ranks wait here for the others.
  const torch::Tensor mine = Flat(*model);
  const torch::Tensor all = A().gather(mine.unsqueeze(0));
  EXPECT_EQ((all - mine).abs().max().item<double>(), 0.0);
  EXPECT_LT((mine - ReferenceParameters(n)).abs().max().item<double>(), 1e-6);
  // Outside the scope the loader pads again: every rank the same count.
  EXPECT_EQ(static_cast<int64_t>(loader.size()), (5 + n - 1) / n);
}

// Under gradient accumulation only syncing backwards are counted and
// shadowed, the end of a rank's loader does not sync, and a rank that ran
// out mid-cycle gives its gradients to the others' next sync. The first
// test's model is still prepared: each backward syncs two models, in an
// order the finishing ranks must follow (same-shaped buckets swapped would
// go unnoticed by the collective checks).
TEST(JoinTest, AccumulationSyncsOnlyEveryOtherStep) {
  torch::nn::Linear net = MakeModel();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(kLr));
  auto [model, optimizer, loader] =
      A().prepare(net, sgd, DataLoader<Points>(Points(), LoaderOptions()));
  A().set_gradient_accumulation_steps(2);
  {
    auto join = A().join_uneven_inputs({model}, /*even_batches=*/false);
    for (auto& batch : loader) {
      auto accumulate = A().accumulate(model);
      A().backward(Loss(model, batch.data, batch.target));
      optimizer.step();
      optimizer.zero_grad();
    }
  }
  A().set_gradient_accumulation_steps(1);
  const torch::Tensor mine = Flat(*model);
  const torch::Tensor all = A().gather(mine.unsqueeze(0));
  EXPECT_EQ((all - mine).abs().max().item<double>(), 0.0);
  EXPECT_LT((mine - ReferenceParameters(A().num_processes(), 2))
                .abs()
                .max()
                .item<double>(),
            1e-6);
}

TEST(JoinTest, EvenBatchesNeedNoJoinAndMisuseIsRefused) {
  torch::nn::Linear net = MakeModel();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(kLr));
  auto [model, optimizer] = A().prepare(net, sgd);
  {
    auto join = A().join_uneven_inputs({model});  // The default: even.
    EXPECT_FALSE(join.enabled());
    try {
      auto nested = A().join_uneven_inputs({model});
      ADD_FAILURE() << "a nested join was accepted";
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr("already inside"));
    }
  }
  torch::nn::Linear stranger = MakeModel();
  if (A().num_processes() > 1) {
    EXPECT_THROW(A().join_uneven_inputs({stranger}), UsageError);
  }
  // A rank that leaves the scope by an exception waits for nobody.
  try {
    auto join = A().join_uneven_inputs({model}, false);
    throw std::runtime_error("the loop failed");
  } catch (const std::runtime_error&) {
  }
  auto again = A().join_uneven_inputs({model}, false);
}

}  // namespace
}  // namespace accel::testing
