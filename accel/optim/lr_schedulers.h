// torch.optim.lr_scheduler's chainable schedules that LibTorch 1.13 lacks,
// to the last bit of torch's values: ExponentialLR, MultiStepLR,
// CosineAnnealingLR and CosineAnnealingWarmRestarts (OneCycleLR, StepLR and
// LambdaLR are in scheduler.h, ReduceLROnPlateau in reduce_lr_on_plateau.h).
//
//   torch::optim::SGD optimizer(model->parameters(),
//                               torch::optim::SGDOptions(1.0));
//   auto scheduler = accelerator.prepare(
//       std::make_unique<accel::CosineAnnealingLR>(optimizer, /*t_max=*/4));
//   for (auto& batch : loader) {
//     ... forward, backward, optimizer.step() ...
//     scheduler.step();
//   }
//
// The lr after 0, 1, 2, ... steps (base lr 1.0):
//
//   accel::ExponentialLR(optimizer, /*gamma=*/0.5);     // 1, .5, .25, ...
//   accel::MultiStepLR(optimizer, {2, 4}, /*gamma=*/0.1);
//   // 1, 1, .1, .1, .01, .01 (a milestone listed twice multiplies twice)
//   accel::CosineAnnealingLR(optimizer, /*t_max=*/4);
//   // 1, .854, .5, .146, 0, .146, .5, ... (up again after t_max, as torch)
//   accel::CosineAnnealingWarmRestarts(optimizer, /*t_0=*/2, /*t_mult=*/2);
//   // 1, .5, 1, .854, .5, .146, 1, ... (periods 2, 4, 8, ...)
//
// Like torch's, ExponentialLR, MultiStepLR and CosineAnnealingLR compute
// each lr from the group's current one (the chained form, which is why the
// bits match torch's and not its closed form), so a manual change of a
// group's lr between steps carries on; CosineAnnealingWarmRestarts
// recomputes it from the base lr. save() also stores the schedule's own
// arguments, which load() restores, as torch's load_state_dict does.
//
// Differences from torch: CosineAnnealingWarmRestarts steps by whole steps
// only (torch's step(epoch + i / iters) with a fractional epoch is not
// offered: step once per optimizer step with t_0 counted in steps instead);
// bad arguments are UsageErrors naming the schedule and the argument.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <vector>

#include "accel/optim/scheduler.h"

namespace accel {

// lr *= gamma every step, torch.optim.lr_scheduler.ExponentialLR.
class ExponentialLR : public LRScheduler {
 public:
  // UsageError unless gamma is finite and >= 0.
  ExponentialLR(torch::optim::Optimizer& optimizer, double gamma);
  double gamma() const { return gamma_; }

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  std::vector<double> ComputeLearningRates(int64_t step) const override;
  const char* name() const override { return "ExponentialLR"; }

 private:
  double gamma_;
};

// lr *= gamma at each milestone step (once per time it is listed),
// torch.optim.lr_scheduler.MultiStepLR.
class MultiStepLR : public LRScheduler {
 public:
  // UsageError for a negative milestone or a gamma that is not finite and
  // >= 0. The milestones need not be sorted (torch counts them).
  MultiStepLR(torch::optim::Optimizer& optimizer,
              std::vector<int64_t> milestones, double gamma = 0.1);
  // Sorted, a milestone listed twice appearing twice.
  const std::vector<int64_t>& milestones() const { return milestones_; }
  double gamma() const { return gamma_; }

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  std::vector<double> ComputeLearningRates(int64_t step) const override;
  const char* name() const override { return "MultiStepLR"; }

 private:
  std::vector<int64_t> milestones_;
  double gamma_;
};

// Cosine from the base lr down to eta_min over t_max steps (and back up
// over the next t_max, as torch's, if stepped further),
// torch.optim.lr_scheduler.CosineAnnealingLR.
class CosineAnnealingLR : public LRScheduler {
 public:
  // UsageError unless t_max > 0 and eta_min is finite.
  CosineAnnealingLR(torch::optim::Optimizer& optimizer, int64_t t_max,
                    double eta_min = 0);
  int64_t t_max() const { return t_max_; }
  double eta_min() const { return eta_min_; }

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  std::vector<double> ComputeLearningRates(int64_t step) const override;
  const char* name() const override { return "CosineAnnealingLR"; }

 private:
  int64_t t_max_;
  double eta_min_;
};

// Cosine from the base lr to eta_min over t_0 steps, then again from the
// base lr over t_0 * t_mult steps, and so on (SGDR),
// torch.optim.lr_scheduler.CosineAnnealingWarmRestarts.
class CosineAnnealingWarmRestarts : public LRScheduler {
 public:
  // UsageError unless t_0 > 0, t_mult >= 1 and eta_min is finite.
  CosineAnnealingWarmRestarts(torch::optim::Optimizer& optimizer, int64_t t_0,
                              int64_t t_mult = 1, double eta_min = 0);
  int64_t t_0() const { return t_0_; }
  int64_t t_mult() const { return t_mult_; }
  double eta_min() const { return eta_min_; }

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  std::vector<double> ComputeLearningRates(int64_t step) const override;
  const char* name() const override { return "CosineAnnealingWarmRestarts"; }

 private:
  int64_t t_0_;
  int64_t t_mult_;
  double eta_min_;
};

}  // namespace accel
