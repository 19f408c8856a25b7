// AdamWScheduleFree against the method written the paper's way (x, y and z
// kept apart, in doubles), its train/eval switch, misuse, and its state
// through save and load.
#include "accel/optim/schedule_free.h"

#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <cmath>
#include <sstream>
#include <vector>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

constexpr double kLr = 0.1, kBeta1 = 0.9, kBeta2 = 0.99, kEps = 1e-8;
constexpr double kDecay = 0.05;
constexpr int kWarmup = 2;
const std::vector<double> kCurvature = {1.0, 3.0, 0.5};

AdamWScheduleFreeOptions Options() {
  return AdamWScheduleFreeOptions(kLr)
      .beta1(kBeta1)
      .beta2(kBeta2)
      .eps(kEps)
      .weight_decay(kDecay)
      .warmup_steps(kWarmup);
}

// loss = sum(curvature * p^2) / 2, so the gradient is curvature * p.
void Backward(const torch::Tensor& p) {
  const torch::Tensor curvature = torch::tensor(kCurvature, torch::kDouble);
  (curvature * p * p).sum().div(2).backward();
}

// The paper's form: the gradient at y = (1 - beta1) z + beta1 x; z steps;
// x averages z with weights lr_max^2.
struct Reference {
  std::vector<double> x, z, v;
  double weight_sum = 0, lr_max = -1;
  int k = 0;
  std::vector<double> y() const {
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      y[i] = (1 - kBeta1) * z[i] + kBeta1 * x[i];
    }
    return y;
  }
  void Step() {
    const std::vector<double> at = y();
    const double lr = kLr * std::min(1.0, (k + 1.0) / kWarmup);
    lr_max = std::max(lr_max, lr);
    const double weight = lr_max * lr_max;
    weight_sum += weight;
    const double c = weight / weight_sum;
    const double bias_correction2 = 1 - std::pow(kBeta2, k + 1);
    for (size_t i = 0; i < x.size(); ++i) {
      const double g = kCurvature[i] * at[i];
      v[i] = kBeta2 * v[i] + (1 - kBeta2) * g * g;
      const double d =
          g / (std::sqrt(v[i] / bias_correction2) + kEps) + kDecay * at[i];
      z[i] -= lr * d;
      x[i] = (1 - c) * x[i] + c * z[i];
    }
    ++k;
  }
};

void ExpectNear(const torch::Tensor& p, const std::vector<double>& expected) {
  ASSERT_EQ(p.numel(), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(p[i].item<double>(), expected[i], 1e-12) << "value " << i;
  }
}

TEST(AdamWScheduleFreeTest, MatchesThePapersFormInTrainAndEvalMode) {
  const std::vector<double> start = {1.0, -2.0, 0.5};
  torch::Tensor p = torch::tensor(start, torch::kDouble).requires_grad_();
  AdamWScheduleFree optimizer({p}, Options());
  Reference reference{start, start, {0, 0, 0}};
  optimizer.train();
  for (int step = 0; step < 6; ++step) {
    optimizer.zero_grad();
    Backward(p);
    optimizer.step();
    reference.Step();
    ExpectNear(p.detach(), reference.y());
  }
  optimizer.eval();
  ExpectNear(p.detach(), reference.x);
  optimizer.eval();  // Once is enough.
  ExpectNear(p.detach(), reference.x);
  optimizer.train();
  ExpectNear(p.detach(), reference.y());
}

TEST(AdamWScheduleFreeTest, RefusesToStepInEvalModeAndBadOptions) {
  torch::Tensor p = torch::ones({3}, torch::kDouble).requires_grad_();
  AdamWScheduleFree optimizer({p}, Options());
  Backward(p);
  try {
    optimizer.step();  // It starts in eval mode, as the package's does.
    ADD_FAILURE() << "stepped in eval mode";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("call train() before"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(AdamWScheduleFree({p}, Options().beta1(0)), UsageError);
  EXPECT_THROW(AdamWScheduleFree({p}, Options().lr(-1)), UsageError);
}

TEST(AdamWScheduleFreeTest, SaveAndLoadCarryTheIteratesAndTheSchedule) {
  const std::vector<double> start = {1.0, -2.0, 0.5};
  torch::Tensor a = torch::tensor(start, torch::kDouble).requires_grad_();
  AdamWScheduleFree first({a}, Options());
  first.train();
  for (int step = 0; step < 3; ++step) {
    first.zero_grad();
    Backward(a);
    first.step();
  }
  std::ostringstream saved;
  torch::save(first, saved);

  torch::Tensor b = a.detach().clone().requires_grad_();
  AdamWScheduleFree second({b}, Options());
  std::istringstream in(saved.str());
  torch::load(second, in);
  for (int step = 0; step < 3; ++step) {
    for (auto* pair : {&first, &second}) pair->zero_grad();
    Backward(a);
    Backward(b);
    first.step();
    second.step();
  }
  EXPECT_TRUE(torch::equal(a, b));
  first.eval();
  second.eval();
  EXPECT_TRUE(torch::equal(a, b));
}

}  // namespace
}  // namespace accel
