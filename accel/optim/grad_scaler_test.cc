// GradScaler on CPU: injected inf/nan gradients skip the step and back off
// the scale, clean steps grow it and apply exactly the unscaled gradients,
// misuse is a UsageError, and the state survives save/load.
#include "accel/optim/grad_scaler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "accel/core/libtorch_compat.h"
#include "accel/core/state_archive.h"
#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();

GradScalerOptions Options(void (*change)(GradScalerOptions&)) {
  GradScalerOptions options;
  change(options);
  return options;
}

// A small model with Adam (which has per-parameter state), fed fixed data.
struct Training {
  explicit Training(uint64_t seed = 1) {
    torch::manual_seed(seed);
    model = torch::nn::Linear(4, 3);
    optimizer = std::make_unique<torch::optim::Adam>(
        model->parameters(), torch::optim::AdamOptions(0.01));
  }
  torch::Tensor Loss(int step) {
    const torch::Tensor input =
        torch::linspace(-1, 1, 8).reshape({2, 4}) * (step + 1);
    return model->forward(input).pow(2).mean();
  }
  std::vector<torch::Tensor> Parameters() const {
    std::vector<torch::Tensor> copies;
    for (const auto& p : model->parameters()) copies.push_back(p.clone());
    return copies;
  }
  // Every Adam state tensor and step count, copied.
  std::vector<torch::Tensor> OptimizerState() const {
    std::vector<torch::Tensor> state;
    for (const auto& p : model->parameters()) {
      auto it = optimizer->state().find(compat::StateKey(p));
      if (it == optimizer->state().end()) continue;
      auto& adam = static_cast<torch::optim::AdamParamState&>(*it->second);
      state.push_back(adam.exp_avg().clone());
      state.push_back(adam.exp_avg_sq().clone());
      state.push_back(torch::tensor(adam.step()));
    }
    return state;
  }
  torch::nn::Linear model{nullptr};
  std::unique_ptr<torch::optim::Adam> optimizer;
};

void ExpectSameTensors(const std::vector<torch::Tensor>& a,
                       const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
  }
}

TEST(GradScalerTest, CleanStepsApplyExactlyTheUnscaledGradients) {
  Training plain, scaled;
  GradScaler scaler;
  for (int step = 0; step < 5; ++step) {
    plain.optimizer->zero_grad();
    plain.Loss(step).backward();
    plain.optimizer->step();

    scaled.optimizer->zero_grad();
    torch::Tensor loss = scaled.Loss(step);
    torch::Tensor scaled_loss = scaler.scale(loss);
    EXPECT_EQ(scaled_loss.item<double>(), loss.item<double>() * 65536);
    scaled_loss.backward();
    EXPECT_TRUE(scaler.step(*scaled.optimizer));
    scaler.update();
  }
  // The scale is a power of two, so scaling and unscaling are exact.
  ExpectSameTensors(scaled.Parameters(), plain.Parameters());
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.growth_tracker(), 5);
}

TEST(GradScalerTest, UnscaleBeforeClippingThenStepDoesNotUnscaleTwice) {
  Training plain, scaled;
  GradScaler scaler;
  plain.Loss(0).backward();
  const double plain_norm =
      torch::nn::utils::clip_grad_norm_(plain.model->parameters(), 0.1);
  plain.optimizer->step();

  scaler.scale(scaled.Loss(0)).backward();
  scaler.unscale_(*scaled.optimizer);
  const double scaled_norm =
      torch::nn::utils::clip_grad_norm_(scaled.model->parameters(), 0.1);
  EXPECT_EQ(scaled_norm, plain_norm);
  EXPECT_TRUE(scaler.step(*scaled.optimizer));
  scaler.update();
  ExpectSameTensors(scaled.Parameters(), plain.Parameters());
}

struct Injection {
  torch::ScalarType dtype;
  double value;
};

class InjectedGradientTest : public ::testing::TestWithParam<Injection> {};

TEST_P(InjectedGradientTest, SkipsTheStepAndBacksOff) {
  Training training;
  GradScaler scaler;
  // One clean step first, so that the optimizer has state to protect.
  scaler.scale(training.Loss(0)).backward();
  ASSERT_TRUE(scaler.step(*training.optimizer));
  scaler.update();
  const auto parameters = training.Parameters();
  const auto state = training.OptimizerState();
  ASSERT_FALSE(state.empty());

  training.optimizer->zero_grad();
  scaler.scale(training.Loss(1)).backward();
  torch::Tensor& weight_grad = training.model->weight.mutable_grad();
  weight_grad = weight_grad.to(GetParam().dtype);
  weight_grad[1][2] = GetParam().value;

  EXPECT_FALSE(scaler.step(*training.optimizer));
  ExpectSameTensors(training.Parameters(), parameters);
  ExpectSameTensors(training.OptimizerState(), state);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);

  // The next clean iteration steps again.
  training.model->weight.mutable_grad() = torch::Tensor();
  training.optimizer->zero_grad();
  scaler.scale(training.Loss(2)).backward();
  EXPECT_TRUE(scaler.step(*training.optimizer));
  scaler.update();
  EXPECT_EQ(scaler.growth_tracker(), 1);
}

INSTANTIATE_TEST_SUITE_P(
    InfAndNan, InjectedGradientTest,
    ::testing::Values(Injection{torch::kFloat, kInf},
                      Injection{torch::kFloat, -kInf},
                      Injection{torch::kFloat, std::nan("")},
                      Injection{torch::kHalf, kInf},
                      Injection{torch::kHalf, std::nan("")},
                      Injection{torch::kBFloat16, -kInf},
                      Injection{torch::kBFloat16, std::nan("")},
                      Injection{torch::kDouble, kInf}),
    [](const auto& info) {
      std::string value = std::isnan(info.param.value) ? "nan"
                          : info.param.value > 0       ? "inf"
                                                       : "minus_inf";
      return std::string(c10::toString(info.param.dtype)) + "_" + value;
    });

TEST(GradScalerTest, UnscalesHalfPrecisionAndSparseGradients) {
  GradScaler scaler(Options([](GradScalerOptions& o) { o.init_scale = 1024; }));
  torch::Tensor half = torch::zeros({3}, torch::kHalf).requires_grad_();
  half.mutable_grad() = torch::tensor({1024.0, -2048.0, 512.0}, torch::kHalf);
  torch::Tensor bf16 = torch::zeros({2}, torch::kBFloat16).requires_grad_();
  bf16.mutable_grad() = torch::tensor({3072.0, 1.0}, torch::kBFloat16);
  torch::Tensor sparse = torch::zeros({4}).requires_grad_();
  // Two entries at index 1, summed by coalescing: 1024 + 1024.
  sparse.mutable_grad() = torch::sparse_coo_tensor(
      torch::tensor({1, 1, 3}, torch::kLong).unsqueeze(0),
      torch::tensor({1024.f, 1024.f, 4096.f}), {4});
  torch::optim::SGD optimizer({half, bf16, sparse},
                              torch::optim::SGDOptions(1));
  scaler.unscale_(optimizer);
  EXPECT_TRUE(
      torch::equal(half.grad(), torch::tensor({1.0, -2.0, 0.5}, torch::kHalf)));
  EXPECT_TRUE(torch::equal(bf16.grad(),
                           torch::tensor({3.0, 1.0 / 1024}, torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(sparse.grad().to_dense(),
                           torch::tensor({0.f, 2.f, 0.f, 4.f})));
  EXPECT_TRUE(scaler.step(optimizer));
  scaler.update();

  // An inf among sparse values is found too.
  sparse.mutable_grad() =
      torch::sparse_coo_tensor(torch::zeros({1, 1}, torch::kLong),
                               torch::tensor({static_cast<float>(kInf)}), {4});
  half.mutable_grad() = torch::Tensor();
  bf16.mutable_grad() = torch::Tensor();
  EXPECT_FALSE(scaler.step(optimizer));
}

TEST(GradScalerTest, GrowsAfterGrowthIntervalCleanStepsOnly) {
  Training training;
  GradScaler scaler(
      Options([](GradScalerOptions& o) { o.growth_interval = 3; }));
  const auto iteration = [&](bool inject) {
    training.optimizer->zero_grad();
    scaler.scale(training.Loss(0)).backward();
    if (inject) training.model->bias.mutable_grad()[0] = kInf;
    const bool stepped = scaler.step(*training.optimizer);
    scaler.update();
    return stepped;
  };
  iteration(false);
  iteration(false);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  EXPECT_FALSE(iteration(true));  // Resets the count.
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  iteration(false);
  iteration(false);
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  iteration(false);
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  for (int i = 0; i < 3; ++i) iteration(false);
  EXPECT_EQ(scaler.get_scale(), 131072.0);
}

TEST(GradScalerTest, NeverGrowsPastFloat32) {
  torch::optim::SGD optimizer({torch::ones({1}, torch::requires_grad())},
                              torch::optim::SGDOptions(1));
  GradScaler scaler(Options([](GradScalerOptions& o) {
    o.init_scale = 3e38;
    o.growth_interval = 1;
  }));
  scaler.unscale_(optimizer);  // No gradients: nothing found.
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), static_cast<double>(3e38f));
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScalerTest, AnyRankFindingInfSkipsEverywhere) {
  Training training;
  GradScaler scaler;
  std::vector<bool> asked;
  scaler.set_agreement([&](bool found_here) {
    asked.push_back(found_here);
    return true;  // Another rank overflowed.
  });
  const auto parameters = training.Parameters();
  scaler.scale(training.Loss(0)).backward();
  EXPECT_FALSE(scaler.step(*training.optimizer));
  scaler.update();
  EXPECT_EQ(asked, std::vector<bool>{false});
  ExpectSameTensors(training.Parameters(), parameters);
  EXPECT_EQ(scaler.get_scale(), 32768.0);
}

TEST(GradScalerTest, EachOptimizerStepsOnItsOwnFindings) {
  Training first, second;
  GradScaler scaler;
  scaler.scale(first.Loss(0) + second.Loss(0)).backward();
  second.model->weight.mutable_grad()[0][0] = std::nan("");
  const auto second_parameters = second.Parameters();
  EXPECT_TRUE(scaler.step(*first.optimizer));
  EXPECT_FALSE(scaler.step(*second.optimizer));
  ExpectSameTensors(second.Parameters(), second_parameters);
  scaler.update();  // Any inf backs off the shared scale.
  EXPECT_EQ(scaler.get_scale(), 32768.0);
}

TEST(GradScalerTest, ScaledHalfLossCannotOverflow) {
  GradScaler scaler;
  const torch::Tensor loss = torch::tensor(2.0, torch::kHalf);
  const torch::Tensor scaled = scaler.scale(loss);
  EXPECT_EQ(scaled.scalar_type(), torch::kFloat);
  EXPECT_EQ(scaled.dim(), 0);
  EXPECT_EQ(scaled.item<double>(), 131072.0);  // Beyond fp16's 65504.
  EXPECT_EQ(scaler.scale(torch::ones({2}, torch::kDouble)).scalar_type(),
            torch::kDouble);
}

TEST(GradScalerTest, MisuseIsAUsageError) {
  Training training;
  GradScaler scaler;
  EXPECT_THAT([&] { scaler.update(); },
              ::testing::ThrowsMessage<UsageError>(HasSubstr(
                  "no unscale_() or step() since the last update()")));
  scaler.scale(training.Loss(0)).backward();
  scaler.unscale_(*training.optimizer);
  EXPECT_THAT([&] { scaler.unscale_(*training.optimizer); },
              ::testing::ThrowsMessage<UsageError>(HasSubstr(
                  "unscale_: already called on this optimizer since the last "
                  "update()")));
  scaler.step(*training.optimizer);
  EXPECT_THAT([&] { scaler.unscale_(*training.optimizer); },
              ::testing::ThrowsMessage<UsageError>(HasSubstr(
                  "unscale_: called after step() on this optimizer")));
  EXPECT_THAT([&] { scaler.step(*training.optimizer); },
              ::testing::ThrowsMessage<UsageError>(
                  HasSubstr("step: already called on this optimizer")));
  scaler.update();

  EXPECT_THAT(
      [] {
        GradScaler(Options([](GradScalerOptions& o) { o.init_scale = 1e39; }));
      },
      ::testing::ThrowsMessage<UsageError>(HasSubstr(
          "GradScaler: the scale must be a positive finite float32")));
  for (auto change : {+[](GradScalerOptions& o) { o.init_scale = 0; },
                      +[](GradScalerOptions& o) { o.growth_factor = 1; },
                      +[](GradScalerOptions& o) { o.backoff_factor = 1; },
                      +[](GradScalerOptions& o) { o.growth_interval = 0; }}) {
    EXPECT_THROW(GradScaler(Options(change)), UsageError);
  }
  EXPECT_THROW(scaler.scale(torch::Tensor()), UsageError);
}

TEST(GradScalerTest, DisabledPassesEverythingThrough) {
  Training plain, passed;
  GradScaler scaler(Options([](GradScalerOptions& o) { o.enabled = false; }));
  EXPECT_FALSE(scaler.is_enabled());
  EXPECT_EQ(scaler.get_scale(), 1.0);
  plain.Loss(0).backward();
  plain.optimizer->step();
  const torch::Tensor loss = passed.Loss(0);
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  scaler.unscale_(*passed.optimizer);
  EXPECT_TRUE(scaler.step(*passed.optimizer));
  scaler.update();
  ExpectSameTensors(passed.Parameters(), plain.Parameters());
}

std::string Save(const GradScaler& scaler) { return SaveStateToBytes(scaler); }

void Load(GradScaler& scaler, const std::string& bytes) {
  LoadStateFromBytes(scaler, bytes);
}

TEST(GradScalerTest, SaveLoadRoundTrip) {
  Training training;
  GradScaler scaler(Options([](GradScalerOptions& o) {
    o.init_scale = 1024;
    o.growth_factor = 4;
    o.backoff_factor = 0.25;
    o.growth_interval = 5;
  }));
  for (int step = 0; step < 3; ++step) {
    training.optimizer->zero_grad();
    scaler.scale(training.Loss(step)).backward();
    if (step == 0) training.model->bias.mutable_grad()[1] = kInf;
    scaler.step(*training.optimizer);
    scaler.update();
  }
  ASSERT_EQ(scaler.get_scale(), 256.0);
  ASSERT_EQ(scaler.growth_tracker(), 2);

  GradScaler restored;
  Load(restored, Save(scaler));
  EXPECT_EQ(restored.get_scale(), 256.0);
  EXPECT_EQ(restored.growth_tracker(), 2);
  EXPECT_EQ(restored.options().growth_factor, 4);
  EXPECT_EQ(restored.options().backoff_factor, 0.25);
  EXPECT_EQ(restored.options().growth_interval, 5);

  // Both now behave the same: three more clean steps grow by 4.
  for (GradScaler* s : {&scaler, &restored}) {
    for (int step = 0; step < 3; ++step) {
      training.optimizer->zero_grad();
      s->scale(training.Loss(step)).backward();
      s->step(*training.optimizer);
      s->update();
    }
    EXPECT_EQ(s->get_scale(), 1024.0);
    EXPECT_EQ(s->growth_tracker(), 0);
  }
}

TEST(GradScalerTest, LoadRejectsWhatItCannotRestore) {
  GradScaler disabled(Options([](GradScalerOptions& o) { o.enabled = false; }));
  GradScaler enabled;
  EXPECT_THAT([&] { Load(enabled, Save(disabled)); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("saved by a disabled scaler")));
  // A disabled scaler ignores any state, as torch's does.
  EXPECT_NO_THROW(Load(disabled, Save(enabled)));

  EXPECT_THAT([&] { Load(enabled, "not an archive"); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("not a LibTorch archive")));

  torch::serialize::OutputArchive empty;
  std::ostringstream bytes;
  empty.save_to(bytes);
  EXPECT_THAT([&] { Load(enabled, bytes.str()); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("GradScaler state has no 'enabled'")));

  torch::serialize::OutputArchive bad;
  bad.write("enabled", c10::IValue(true));
  bad.write("scale", c10::IValue(-1.0));
  bad.write("growth_tracker", c10::IValue(int64_t{0}));
  bad.write("growth_factor", c10::IValue(2.0));
  bad.write("backoff_factor", c10::IValue(0.5));
  bad.write("growth_interval", c10::IValue(int64_t{10}));
  std::ostringstream bad_bytes;
  bad.save_to(bad_bytes);
  EXPECT_THAT(
      [&] { Load(enabled, bad_bytes.str()); },
      ::testing::ThrowsMessage<CheckpointError>(HasSubstr(
          "GradScaler state is invalid: the scale must be a positive")));
  EXPECT_EQ(enabled.get_scale(), 65536.0);
}

}  // namespace
}  // namespace accel
