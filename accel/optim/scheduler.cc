#include "accel/optim/scheduler.h"

#include <c10/util/Exception.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <string>
#include <utility>

#include "accel/core/state_archive.h"
#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

constexpr double kPi = 3.14159265358979323846;

double GroupLearningRate(const torch::optim::Optimizer& optimizer,
                         size_t group) {
  try {
    return optimizer.param_groups()[group].options().get_lr();
  } catch (const c10::Error&) {
    throw UsageError(
        "LRScheduler: the options of param group " + std::to_string(group) +
        " do not implement get_lr(); an optimizer with a learning rate "
        "(SGD, Adam, AdamW, RMSprop, Adagrad, LBFGS) is needed");
  }
}

void RequireNonNegative(const char* schedule, const char* argument,
                        double value) {
  if (!(value >= 0) || !std::isfinite(value)) {
    throw UsageError(std::string(schedule) + ": " + argument +
                     " must be finite and >= 0, found " +
                     std::to_string(value));
  }
}

// transformers' linear warmup: step / max(1, num_warmup_steps).
double WarmupFactor(int64_t step, int64_t num_warmup_steps) {
  return static_cast<double>(step) /
         static_cast<double>(std::max<int64_t>(1, num_warmup_steps));
}

// Fraction of the decay phase done: 0 at the end of warmup, 1 at
// num_training_steps.
double DecayProgress(int64_t step, int64_t num_warmup_steps,
                     int64_t num_training_steps) {
  return static_cast<double>(step - num_warmup_steps) /
         static_cast<double>(
             std::max<int64_t>(1, num_training_steps - num_warmup_steps));
}

}  // namespace

LRScheduler::LRScheduler(torch::optim::Optimizer& optimizer)
    : optimizer_(optimizer) {
  for (size_t group = 0; group < optimizer.param_groups().size(); ++group) {
    base_lrs_.push_back(GroupLearningRate(optimizer, group));
  }
}

LRScheduler::~LRScheduler() = default;

void LRScheduler::InitialStep() {
  if (last_epoch_ != -1) {
    throw UsageError(std::string(name()) +
                     ": InitialStep() is for the constructor, called once");
  }
  ApplyLearningRates(0);
}

void LRScheduler::step() {
  RequireInitialStep("step");
  ApplyLearningRates(last_epoch_ + 1);
}

void LRScheduler::ApplyLearningRates(int64_t step) {
  auto& groups = optimizer_.param_groups();
  if (groups.size() != base_lrs_.size()) {
    throw UsageError(std::string(name()) + ": the optimizer has " +
                     std::to_string(groups.size()) +
                     " param groups, but the scheduler was built for " +
                     std::to_string(base_lrs_.size()) +
                     "; build the scheduler after adding param groups");
  }
  std::vector<double> lrs = ComputeLearningRates(step);
  if (lrs.size() != groups.size()) {
    throw UsageError(std::string(name()) + ": computed " +
                     std::to_string(lrs.size()) + " learning rates for " +
                     std::to_string(groups.size()) + " param groups");
  }
  for (size_t group = 0; group < lrs.size(); ++group) {
    if (!std::isfinite(lrs[group])) {
      throw UsageError(std::string(name()) + ": learning rate of param group " +
                       std::to_string(group) + " at step " +
                       std::to_string(step) + " is " +
                       std::to_string(lrs[group]) + " (base lr " +
                       std::to_string(base_lrs_[group]) + ")");
    }
  }
  for (size_t group = 0; group < lrs.size(); ++group) {
    groups[group].options().set_lr(lrs[group]);
  }
  last_lrs_ = std::move(lrs);
  last_epoch_ = step;
  ApplyOtherOptions(step);
}

void LRScheduler::RequireInitialStep(const char* operation) const {
  if (last_epoch_ < 0) {
    throw UsageError(std::string(name()) + "::" + operation +
                     ": the scheduler's constructor did not call "
                     "InitialStep()");
  }
}

std::vector<double> LRScheduler::get_last_lr() const {
  RequireInitialStep("get_last_lr");
  return last_lrs_;
}

int64_t LRScheduler::last_epoch() const { return last_epoch_; }

double LRScheduler::current_lr(size_t group) const {
  return GroupLearningRate(optimizer_, group);
}

torch::optim::Optimizer& LRScheduler::optimizer() { return optimizer_; }

const torch::optim::Optimizer& LRScheduler::optimizer() const {
  return optimizer_;
}

void LRScheduler::save(torch::serialize::OutputArchive& archive) const {
  RequireInitialStep("save");
  archive.write("last_epoch", c10::IValue(last_epoch_));
  archive.write("base_lrs", c10::IValue(base_lrs_));
  archive.write("last_lrs", c10::IValue(last_lrs_));
}

void LRScheduler::load(torch::serialize::InputArchive& archive) {
  RequireInitialStep("load");
  const auto last_epoch =
      ReadArchiveValue<int64_t>(archive, name(), "last_epoch");
  const auto base_lrs =
      ReadArchiveValue<std::vector<double>>(archive, name(), "base_lrs");
  const auto last_lrs =
      ReadArchiveValue<std::vector<double>>(archive, name(), "last_lrs");
  const size_t groups = optimizer_.param_groups().size();
  if (base_lrs.size() != groups || last_lrs.size() != groups) {
    throw CheckpointError(std::string(name()) + " state is for " +
                          std::to_string(base_lrs.size()) +
                          " param groups, but the optimizer has " +
                          std::to_string(groups));
  }
  if (last_epoch < 0) {
    throw CheckpointError(std::string(name()) + " state has last_epoch " +
                          std::to_string(last_epoch) + ", expected >= 0");
  }
  for (size_t group = 0; group < groups; ++group) {
    if (!std::isfinite(base_lrs[group]) || !std::isfinite(last_lrs[group])) {
      throw CheckpointError(std::string(name()) +
                            " state has a learning rate that is not finite "
                            "for param group " +
                            std::to_string(group));
    }
  }
  for (size_t group = 0; group < groups; ++group) {
    optimizer_.param_groups()[group].options().set_lr(last_lrs[group]);
  }
  last_epoch_ = last_epoch;
  base_lrs_ = base_lrs;
  last_lrs_ = last_lrs;
  ApplyOtherOptions(last_epoch_);
}

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, Factor factor)
    : LambdaLR(optimizer,
               std::vector<Factor>(optimizer.param_groups().size(), factor)) {}

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer,
                   std::vector<Factor> factors)
    : LRScheduler(optimizer), factors_(std::move(factors)) {
  if (factors_.size() != base_lrs().size()) {
    throw UsageError("LambdaLR: expected " + std::to_string(base_lrs().size()) +
                     " factors (one per param group), found " +
                     std::to_string(factors_.size()));
  }
  for (size_t group = 0; group < factors_.size(); ++group) {
    if (!factors_[group]) {
      throw UsageError("LambdaLR: the factor of param group " +
                       std::to_string(group) + " is empty");
    }
  }
  InitialStep();
}

std::vector<double> LambdaLR::ComputeLearningRates(int64_t step) const {
  std::vector<double> lrs;
  for (size_t group = 0; group < factors_.size(); ++group) {
    lrs.push_back(base_lrs()[group] * factors_[group](step));
  }
  return lrs;
}

StepLR::StepLR(torch::optim::Optimizer& optimizer, int64_t step_size,
               double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  if (step_size <= 0) {
    throw UsageError("StepLR: step_size must be > 0, found " +
                     std::to_string(step_size));
  }
  RequireNonNegative("StepLR", "gamma", gamma);
  InitialStep();
}

// Torch's chained form (not base_lr * gamma^k), so that the values match
// torch's to the last bit.
std::vector<double> StepLR::ComputeLearningRates(int64_t step) const {
  const bool decay = step != 0 && step % step_size_ == 0;
  std::vector<double> lrs;
  for (size_t group = 0; group < base_lrs().size(); ++group) {
    const double lr = current_lr(group);
    lrs.push_back(decay ? lr * gamma_ : lr);
  }
  return lrs;
}

void StepLR::save(torch::serialize::OutputArchive& archive) const {
  LRScheduler::save(archive);
  archive.write("step_size", c10::IValue(step_size_));
  archive.write("gamma", c10::IValue(gamma_));
}

void StepLR::load(torch::serialize::InputArchive& archive) {
  const auto step_size =
      ReadArchiveValue<int64_t>(archive, name(), "step_size");
  const auto gamma = ReadArchiveValue<double>(archive, name(), "gamma");
  if (step_size <= 0 || !(gamma >= 0) || !std::isfinite(gamma)) {
    throw CheckpointError("StepLR state has step_size " +
                          std::to_string(step_size) + " and gamma " +
                          std::to_string(gamma) +
                          ", expected step_size > 0 and gamma >= 0");
  }
  LRScheduler::load(archive);
  step_size_ = step_size;
  gamma_ = gamma;
}

namespace {

// Which momentum option a param group's optimizer has: beta1 (Adam,
// AdamW), momentum (SGD, RMSprop), or none.
enum class Momentum { kNone, kBeta1, kMomentum };

Momentum MomentumOf(torch::optim::OptimizerOptions& options) {
  if (dynamic_cast<torch::optim::AdamOptions*>(&options) ||
      dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
    return Momentum::kBeta1;
  }
  if (dynamic_cast<torch::optim::SGDOptions*>(&options) ||
      dynamic_cast<torch::optim::RMSpropOptions*>(&options)) {
    return Momentum::kMomentum;
  }
  return Momentum::kNone;
}

void SetMomentum(torch::optim::OptimizerOptions& options, double value) {
  if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
    adam->betas(std::make_tuple(value, std::get<1>(adam->betas())));
  } else if (auto* adamw =
                 dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
    adamw->betas(std::make_tuple(value, std::get<1>(adamw->betas())));
  } else if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
    sgd->momentum(value);
  } else if (auto* rms =
                 dynamic_cast<torch::optim::RMSpropOptions*>(&options)) {
    rms->momentum(value);
  }
}

std::vector<double> LearningRatesOf(torch::optim::Optimizer& optimizer,
                                    double max_lr) {
  return std::vector<double>(optimizer.param_groups().size(), max_lr);
}

}  // namespace

OneCycleLR::OneCycleLR(torch::optim::Optimizer& optimizer, double max_lr,
                       int64_t total_steps, OneCycleLROptions options)
    : OneCycleLR(optimizer, LearningRatesOf(optimizer, max_lr), total_steps,
                 std::move(options)) {}

OneCycleLR::OneCycleLR(torch::optim::Optimizer& optimizer,
                       std::vector<double> max_lrs, int64_t total_steps,
                       OneCycleLROptions options)
    : LRScheduler(optimizer),
      total_steps_(total_steps),
      options_(std::move(options)) {
  auto& groups = optimizer.param_groups();
  if (total_steps <= 0) {
    throw UsageError("OneCycleLR: total_steps must be > 0, found " +
                     std::to_string(total_steps));
  }
  if (max_lrs.size() != groups.size()) {
    throw UsageError("OneCycleLR: expected " + std::to_string(groups.size()) +
                     " max_lr values (one per param group), found " +
                     std::to_string(max_lrs.size()));
  }
  if (!(options_.pct_start >= 0 && options_.pct_start <= 1)) {
    throw UsageError("OneCycleLR: pct_start must be in [0, 1], found " +
                     std::to_string(options_.pct_start));
  }
  if (options_.anneal_strategy != "cos" &&
      options_.anneal_strategy != "linear") {
    throw UsageError(
        "OneCycleLR: anneal_strategy must be \"cos\" or \"linear\", found "
        "\"" +
        options_.anneal_strategy + "\"");
  }
  for (const auto& [argument, value] :
       {std::pair<const char*, double>{"div_factor", options_.div_factor},
        {"final_div_factor", options_.final_div_factor}}) {
    if (!(value > 0) || !std::isfinite(value)) {
      throw UsageError(std::string("OneCycleLR: ") + argument +
                       " must be finite and > 0, found " +
                       std::to_string(value));
    }
  }
  for (double max_lr : max_lrs)
    RequireNonNegative("OneCycleLR", "max_lr", max_lr);
  if (options_.cycle_momentum) {
    const Momentum kind = MomentumOf(groups[0].options());
    if (kind == Momentum::kNone) {
      throw UsageError(
          "OneCycleLR: optimizer must support momentum or beta1 with "
          "`cycle_momentum` option enabled (SGD, RMSprop, Adam, AdamW); pass "
          "cycle_momentum = false for others");
    }
    use_beta1_ = kind == Momentum::kBeta1;
  }
  for (size_t group = 0; group < groups.size(); ++group) {
    const double initial = max_lrs[group] / options_.div_factor;
    bounds_.push_back(
        {{initial, max_lrs[group], initial / options_.final_div_factor},
         {options_.max_momentum, options_.base_momentum}});
    groups[group].options().set_lr(initial);
  }
  BuildPhases();
  InitialStep();
}

void OneCycleLR::BuildPhases() {
  constexpr int kInitial = 0, kMax = 1, kMin = 2;
  constexpr int kMaxMomentum = 0, kBaseMomentum = 1;
  const double total = static_cast<double>(total_steps_);
  const double pct = options_.pct_start;
  if (options_.three_phase) {
    phases_ = {
        {pct * total - 1, kInitial, kMax, kMaxMomentum, kBaseMomentum},
        {2 * pct * total - 2, kMax, kInitial, kBaseMomentum, kMaxMomentum},
        {total - 1, kInitial, kMin, kMaxMomentum, kMaxMomentum}};
  } else {
    phases_ = {{pct * total - 1, kInitial, kMax, kMaxMomentum, kBaseMomentum},
               {total - 1, kMax, kMin, kBaseMomentum, kMaxMomentum}};
  }
}

double OneCycleLR::Anneal(double start, double end, double pct) const {
  if (options_.anneal_strategy == "linear") return (end - start) * pct + start;
  const double cos_out = std::cos(kPi * pct) + 1;
  return end + (start - end) / 2.0 * cos_out;
}

std::pair<const OneCycleLR::Phase*, double> OneCycleLR::Locate(
    int64_t step) const {
  if (step > total_steps_) {
    throw UsageError("OneCycleLR: Tried to step " + std::to_string(step) +
                     " times. The specified number of total steps is " +
                     std::to_string(total_steps_));
  }
  const double at = static_cast<double>(step);
  double start_step = 0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    const Phase& phase = phases_[i];
    if (at <= phase.end_step || i + 1 == phases_.size()) {
      return {&phase, (at - start_step) / (phase.end_step - start_step)};
    }
    start_step = phase.end_step;
  }
  return {&phases_.back(), 1.0};
}

std::vector<double> OneCycleLR::ComputeLearningRates(int64_t step) const {
  const auto [phase, pct] = Locate(step);
  std::vector<double> lrs;
  for (const Bounds& bounds : bounds_) {
    lrs.push_back(
        Anneal(bounds.lr[phase->start_lr], bounds.lr[phase->end_lr], pct));
  }
  return lrs;
}

void OneCycleLR::ApplyOtherOptions(int64_t step) {
  if (!options_.cycle_momentum) return;
  const auto [phase, pct] = Locate(step);
  auto& groups = optimizer().param_groups();
  for (size_t group = 0; group < groups.size() && group < bounds_.size();
       ++group) {
    const Bounds& bounds = bounds_[group];
    SetMomentum(groups[group].options(),
                Anneal(bounds.momentum[phase->start_momentum],
                       bounds.momentum[phase->end_momentum], pct));
  }
}

void OneCycleLR::save(torch::serialize::OutputArchive& archive) const {
  LRScheduler::save(archive);
  archive.write("total_steps", c10::IValue(total_steps_));
  std::vector<double> bounds;
  for (const Bounds& b : bounds_) {
    bounds.insert(bounds.end(),
                  {b.lr[0], b.lr[1], b.lr[2], b.momentum[0], b.momentum[1]});
  }
  archive.write("bounds", c10::IValue(bounds));
}

void OneCycleLR::load(torch::serialize::InputArchive& archive) {
  const auto total = ReadArchiveValue<int64_t>(archive, name(), "total_steps");
  const auto saved =
      ReadArchiveValue<std::vector<double>>(archive, name(), "bounds");
  if (total <= 0 || saved.size() != 5 * bounds_.size()) {
    throw CheckpointError("OneCycleLR state has total_steps " +
                          std::to_string(total) + " and " +
                          std::to_string(saved.size() / 5) +
                          " param groups' bounds, expected total_steps > 0 "
                          "and " +
                          std::to_string(bounds_.size()));
  }
  const int64_t old_total = total_steps_;
  const std::vector<Bounds> old_bounds = bounds_;
  total_steps_ = total;
  for (size_t group = 0; group < bounds_.size(); ++group) {
    const double* b = &saved[5 * group];
    bounds_[group] = {{b[0], b[1], b[2]}, {b[3], b[4]}};
  }
  BuildPhases();
  try {
    LRScheduler::load(archive);
  } catch (...) {
    total_steps_ = old_total;
    bounds_ = old_bounds;
    BuildPhases();
    throw;
  }
}

namespace {

void RequireSteps(const char* schedule, int64_t num_warmup_steps,
                  int64_t num_training_steps) {
  if (num_warmup_steps < 0 || num_training_steps < 0) {
    throw UsageError(std::string(schedule) +
                     ": step counts must not be negative, found "
                     "num_warmup_steps " +
                     std::to_string(num_warmup_steps) +
                     " and num_training_steps " +
                     std::to_string(num_training_steps));
  }
}

}  // namespace

std::unique_ptr<LRScheduler> get_constant_schedule(
    torch::optim::Optimizer& optimizer) {
  return std::make_unique<LambdaLR>(optimizer, [](int64_t) { return 1.0; });
}

std::unique_ptr<LRScheduler> get_constant_schedule_with_warmup(
    torch::optim::Optimizer& optimizer, int64_t num_warmup_steps) {
  RequireSteps("get_constant_schedule_with_warmup", num_warmup_steps, 0);
  return std::make_unique<LambdaLR>(optimizer, [=](int64_t step) {
    return step < num_warmup_steps ? WarmupFactor(step, num_warmup_steps) : 1.0;
  });
}

std::unique_ptr<LRScheduler> get_linear_schedule_with_warmup(
    torch::optim::Optimizer& optimizer, int64_t num_warmup_steps,
    int64_t num_training_steps) {
  RequireSteps("get_linear_schedule_with_warmup", num_warmup_steps,
               num_training_steps);
  return std::make_unique<LambdaLR>(optimizer, [=](int64_t step) {
    if (step < num_warmup_steps) return WarmupFactor(step, num_warmup_steps);
    return std::max(0.0, static_cast<double>(num_training_steps - step) /
                             static_cast<double>(std::max<int64_t>(
                                 1, num_training_steps - num_warmup_steps)));
  });
}

std::unique_ptr<LRScheduler> get_cosine_schedule_with_warmup(
    torch::optim::Optimizer& optimizer, int64_t num_warmup_steps,
    int64_t num_training_steps, double num_cycles) {
  RequireSteps("get_cosine_schedule_with_warmup", num_warmup_steps,
               num_training_steps);
  RequireNonNegative("get_cosine_schedule_with_warmup", "num_cycles",
                     num_cycles);
  return std::make_unique<LambdaLR>(optimizer, [=](int64_t step) {
    if (step < num_warmup_steps) return WarmupFactor(step, num_warmup_steps);
    const double progress =
        DecayProgress(step, num_warmup_steps, num_training_steps);
    return std::max(0.0,
                    0.5 * (1.0 + std::cos(kPi * num_cycles * 2.0 * progress)));
  });
}

std::unique_ptr<LRScheduler> get_cosine_with_hard_restarts_schedule_with_warmup(
    torch::optim::Optimizer& optimizer, int64_t num_warmup_steps,
    int64_t num_training_steps, int64_t num_cycles) {
  const char* schedule = "get_cosine_with_hard_restarts_schedule_with_warmup";
  RequireSteps(schedule, num_warmup_steps, num_training_steps);
  RequireNonNegative(schedule, "num_cycles", static_cast<double>(num_cycles));
  return std::make_unique<LambdaLR>(optimizer, [=](int64_t step) {
    if (step < num_warmup_steps) return WarmupFactor(step, num_warmup_steps);
    const double progress =
        DecayProgress(step, num_warmup_steps, num_training_steps);
    if (progress >= 1.0) return 0.0;
    const double cycle =
        std::fmod(static_cast<double>(num_cycles) * progress, 1.0);
    return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * cycle)));
  });
}

std::unique_ptr<LRScheduler> get_polynomial_decay_schedule_with_warmup(
    torch::optim::Optimizer& optimizer, int64_t num_warmup_steps,
    int64_t num_training_steps, double lr_end, double power) {
  const char* schedule = "get_polynomial_decay_schedule_with_warmup";
  RequireSteps(schedule, num_warmup_steps, num_training_steps);
  if (num_training_steps <= num_warmup_steps) {
    throw UsageError(std::string(schedule) + ": num_training_steps (" +
                     std::to_string(num_training_steps) +
                     ") must exceed num_warmup_steps (" +
                     std::to_string(num_warmup_steps) + ")");
  }
  RequireNonNegative(schedule, "power", power);
  double lr_init;
  try {
    lr_init = optimizer.defaults().get_lr();
  } catch (const c10::Error&) {
    throw UsageError(std::string(schedule) +
                     ": the optimizer's default options have no lr");
  }
  if (!(lr_init > lr_end) || !std::isfinite(lr_end)) {
    throw UsageError(std::string(schedule) + ": lr_end (" +
                     std::to_string(lr_end) +
                     ") must be smaller than the optimizer's lr (" +
                     std::to_string(lr_init) + ")");
  }
  return std::make_unique<LambdaLR>(optimizer, [=](int64_t step) {
    if (step < num_warmup_steps) return WarmupFactor(step, num_warmup_steps);
    if (step > num_training_steps) return lr_end / lr_init;
    const double remaining =
        1.0 - static_cast<double>(step - num_warmup_steps) /
                  static_cast<double>(num_training_steps - num_warmup_steps);
    return ((lr_init - lr_end) * std::pow(remaining, power) + lr_end) / lr_init;
  });
}

}  // namespace accel
