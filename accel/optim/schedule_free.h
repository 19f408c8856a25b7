// Schedule-free AdamW (Defazio et al., "The Road Less Scheduled", 2024), the
// optimizer of Accelerate's by_feature/schedule_free.py (the `schedulefree`
// package's AdamWScheduleFree), for LibTorch, which has none: no learning
// rate schedule, a linear warmup at most, and two iterates: the model's
// parameters hold y (where gradients are taken) while training and x (the
// average that is evaluated) after eval().
//
//   accel::AdamWScheduleFree adamw(net->parameters(),
//                                  accel::AdamWScheduleFreeOptions(3e-3)
//                                      .warmup_steps(10));
//   auto [model, optimizer] = accelerator.prepare(net, adamw);
//   adamw.train();                 // Before training steps (it starts in
//   ... backward, optimizer.step()  // eval mode, as the package's does).
//   adamw.eval();                  // Before evaluating or saving weights.
//
// Per step k (from 0), for each group: lr_k = lr * min(1, (k + 1) /
// warmup_steps); lr_max = max(lr_max, lr_k); weight = (k + 1)^r *
// lr_max^weight_lr_power; c = weight / (sum of weights so far); and per
// parameter, with v the second moment, d = g / (sqrt(v / (1 - beta2^(k+1)))
// + eps) + weight_decay * y:
//   y <- (1 - c) y + c z + lr_k (beta1 (1 - c) - 1) d,   z <- z - lr_k d.
// eval() sets y to x = (y - (1 - beta1) z) / beta1, train() back.
//
// Its state (z, v, and each group's k, lr_max, weight sum and mode) is in
// the optimizer's archive, so save_state and load_state carry it. Not for
// --zero_stage >= 1, where the optimizer holds only this rank's shard.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <utility>
#include <vector>

namespace accel {

struct AdamWScheduleFreeOptions
    : public torch::optim::OptimizerCloneableOptions<AdamWScheduleFreeOptions> {
  explicit AdamWScheduleFreeOptions(double lr = 0.0025) : lr_(lr) {}
  TORCH_ARG(double, lr);
  TORCH_ARG(double, beta1) = 0.9;
  TORCH_ARG(double, beta2) = 0.999;
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(int64_t, warmup_steps) = 0;
  TORCH_ARG(double, r) = 0;
  TORCH_ARG(double, weight_lr_power) = 2;
  // The group's progress, kept with its options as the package keeps it.
  TORCH_ARG(int64_t, k) = 0;
  TORCH_ARG(double, lr_max) = -1;
  TORCH_ARG(double, weight_sum) = 0;
  TORCH_ARG(bool, train_mode) = false;

 public:  // TORCH_ARG leaves its members private.
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct AdamWScheduleFreeParamState
    : public torch::optim::OptimizerCloneableParamState<
          AdamWScheduleFreeParamState> {
  TORCH_ARG(torch::Tensor, z);
  TORCH_ARG(torch::Tensor, exp_avg_sq);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

class AdamWScheduleFree : public torch::optim::Optimizer {
 public:
  explicit AdamWScheduleFree(
      std::vector<torch::optim::OptimizerParamGroup> param_groups,
      AdamWScheduleFreeOptions defaults = AdamWScheduleFreeOptions());
  explicit AdamWScheduleFree(
      std::vector<torch::Tensor> params,
      AdamWScheduleFreeOptions defaults = AdamWScheduleFreeOptions())
      : AdamWScheduleFree(
            {torch::optim::OptimizerParamGroup(std::move(params))},
            std::move(defaults)) {}

  // A UsageError unless train() was called last (not eval()).
  torch::Tensor step(LossClosure closure = nullptr) override;
  // The parameters become y, where training steps take gradients.
  void train();
  // The parameters become x, the average to evaluate and save.
  void eval();

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  void SwitchMode(bool train);
};

}  // namespace accel
