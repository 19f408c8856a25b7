// Learning-rate schedules with PyTorch's LRScheduler semantics and the
// schedules of transformers.optimization, which LibTorch 1.13 lacks.
//
//   torch::optim::AdamW optimizer(model->parameters(),
//                                 torch::optim::AdamWOptions(1e-3));
//   auto scheduler = accel::get_linear_schedule_with_warmup(
//       optimizer, /*num_warmup_steps=*/100, /*num_training_steps=*/1000);
//   for (auto& batch : loader) {
//     ... forward, backward ...
//     optimizer.step();
//     scheduler->step();
//   }
//
// As in PyTorch, constructing a scheduler performs its first step: every
// param group's lr becomes base_lr * factor(0) at once, where base_lr is the
// group's lr when the scheduler was built. After n calls to step(),
// last_epoch() == n and every group's lr is base_lr * factor(n). Call step()
// after optimizer.step(), once per optimizer step (Accelerate's prepared
// scheduler does this for you).
//
// What is provided, with the lr after 0, 1, 2, ... steps (base lr 1.0):
//
//   // Constant, optionally after a linear warmup from 0.
//   get_constant_schedule(optimizer);                 // 1, 1, 1, ...
//   get_constant_schedule_with_warmup(optimizer, 4);  // 0, .25, .5, .75, 1, 1
//
//   // Linear warmup to 1, then linear decay to 0 at num_training_steps.
//   get_linear_schedule_with_warmup(optimizer, 2, 10);
//   // 0, .5, 1, .875, .75, ... 0 at step 10 and after
//
//   // Linear warmup, then cosine decay over num_cycles periods (0.5: one
//   // half-wave from 1 down to 0 at num_training_steps).
//   get_cosine_schedule_with_warmup(optimizer, 0, 4);  // 1, .854, .5, .146, 0
//
//   // Cosine decay that jumps back to 1 num_cycles times; 0 at the end.
//   get_cosine_with_hard_restarts_schedule_with_warmup(optimizer, 0, 4, 2);
//   // 1, .5, 1, .5, 0
//
//   // Polynomial decay (power 2 here) from the optimizer's default lr down
//   // to lr_end (0 here).
//   get_polynomial_decay_schedule_with_warmup(optimizer, 0, 4, 0.0, 2.0);
//   // 1, .5625, .25, .0625, 0
//
//   // Any factor of the step (torch.optim.lr_scheduler.LambdaLR).
//   accel::LambdaLR exponential(
//       optimizer, [](int64_t step) { return std::pow(0.9, step); });
//   // 1, .9, .81, ...
//
//   // One factor per param group, in group order.
//   accel::LambdaLR per_group(optimizer, {warmup_factor, constant_factor});
//
//   // Multiply by gamma every step_size steps (torch's StepLR).
//   accel::StepLR step_lr(optimizer, /*step_size=*/2, /*gamma=*/0.1);
//   // 1, 1, .1, .1, .01
//
//   // Super-convergence's one cycle (torch's OneCycleLR): up from
//   // max_lr / div_factor to max_lr over pct_start of total_steps, then down
//   // to a tiny one; momentum (SGD, RMSprop) or beta1 (Adam, AdamW) cycles
//   // the other way. It has an end: total_steps() == 10, and a prepared
//   // scheduler never steps past it.
//   accel::OneCycleLR one_cycle(optimizer, /*max_lr=*/1.0,
//                               /*total_steps=*/10);
//   // .04, .52, 1, .95, .81, .61, .39, .19, .05, 4e-6
//
// Writing your own: most schedules are a LambdaLR with your factor. For
// anything else, derive from LRScheduler, compute each group's lr from the
// step and base_lrs(), and call InitialStep() at the end of your
// constructor (a base constructor cannot call your override):
//
//   class HalveEveryEpoch : public accel::LRScheduler {
//    public:
//     HalveEveryEpoch(torch::optim::Optimizer& optimizer, int64_t epoch_steps)
//         : LRScheduler(optimizer), epoch_steps_(epoch_steps) {
//       InitialStep();
//     }
//
//    protected:
//     std::vector<double> ComputeLearningRates(int64_t step) const override {
//       std::vector<double> lrs;
//       for (double base : base_lrs()) {
//         lrs.push_back(base * std::pow(0.5, step / epoch_steps_));
//       }
//       return lrs;
//     }
//
//    private:
//     int64_t epoch_steps_;
//   };
//
// save() stores last_epoch, the base lrs and the last lrs (and StepLR's
// step_size and gamma, which load() restores, as torch's load_state_dict
// does); a lambda cannot be saved, so the loading program builds the same
// schedule and load() restores the position in it.
//
// Differences from PyTorch: load() also sets each
// group's lr to the saved last lr, so the result does not depend on whether
// the optimizer or the scheduler is restored first; a factor or lr that is
// not finite is a UsageError naming the step and group instead of a silent
// NaN learning rate.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace accel {

class LRScheduler {
 public:
  // The base lrs are the param groups' current lrs. Subclasses call
  // InitialStep() at the end of their constructor.
  explicit LRScheduler(torch::optim::Optimizer& optimizer);
  virtual ~LRScheduler();
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // last_epoch += 1, then sets every group's lr.
  void step();
  // Each param group's lr after the last step.
  std::vector<double> get_last_lr() const;
  // Steps taken since construction (the initial step counts as 0).
  int64_t last_epoch() const;
  torch::optim::Optimizer& optimizer();
  const torch::optim::Optimizer& optimizer() const;
  // The lr each group had when the scheduler was built (or loaded).
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  // The steps the schedule is defined for, when it has an end (OneCycleLR:
  // stepping beyond it is an error). A prepared scheduler stops there, as
  // Accelerate's AcceleratedScheduler does.
  virtual std::optional<int64_t> total_steps() const { return std::nullopt; }

  // Keys "last_epoch", "base_lrs", "last_lrs" in `archive` (pass a nested
  // archive to keep several schedulers apart).
  virtual void save(torch::serialize::OutputArchive& archive) const;
  // CheckpointError when a key is missing or the saved group count differs
  // from the optimizer's; nothing changes then.
  virtual void load(torch::serialize::InputArchive& archive);

 protected:
  // The lr of every param group, in order, after `step` steps (0 for the
  // initial step). Must return one finite value per group.
  virtual std::vector<double> ComputeLearningRates(int64_t step) const = 0;

  // Torch's initial step: last_epoch becomes 0 and every lr is set.
  void InitialStep();

  // A param group's lr now (what torch's chainable schedules start from);
  // UsageError for an optimizer whose options have no lr.
  double current_lr(size_t group) const;

  // Called once the lrs of `step` are set, and after load(): a schedule
  // that sets other options too (OneCycleLR's momentum) sets them here.
  virtual void ApplyOtherOptions(int64_t /*step*/) {}

  // The name used in messages ("LambdaLR"); override it in your own.
  virtual const char* name() const { return "LRScheduler"; }

 private:
  void ApplyLearningRates(int64_t step);
  void RequireInitialStep(const char* operation) const;

  torch::optim::Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lrs_;
  int64_t last_epoch_ = -1;
};

// lr = base_lr * factor(step), torch.optim.lr_scheduler.LambdaLR.
class LambdaLR : public LRScheduler {
 public:
  using Factor = std::function<double(int64_t step)>;
  // The same factor for every param group.
  LambdaLR(torch::optim::Optimizer& optimizer, Factor factor);
  // One factor per param group; UsageError when the counts differ.
  LambdaLR(torch::optim::Optimizer& optimizer, std::vector<Factor> factors);

 protected:
  std::vector<double> ComputeLearningRates(int64_t step) const override;
  const char* name() const override { return "LambdaLR"; }

 private:
  std::vector<Factor> factors_;
};

// lr *= gamma every step_size steps, torch.optim.lr_scheduler.StepLR: like
// torch, it multiplies the group's current lr, so a manual change of the lr
// between steps carries on (every other schedule here recomputes the lr from
// the base lr, as torch's LambdaLR does).
class StepLR : public LRScheduler {
 public:
  // UsageError unless step_size > 0 and gamma is finite and >= 0.
  StepLR(torch::optim::Optimizer& optimizer, int64_t step_size,
         double gamma = 0.1);

  int64_t step_size() const { return step_size_; }
  double gamma() const { return gamma_; }

  // Also "step_size" and "gamma"; load() restores them.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  std::vector<double> ComputeLearningRates(int64_t step) const override;
  const char* name() const override { return "StepLR"; }

 private:
  int64_t step_size_;
  double gamma_;
};

// torch.optim.lr_scheduler.OneCycleLR's options beyond max_lr and
// total_steps, with torch's defaults.
struct OneCycleLROptions {
  double pct_start = 0.3;  // Share of the steps spent raising the lr.
  std::string anneal_strategy = "cos";  // "cos" or "linear".
  // Cycles momentum (SGD, RMSprop) or beta1 (Adam, AdamW) inversely to the
  // lr, between base_momentum and max_momentum.
  bool cycle_momentum = true;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  double div_factor = 25;         // initial lr = max_lr / div_factor.
  double final_div_factor = 1e4;  // final lr = initial lr / final_div_factor.
  // Three phases (up, back down to the initial lr, then to the final one)
  // instead of two (up, then down to the final one).
  bool three_phase = false;
};

// torch.optim.lr_scheduler.OneCycleLR, to the last bit of torch's values.
// UsageError for a bad option, for an optimizer without momentum or betas
// under cycle_momentum, and for a step beyond total_steps ("Tried to step
// 11 times. The specified number of total steps is 10", as torch). save()
// also stores total_steps and each group's lr and momentum bounds, which
// load() restores (as torch's load_state_dict does).
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(torch::optim::Optimizer& optimizer, double max_lr,
             int64_t total_steps, OneCycleLROptions options = {});
  // One max_lr per param group.
  OneCycleLR(torch::optim::Optimizer& optimizer, std::vector<double> max_lrs,
             int64_t total_steps, OneCycleLROptions options = {});

  std::optional<int64_t> total_steps() const override { return total_steps_; }

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  std::vector<double> ComputeLearningRates(int64_t step) const override;
  void ApplyOtherOptions(int64_t step) override;
  const char* name() const override { return "OneCycleLR"; }

 private:
  struct Phase {
    double end_step;
    // Where the lr and the momentum go, as indices into a group's bounds.
    int start_lr, end_lr, start_momentum, end_momentum;
  };
  struct Bounds {
    double lr[3];        // initial, max, min
    double momentum[2];  // max_momentum, base_momentum
  };
  // The phase `step` is in, and how far into it (0..1).
  std::pair<const Phase*, double> Locate(int64_t step) const;
  double Anneal(double start, double end, double pct) const;
  void BuildPhases();

  int64_t total_steps_;
  OneCycleLROptions options_;
  std::vector<Phase> phases_;
  std::vector<Bounds> bounds_;  // Per param group.
  bool use_beta1_ = false;
};

// transformers.optimization's schedules, as LambdaLRs. Step counts must not
// be negative (UsageError).
std::unique_ptr<LRScheduler> get_constant_schedule(
    torch::optim::Optimizer& optimizer);
std::unique_ptr<LRScheduler> get_constant_schedule_with_warmup(
    torch::optim::Optimizer& optimizer, int64_t num_warmup_steps);
std::unique_ptr<LRScheduler> get_linear_schedule_with_warmup(
    torch::optim::Optimizer& optimizer, int64_t num_warmup_steps,
    int64_t num_training_steps);
std::unique_ptr<LRScheduler> get_cosine_schedule_with_warmup(
    torch::optim::Optimizer& optimizer, int64_t num_warmup_steps,
    int64_t num_training_steps, double num_cycles = 0.5);
std::unique_ptr<LRScheduler> get_cosine_with_hard_restarts_schedule_with_warmup(
    torch::optim::Optimizer& optimizer, int64_t num_warmup_steps,
    int64_t num_training_steps, int64_t num_cycles = 1);
// Decays from the optimizer's default lr (lr_init) to lr_end; requires
// lr_init > lr_end and num_training_steps > num_warmup_steps.
std::unique_ptr<LRScheduler> get_polynomial_decay_schedule_with_warmup(
    torch::optim::Optimizer& optimizer, int64_t num_warmup_steps,
    int64_t num_training_steps, double lr_end = 1e-7, double power = 1.0);

}  // namespace accel
