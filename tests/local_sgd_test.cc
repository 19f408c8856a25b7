// LocalSGD at 1-3 processes: gradients stay local between averages, every
// local_sgd_steps-th step() averages the parameters across ranks, and the
// scope's end averages once more.
#include "accel/local_sgd.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include "accel/runtime/base/errors.h"
#include "tests/multiprocess_main.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

Accelerator& A() { return SharedAccelerator(); }

torch::nn::Sequential MakeModel() {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 2));
}

torch::Tensor Flat(torch::nn::Module& model) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : model.parameters()) flat.push_back(p.detach().flatten());
  return torch::cat(flat);
}

// A different batch on every rank and step.
torch::Tensor Batch(int step) {
  torch::manual_seed(1000 * A().process_index() + step);
  return torch::randn({4, 6});
}

template <typename Optimizer>
void TrainStep(torch::nn::Sequential& model, Optimizer& optimizer, int step) {
  A().backward(model->forward(Batch(step)).pow(2).mean());
  optimizer.step();
  optimizer.zero_grad();
}

// The largest difference between this rank's tensor and any rank's.
double SpreadAcrossRanks(const torch::Tensor& t) {
  const torch::Tensor all = A().gather(t.unsqueeze(0));
  return (all - t).abs().max().item<double>();
}

TEST(LocalSgdTest, AveragesEveryNStepsAndAtTheEnd) {
  const int n = A().num_processes();
  torch::nn::Sequential net = MakeModel();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, optimizer] = A().prepare(net, sgd);
  int step = 0;
  {
    LocalSGD local_sgd(A(), model, /*local_sgd_steps=*/3);
    for (; step < 8; ++step) {
      TrainStep(model, optimizer, step);
      const torch::Tensor before = Flat(*model);
      // What the average must be: every rank's parameters, averaged.
      const torch::Tensor expected = A().gather(before.unsqueeze(0)).mean(0);
      local_sgd.step();
      const torch::Tensor after = Flat(*model);
      if ((step + 1) % 3 == 0) {
        EXPECT_LT((after - expected).abs().max().item<double>(), 1e-6)
            << "step " << step;
        EXPECT_EQ(SpreadAcrossRanks(after), 0.0) << "step " << step;
      } else {
        EXPECT_TRUE(after.equal(before)) << "step " << step;
        // Unsynced gradients: each rank's copy has drifted on its data.
        if (n > 1) {
          EXPECT_GT(SpreadAcrossRanks(after), 0.0) << "step " << step;
        }
      }
    }
    EXPECT_EQ(local_sgd.averages(), n > 1 ? 2 : 0);
  }
  EXPECT_EQ(SpreadAcrossRanks(Flat(*model)), 0.0);
  // Outside the scope gradients are synced again: ranks stay together.
  TrainStep(model, optimizer, step);
  EXPECT_EQ(SpreadAcrossRanks(Flat(*model)), 0.0);
}

TEST(LocalSgdTest, DisabledItIsPlainDdp) {
  torch::nn::Sequential net = MakeModel();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, optimizer] = A().prepare(net, sgd);
  LocalSGD local_sgd(A(), model, 2, /*enabled=*/false);
  for (int step = 0; step < 3; ++step) {
    TrainStep(model, optimizer, step);
    local_sgd.step();
    EXPECT_EQ(SpreadAcrossRanks(Flat(*model)), 0.0) << "step " << step;
  }
  EXPECT_EQ(local_sgd.averages(), 0);
}

TEST(LocalSgdTest, MisuseIsAClearError) {
  torch::nn::Sequential net = MakeModel();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, optimizer] = A().prepare(net, sgd);
  EXPECT_THAT([&] { LocalSGD bad(A(), model, 0); },
              ::testing::ThrowsMessage<UsageError>(
                  HasSubstr("local_sgd_steps must be at least 1, got 0")));
  if (A().num_processes() > 1) {
    torch::nn::Sequential stranger = MakeModel();
    EXPECT_THAT([&] { LocalSGD bad(A(), stranger, 2); },
                ::testing::ThrowsMessage<UsageError>(
                    HasSubstr("the model was not prepared by this "
                              "Accelerator")));
  }
  AcceleratorOptions sharded = TestAcceleratorOptions();
  sharded.zero_stage = 1;
  Accelerator zero(sharded);
  EXPECT_THAT([&] { LocalSGD bad(zero, model, 2); },
              ::testing::ThrowsMessage<UsageError>(
                  HasSubstr("not available under ZeRO (zero_stage 1)")));
}

}  // namespace
}  // namespace accel::testing
