// FusedAdamW, FusedAdam and FusedSGD against LibTorch's AdamW, Adam and SGD
// stepping copies of the same parameters with the same gradients: the same
// parameters and state, bit for bit (tolerance 0 ulp), after 25 steps, on
// sizes that leave tails of the vector loops and chunks of at::parallel_for,
// in float32 and float64, at 1 and 2 threads, with weight decay, a learning
// rate a scheduler changes between steps and a parameter without a
// gradient; what the loop leaves to LibTorch; the version counter; and the
// state through torch::save between the fused and LibTorch's optimizers.
// :fused_optimizers_default_test runs the same with ATEN_CPU_CAPABILITY=
// default (ATen's kernels without FMA, and the loop's form without it).
// DDP and ZeRO stages 1-3 with them: //tests:fused_optimizers_test.
#include "accel/optim/fused_optimizers.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "accel/core/libtorch_compat.h"
#include "accel/optim/param_state_codec.h"
#include "accel/optim/scheduler.h"

namespace accel {
namespace {

constexpr int kSteps = 25;
// 1 and 7: shorter than a vector; 4099: a vector loop's tail; 70001: more
// than two of at::parallel_for's 32768-element chunks, so that two threads
// split it at an odd element. The 3 x 5 matrix is a 2-D parameter.
const std::vector<std::vector<int64_t>> kShapes = {
    {1}, {7}, {3, 5}, {4099}, {70001}};

// Parameters of kShapes (and, with `frozen`, one more that never gets a
// gradient), the same values for the same seed.
std::vector<torch::Tensor> MakeParams(torch::Dtype dtype, bool frozen) {
  torch::manual_seed(7);
  std::vector<torch::Tensor> params;
  for (const auto& shape : kShapes) {
    params.push_back(torch::randn(shape, dtype).requires_grad_());
  }
  if (frozen) params.push_back(torch::randn({9}, dtype).requires_grad_());
  return params;
}

std::vector<torch::Tensor> Clones(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> clones;
  for (const auto& p : params) {
    clones.push_back(p.detach().clone().requires_grad_());
  }
  return clones;
}

// Gives the first kShapes.size() parameters of each list the same random
// gradient (step `step`'s); any further parameter gets none.
void SetGrads(int step, std::vector<std::vector<torch::Tensor>*> lists) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(100 + step);
  const auto& first = *lists.front();
  for (size_t i = 0; i < kShapes.size(); ++i) {
    const torch::Tensor grad =
        torch::randn(first[i].sizes(), generator, first[i].scalar_type());
    for (auto* params : lists) (*params)[i].mutable_grad() = grad.clone();
  }
}

// Whether two lists of tensors are equal, bit for bit, saying where not.
::testing::AssertionResult BitEqual(const std::vector<torch::Tensor>& a,
                                    const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << a.size() << " vs " << b.size();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() != b[i].defined()) {
      return ::testing::AssertionFailure()
             << "tensor " << i << " defined " << a[i].defined() << " vs "
             << b[i].defined();
    }
    if (!a[i].defined()) continue;
    if (a[i].scalar_type() != b[i].scalar_type() || !torch::equal(a[i], b[i])) {
      const torch::Tensor differ = a[i].ne(b[i]);
      return ::testing::AssertionFailure()
             << "tensor " << i << " (" << a[i].numel()
             << " elements): " << differ.sum().item<int64_t>()
             << " differ, max |difference| "
             << (a[i] - b[i]).abs().max().item<double>();
    }
  }
  return ::testing::AssertionSuccess();
}

// Each parameter's state tensors (and step, as a tensor), in parameter
// order; undefined where a parameter has no state.
std::vector<torch::Tensor> StateOf(const torch::optim::Optimizer& optimizer,
                                   const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    const auto found = optimizer.state().find(compat::StateKey(p));
    if (found == optimizer.state().end()) {
      out.insert(out.end(), 3, torch::Tensor());
      continue;
    }
    const std::optional<ParamStateValues> values =
        ReadParamState(*found->second);
    EXPECT_TRUE(values.has_value());
    for (const char* key : {"exp_avg", "exp_avg_sq", "momentum_buffer"}) {
      const auto tensor = values->tensors.find(key);
      if (tensor != values->tensors.end()) out.push_back(tensor->second);
    }
    const auto step = values->counts.find("step");
    if (step != values->counts.end())
      out.push_back(torch::tensor(step->second));
  }
  return out;
}

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(
    std::vector<torch::Tensor>)>;

// Steps LibTorch's optimizer and the fused one kSteps times over copies of
// the same parameters and gradients, each under a StepLR that halves the
// lr every 3 steps, and expects the same parameters and state after every
// step.
void ExpectSameSteps(const MakeOptimizer& make_reference,
                     const MakeOptimizer& make_fused, torch::Dtype dtype,
                     int threads) {
  SCOPED_TRACE(::testing::Message()
               << "dtype " << dtype << ", " << threads << " thread(s)");
  at::set_num_threads(threads);
  std::vector<torch::Tensor> reference_params =
      MakeParams(dtype, /*frozen=*/true);
  std::vector<torch::Tensor> fused_params = Clones(reference_params);
  const torch::Tensor frozen_before = fused_params.back().detach().clone();
  auto reference = make_reference(reference_params);
  auto fused = make_fused(fused_params);
  StepLR reference_lr(*reference, /*step_size=*/3, /*gamma=*/0.5);
  StepLR fused_lr(*fused, /*step_size=*/3, /*gamma=*/0.5);
  const fused_internal::StepCounts before = fused_internal::CountedSteps();
  for (int step = 0; step < kSteps; ++step) {
    SetGrads(step, {&reference_params, &fused_params});
    reference->step();
    fused->step();
    ASSERT_TRUE(BitEqual(fused_params, reference_params)) << "step " << step;
    ASSERT_TRUE(BitEqual(StateOf(*fused, fused_params),
                         StateOf(*reference, reference_params)))
        << "step " << step;
    reference_lr.step();
    fused_lr.step();
  }
  // The loop stepped each parameter with a gradient, LibTorch's none.
  const fused_internal::StepCounts after = fused_internal::CountedSteps();
  EXPECT_EQ(after.fused - before.fused,
            kSteps * static_cast<int64_t>(kShapes.size()));
  EXPECT_EQ(after.unfused, before.unfused);
  // The comparison is not vacuous: the parameters moved, the lr changed,
  // and the one without a gradient neither moved nor got state.
  EXPECT_FALSE(torch::equal(fused_params[3], MakeParams(dtype, true)[3]));
  EXPECT_LT(fused->param_groups()[0].options().get_lr(), 1e-3);
  EXPECT_TRUE(torch::equal(fused_params.back(), frozen_before));
  EXPECT_EQ(fused->state().count(compat::StateKey(fused_params.back())), 0u);
}

template <typename Optimizer, typename Options>
MakeOptimizer Maker(Options options) {
  return [options](std::vector<torch::Tensor> params) {
    return std::make_unique<Optimizer>(std::move(params), options);
  };
}

// Every dtype and thread count.
template <typename Reference, typename Fused, typename Options>
void ExpectSameStepsEverywhere(const Options& options) {
  for (torch::Dtype dtype : {torch::kFloat32, torch::kFloat64}) {
    for (int threads : {1, 2}) {
      ExpectSameSteps(Maker<Reference>(options), Maker<Fused>(options), dtype,
                      threads);
    }
  }
}

TEST(FusedOptimizersTest, UsesFmaWhereAtenDoes) {
  const char* capability = std::getenv("ATEN_CPU_CAPABILITY");
  if (capability != nullptr && std::strcmp(capability, "default") == 0) {
    EXPECT_FALSE(fused_internal::UsesFma());
  } else {
    EXPECT_EQ(fused_internal::UsesFma(),
              __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
  }
}

TEST(FusedOptimizersTest, AdamWStepsAsLibTorchDoes) {
  ExpectSameStepsEverywhere<torch::optim::AdamW, FusedAdamW>(
      torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  ExpectSameStepsEverywhere<torch::optim::AdamW, FusedAdamW>(
      torch::optim::AdamWOptions(3e-3)
          .betas({0.8, 0.95})
          .eps(1e-6)
          .weight_decay(0));
}

TEST(FusedOptimizersTest, AdamStepsAsLibTorchDoes) {
  ExpectSameStepsEverywhere<torch::optim::Adam, FusedAdam>(
      torch::optim::AdamOptions(1e-2).weight_decay(0.1));
  ExpectSameStepsEverywhere<torch::optim::Adam, FusedAdam>(
      torch::optim::AdamOptions(1e-2));
}

TEST(FusedOptimizersTest, SgdStepsAsLibTorchDoes) {
  using torch::optim::SGDOptions;
  for (const SGDOptions& options :
       {SGDOptions(0.1), SGDOptions(0.1).weight_decay(0.01),
        SGDOptions(0.1).momentum(0.9),
        SGDOptions(0.1).momentum(0.9).dampening(0.25).weight_decay(0.01),
        SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01)}) {
    ExpectSameStepsEverywhere<torch::optim::SGD, FusedSGD>(options);
  }
}

// amsgrad, a bfloat16 parameter and a non-contiguous one go to LibTorch's
// step; the float32 parameters beside them are fused; all come out as
// LibTorch's, and every gradient is back in place after the step.
TEST(FusedOptimizersTest, WhatItCannotFuseLibTorchSteps) {
  auto make_params = [] {
    torch::manual_seed(3);
    return std::vector<torch::Tensor>{
        torch::randn({4099}).requires_grad_(),
        torch::randn({33}).to(torch::kBFloat16).requires_grad_(),
        torch::randn({6, 5}).t().requires_grad_(),  // Non-contiguous.
        torch::randn({70}).requires_grad_()};       // In the amsgrad group.
  };
  std::vector<torch::Tensor> reference_params = make_params();
  std::vector<torch::Tensor> fused_params = make_params();
  auto groups = [](const std::vector<torch::Tensor>& params) {
    return std::vector<torch::optim::OptimizerParamGroup>{
        torch::optim::OptimizerParamGroup({params[0], params[1], params[2]}),
        torch::optim::OptimizerParamGroup(
            {params[3]}, std::make_unique<torch::optim::AdamWOptions>(
                             torch::optim::AdamWOptions(1e-2).amsgrad(true)))};
  };
  const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  torch::optim::AdamW reference(groups(reference_params), options);
  FusedAdamW fused(groups(fused_params), options);
  const fused_internal::StepCounts before = fused_internal::CountedSteps();
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < fused_params.size(); ++i) {
      const torch::Tensor grad = torch::randn_like(fused_params[i]);
      reference_params[i].mutable_grad() = grad.clone();
      fused_params[i].mutable_grad() = grad.clone();
    }
    std::vector<torch::Tensor> grads;
    for (const auto& p : fused_params) grads.push_back(p.grad());
    reference.step();
    fused.step();
    for (size_t i = 0; i < fused_params.size(); ++i) {
      EXPECT_TRUE(fused_params[i].grad().is_same(grads[i])) << i;
    }
    ASSERT_TRUE(BitEqual(fused_params, reference_params)) << "step " << step;
  }
  const fused_internal::StepCounts after = fused_internal::CountedSteps();
  EXPECT_EQ(after.fused - before.fused, 5);
  EXPECT_EQ(after.unfused - before.unfused, 3 * 5);
  const auto& amsgrad = static_cast<const torch::optim::AdamWParamState&>(
      *fused.state().at(compat::StateKey(fused_params[3])));
  EXPECT_TRUE(amsgrad.max_exp_avg_sq().defined());
}

TEST(FusedOptimizersTest, SgdLeavesASparseGradientToLibTorch) {
  torch::Tensor reference = torch::zeros({5, 3}).requires_grad_();
  torch::Tensor fused = torch::zeros({5, 3}).requires_grad_();
  const torch::Tensor grad = torch::sparse_coo_tensor(
      torch::tensor({{1, 3}}), torch::ones({2, 3}), {5, 3});
  reference.mutable_grad() = grad.clone();
  fused.mutable_grad() = grad.clone();
  torch::optim::SGD(std::vector<torch::Tensor>{reference},
                    torch::optim::SGDOptions(0.5))
      .step();
  FusedSGD(std::vector<torch::Tensor>{fused}, torch::optim::SGDOptions(0.5))
      .step();
  EXPECT_TRUE(torch::equal(fused, reference));
  EXPECT_EQ(fused.sum().item<float>(), -3.0f);
}

TEST(FusedOptimizersTest, StepCountsAsAnInPlaceChangeForAutograd) {
  torch::Tensor p = torch::randn({100}).requires_grad_();
  FusedAdamW adamw(std::vector<torch::Tensor>{p});
  torch::Tensor loss = (p * p).sum();  // Saves p for backward.
  p.mutable_grad() = torch::ones_like(p);
  const int64_t version = p._version();
  adamw.step();
  EXPECT_GT(p._version(), version);
  EXPECT_THROW(loss.backward(), c10::Error);
}

TEST(FusedOptimizersTest, StepRunsTheClosureWithGradientsOnce) {
  torch::Tensor p = torch::ones({10}).requires_grad_();
  FusedSGD sgd(std::vector<torch::Tensor>{p}, torch::optim::SGDOptions(0.1));
  int calls = 0;
  const torch::Tensor loss = sgd.step([&] {
    ++calls;
    sgd.zero_grad();
    torch::Tensor l = (p * p).sum();
    l.backward();
    return l;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(loss.item<float>(), 10.0f);
  EXPECT_TRUE(torch::allclose(p, torch::full({10}, 0.8f)));
}

TEST(FusedOptimizersTest, ShardedCheckpointsKnowTheirState) {
  torch::Tensor p = torch::randn({10}).requires_grad_();
  FusedAdam adam(std::vector<torch::Tensor>{p});
  EXPECT_TRUE(KnowsParamState(adam));
  p.mutable_grad() = torch::ones_like(p);
  adam.step();
  const auto values = ReadParamState(*adam.state().at(compat::StateKey(p)));
  ASSERT_TRUE(values.has_value());
  EXPECT_EQ(values->counts.at("step"), 1);
  EXPECT_EQ(values->tensors.count("exp_avg"), 1u);
  EXPECT_NE(dynamic_cast<torch::optim::AdamParamState*>(
                MakeParamState(adam, *values, "p").get()),
            nullptr);
}

// Saves `from` after 3 steps, loads it into `to` (over fresh copies of
// the parameters as they were then), and expects both to step on alike.
template <typename From, typename To>
void ExpectStateTravels() {
  SCOPED_TRACE(typeid(From).name());
  std::vector<torch::Tensor> from_params = MakeParams(torch::kFloat32, false);
  const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  From from(from_params, options);
  for (int step = 0; step < 3; ++step) {
    SetGrads(step, {&from_params});
    from.step();
  }
  std::stringstream archive;
  torch::save(from, archive);
  std::vector<torch::Tensor> to_params = Clones(from_params);
  To to(to_params, options);
  torch::load(to, archive);
  ASSERT_TRUE(BitEqual(StateOf(to, to_params), StateOf(from, from_params)));
  for (int step = 3; step < 8; ++step) {
    SetGrads(step, {&from_params, &to_params});
    from.step();
    to.step();
  }
  EXPECT_TRUE(BitEqual(to_params, from_params));
  EXPECT_TRUE(BitEqual(StateOf(to, to_params), StateOf(from, from_params)));
}

TEST(FusedOptimizersTest, StateTravelsThroughTorchSaveBothWays) {
  ExpectStateTravels<FusedAdamW, torch::optim::AdamW>();
  ExpectStateTravels<torch::optim::AdamW, FusedAdamW>();
}

}  // namespace
}  // namespace accel
