#include "accel/optim/schedule_free.h"

#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "accel/core/libtorch_compat.h"
#include "accel/runtime/base/errors.h"

namespace accel {

void AdamWScheduleFreeOptions::serialize(
    torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(beta1);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(beta2);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(warmup_steps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(r);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_lr_power);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(k);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr_max);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_sum);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(train_mode);
}

void AdamWScheduleFreeOptions::serialize(
    torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, beta1);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, beta2);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, warmup_steps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, r);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_lr_power);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, k);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr_max);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_sum);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, train_mode);
}

void AdamWScheduleFreeParamState::serialize(
    torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(z);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
}

void AdamWScheduleFreeParamState::serialize(
    torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, z);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
}

namespace {

void Require(bool ok, const std::string& what) {
  if (!ok) throw UsageError("AdamWScheduleFree: " + what);
}

}  // namespace

AdamWScheduleFree::AdamWScheduleFree(
    std::vector<torch::optim::OptimizerParamGroup> param_groups,
    AdamWScheduleFreeOptions defaults)
    : Optimizer(std::move(param_groups),
                std::make_unique<AdamWScheduleFreeOptions>(defaults)) {
  Require(defaults.lr() >= 0,
          "lr must not be negative, found " + std::to_string(defaults.lr()));
  Require(defaults.beta1() > 0 && defaults.beta1() < 1,
          "beta1 must be in (0, 1), found " + std::to_string(defaults.beta1()));
  Require(defaults.beta2() >= 0 && defaults.beta2() < 1,
          "beta2 must be in [0, 1), found " + std::to_string(defaults.beta2()));
  Require(defaults.eps() >= 0, "eps must not be negative");
  Require(defaults.weight_decay() >= 0, "weight_decay must not be negative");
  Require(defaults.warmup_steps() >= 0, "warmup_steps must not be negative");
}

void AdamWScheduleFree::train() { SwitchMode(true); }
void AdamWScheduleFree::eval() { SwitchMode(false); }

void AdamWScheduleFree::SwitchMode(bool train) {
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    auto& options = static_cast<AdamWScheduleFreeOptions&>(group.options());
    if (options.train_mode() == train) continue;
    // To train: x -> y = (1 - beta1) z + beta1 x; to evaluate: back, x =
    // (y - (1 - beta1) z) / beta1. Both are a lerp toward z.
    const double weight = train ? 1 - options.beta1() : 1 - 1 / options.beta1();
    for (auto& p : group.params()) {
      auto found = state().find(compat::StateKey(p));
      if (found == state().end()) continue;
      p.lerp_(static_cast<AdamWScheduleFreeParamState&>(*found->second).z(),
              weight);
    }
    options.train_mode(train);
  }
}

torch::Tensor AdamWScheduleFree::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = {};
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    auto& options = static_cast<AdamWScheduleFreeOptions&>(group.options());
    Require(options.train_mode(),
            "step() in eval mode: call train() before training steps and "
            "eval() before evaluating");
    const int64_t k = options.k();
    const double sched =
        k < options.warmup_steps()
            ? static_cast<double>(k + 1) / options.warmup_steps()
            : 1.0;
    const double bias_correction2 =
        1 - std::pow(options.beta2(), static_cast<double>(k + 1));
    const double lr = options.lr() * sched;
    options.lr_max(std::max(lr, options.lr_max()));
    const double weight = std::pow(static_cast<double>(k + 1), options.r()) *
                          std::pow(options.lr_max(), options.weight_lr_power());
    options.weight_sum(options.weight_sum() + weight);
    const double ckp1 =
        options.weight_sum() == 0 ? 0 : weight / options.weight_sum();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto key = compat::StateKey(p);
      auto found = state().find(key);
      if (found == state().end()) {
        auto fresh = std::make_unique<AdamWScheduleFreeParamState>();
        fresh->z(p.detach().clone());
        fresh->exp_avg_sq(torch::zeros_like(p));
        found = state().emplace(key, std::move(fresh)).first;
      }
      auto& s = static_cast<AdamWScheduleFreeParamState&>(*found->second);
      const torch::Tensor grad = p.grad();
      s.exp_avg_sq()
          .mul_(options.beta2())
          .addcmul_(grad, grad, 1 - options.beta2());
      const torch::Tensor denom =
          s.exp_avg_sq().div(bias_correction2).sqrt_().add_(options.eps());
      torch::Tensor normalized = grad.div(denom);
      if (options.weight_decay() != 0) {
        normalized.add_(p, options.weight_decay());
      }
      p.lerp_(s.z(), ckp1);
      p.add_(normalized, lr * (options.beta1() * (1 - ckp1) - 1));
      s.z().sub_(normalized, lr);
    }
    options.k(k + 1);
  }
  return loss;
}

// LibTorch 1.13's optimizer archive restores each parameter's state but not
// its groups' options, where the progress of each group lives: it travels
// beside them, four numbers a group.
constexpr const char* kProgressKey = "schedule_free_progress";

void AdamWScheduleFree::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<AdamWScheduleFreeParamState,
                          AdamWScheduleFreeOptions>(archive, *this);
  std::vector<double> progress;
  for (const auto& group : param_groups()) {
    const auto& options =
        static_cast<const AdamWScheduleFreeOptions&>(group.options());
    progress.insert(progress.end(),
                    {static_cast<double>(options.k()), options.lr_max(),
                     options.weight_sum(), options.train_mode() ? 1.0 : 0.0});
  }
  archive.write(kProgressKey, torch::tensor(progress, torch::kDouble));
}

void AdamWScheduleFree::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<AdamWScheduleFreeParamState,
                          AdamWScheduleFreeOptions>(archive, *this);
  torch::Tensor progress;
  archive.read(kProgressKey, progress);
  Require(progress.numel() == static_cast<int64_t>(4 * param_groups().size()),
          "the archive holds " + std::to_string(progress.numel() / 4) +
              " parameter groups' progress, this optimizer has " +
              std::to_string(param_groups().size()));
  const auto values = progress.accessor<double, 1>();
  for (size_t g = 0; g < param_groups().size(); ++g) {
    auto& options =
        static_cast<AdamWScheduleFreeOptions&>(param_groups()[g].options());
    options.k(static_cast<int64_t>(values[4 * g]));
    options.lr_max(values[4 * g + 1]);
    options.weight_sum(values[4 * g + 2]);
    options.train_mode(values[4 * g + 3] != 0);
  }
}

}  // namespace accel
