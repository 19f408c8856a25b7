// torch.optim.lr_scheduler.ReduceLROnPlateau: multiplies every group's lr
// by `factor` once a metric has stopped improving for `patience`
// evaluations. It steps with the metric, once per evaluation (not per
// optimizer step).
//
//   torch::optim::SGD optimizer(model->parameters(),
//                               torch::optim::SGDOptions(0.1));
//   accel::ReduceLROnPlateauOptions options;
//   options.patience = 2;
//   auto plateau = accelerator.prepare(
//       std::make_unique<accel::ReduceLROnPlateau>(optimizer, options));
//   for (int epoch = 0; epoch < epochs; ++epoch) {
//     ... train ...
//     plateau.step(validation_loss);  // the same decision on every rank
//   }
//
// Prepared, step(metric) first agrees the metric across the processes: the
// same value everywhere is used as it is, different ones (each rank's own
// validation loss) are averaged, summed in rank order so every rank gets
// the same bits; every rank then reduces its lrs at the same evaluation.
// It steps once per call, whatever the number of processes (Accelerate's
// AcceleratedScheduler steps a plateau scheduler num_processes times per
// call, which spends N of its patience per evaluation), and also on calls
// where gradients were not synchronized, since it counts evaluations.
//
// The decisions are torch's, with its defaults: the metric is better than
// the best so far when below best * (1 - threshold) (mode "min",
// threshold_mode "rel"; "abs": best - threshold; mode "max" the other way);
// a metric that is not better (NaN included) is a bad evaluation; after more
// than `patience` bad ones in a row each lr becomes max(lr * factor, min_lr)
// (unless it would change by eps or less) and `cooldown` evaluations are
// not counted. Plain step() without a metric is a UsageError. save() stores
// the counters and every option, which load() restores, as torch's
// load_state_dict.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accel/optim/scheduler.h"

namespace accel {

struct ReduceLROnPlateauOptions {
  std::string mode = "min";            // "min" (a loss) or "max" (an accuracy).
  double factor = 0.1;                 // < 1.
  int64_t patience = 10;               // Bad evaluations tolerated in a row.
  double threshold = 1e-4;             // How much better counts as better.
  std::string threshold_mode = "rel";  // "rel" or "abs".
  int64_t cooldown = 0;                // Evaluations ignored after a reduction.
  // The lowest lr, for every group, or one per group (then it has as many
  // as the optimizer has groups).
  std::vector<double> min_lr = {0.0};
  double eps = 1e-8;  // Smaller changes of an lr are not made.
};

class ReduceLROnPlateau : public LRScheduler {
 public:
  // UsageError for an unknown mode or threshold_mode, factor >= 1 or
  // negative, negative patience or cooldown, a min_lr count other than 1
  // or the optimizer's group count, or a value that is not finite.
  explicit ReduceLROnPlateau(torch::optim::Optimizer& optimizer,
                             ReduceLROnPlateauOptions options = {});

  // One evaluation of the metric; last_epoch() counts them.
  void step(double metric);
  // The best metric so far (+inf under "min" before the first step).
  double best() const { return best_; }
  int64_t num_bad_epochs() const { return num_bad_epochs_; }
  bool in_cooldown() const { return cooldown_counter_ > 0; }
  const ReduceLROnPlateauOptions& options() const { return options_; }

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  // The lrs the pending step(metric) decided; UsageError without one.
  std::vector<double> ComputeLearningRates(int64_t step) const override;
  const char* name() const override { return "ReduceLROnPlateau"; }

 private:
  bool IsBetter(double metric) const;
  std::vector<double> ReducedLearningRates() const;

  ReduceLROnPlateauOptions options_;
  double best_;
  int64_t num_bad_epochs_ = 0;
  int64_t cooldown_counter_ = 0;
  // Set by step(metric) for the LRScheduler step it makes.
  std::optional<std::vector<double>> decided_lrs_;
};

// Checks `options` as the constructor does, for `groups` param groups.
void CheckReduceLROnPlateauOptions(const ReduceLROnPlateauOptions& options,
                                   size_t groups);

}  // namespace accel
