#include "accel/optim/reduce_lr_on_plateau.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "accel/core/state_archive.h"
#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

std::string Plateau(const std::string& what) {
  return "ReduceLROnPlateau: " + what;
}

void RequireFiniteOption(const char* option, double value) {
  if (!std::isfinite(value)) {
    throw UsageError(Plateau(std::string(option) + " must be finite, found " +
                             std::to_string(value)));
  }
}

}  // namespace

void CheckReduceLROnPlateauOptions(const ReduceLROnPlateauOptions& options,
                                   size_t groups) {
  if (options.mode != "min" && options.mode != "max") {
    throw UsageError(Plateau("mode must be \"min\" or \"max\", found \"" +
                             options.mode + "\""));
  }
  if (options.threshold_mode != "rel" && options.threshold_mode != "abs") {
    throw UsageError(
        Plateau("threshold_mode must be \"rel\" or \"abs\", found \"" +
                options.threshold_mode + "\""));
  }
  if (!(options.factor >= 0 && options.factor < 1)) {
    throw UsageError(Plateau("factor must be >= 0 and < 1, found " +
                             std::to_string(options.factor)));
  }
  if (options.patience < 0 || options.cooldown < 0) {
    throw UsageError(Plateau("patience and cooldown must be >= 0, found " +
                             std::to_string(options.patience) + " and " +
                             std::to_string(options.cooldown)));
  }
  RequireFiniteOption("threshold", options.threshold);
  RequireFiniteOption("eps", options.eps);
  if (options.min_lr.size() != 1 && options.min_lr.size() != groups) {
    throw UsageError(Plateau("expected 1 min_lr or " + std::to_string(groups) +
                             " (one per param group), found " +
                             std::to_string(options.min_lr.size())));
  }
  for (double min_lr : options.min_lr) RequireFiniteOption("min_lr", min_lr);
}

ReduceLROnPlateau::ReduceLROnPlateau(torch::optim::Optimizer& optimizer,
                                     ReduceLROnPlateauOptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  CheckReduceLROnPlateauOptions(options_, base_lrs().size());
  if (options_.min_lr.size() == 1) {
    options_.min_lr.assign(base_lrs().size(), options_.min_lr.front());
  }
  best_ = options_.mode == "min" ? kInfinity : -kInfinity;
  InitialStep();  // Sets nothing: torch's starts at last_epoch 0 as it is.
}

// torch 1.13's is_better, term for term.
bool ReduceLROnPlateau::IsBetter(double metric) const {
  const bool relative = options_.threshold_mode == "rel";
  if (options_.mode == "min") {
    return relative ? metric < best_ * (1. - options_.threshold)
                    : metric < best_ - options_.threshold;
  }
  return relative ? metric > best_ * (options_.threshold + 1.)
                  : metric > best_ + options_.threshold;
}

std::vector<double> ReduceLROnPlateau::ReducedLearningRates() const {
  std::vector<double> lrs;
  for (size_t group = 0; group < base_lrs().size(); ++group) {
    const double old_lr = current_lr(group);
    const double new_lr =
        std::max(old_lr * options_.factor, options_.min_lr[group]);
    lrs.push_back(old_lr - new_lr > options_.eps ? new_lr : old_lr);
  }
  return lrs;
}

void ReduceLROnPlateau::step(double metric) {
  // torch 1.13's step(metrics), in its order.
  if (IsBetter(metric)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (in_cooldown()) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;
  }
  std::vector<double> lrs;
  if (num_bad_epochs_ > options_.patience) {
    lrs = ReducedLearningRates();
    cooldown_counter_ = options_.cooldown;
    num_bad_epochs_ = 0;
  } else {
    for (size_t group = 0; group < base_lrs().size(); ++group) {
      lrs.push_back(current_lr(group));
    }
  }
  decided_lrs_ = std::move(lrs);
  try {
    LRScheduler::step();
  } catch (...) {
    decided_lrs_.reset();
    throw;
  }
  decided_lrs_.reset();
}

std::vector<double> ReduceLROnPlateau::ComputeLearningRates(
    int64_t step) const {
  if (decided_lrs_) return *decided_lrs_;
  if (step != 0) {
    throw UsageError(Plateau(
        "step() needs the metric: call step(metric) once per evaluation "
        "(on the prepared scheduler too)"));
  }
  std::vector<double> lrs;
  for (size_t group = 0; group < base_lrs().size(); ++group) {
    lrs.push_back(current_lr(group));
  }
  return lrs;
}

void ReduceLROnPlateau::save(torch::serialize::OutputArchive& archive) const {
  LRScheduler::save(archive);
  archive.write("best", c10::IValue(best_));
  archive.write("num_bad_epochs", c10::IValue(num_bad_epochs_));
  archive.write("cooldown_counter", c10::IValue(cooldown_counter_));
  archive.write("mode", c10::IValue(options_.mode));
  archive.write("factor", c10::IValue(options_.factor));
  archive.write("patience", c10::IValue(options_.patience));
  archive.write("threshold", c10::IValue(options_.threshold));
  archive.write("threshold_mode", c10::IValue(options_.threshold_mode));
  archive.write("cooldown", c10::IValue(options_.cooldown));
  archive.write("min_lrs", c10::IValue(options_.min_lr));
  archive.write("eps", c10::IValue(options_.eps));
}

void ReduceLROnPlateau::load(torch::serialize::InputArchive& archive) {
  ReduceLROnPlateauOptions options;
  options.mode = ReadArchiveValue<std::string>(archive, name(), "mode");
  options.factor = ReadArchiveValue<double>(archive, name(), "factor");
  options.patience = ReadArchiveValue<int64_t>(archive, name(), "patience");
  options.threshold = ReadArchiveValue<double>(archive, name(), "threshold");
  options.threshold_mode =
      ReadArchiveValue<std::string>(archive, name(), "threshold_mode");
  options.cooldown = ReadArchiveValue<int64_t>(archive, name(), "cooldown");
  options.min_lr =
      ReadArchiveValue<std::vector<double>>(archive, name(), "min_lrs");
  options.eps = ReadArchiveValue<double>(archive, name(), "eps");
  const auto best = ReadArchiveValue<double>(archive, name(), "best");
  const auto bad = ReadArchiveValue<int64_t>(archive, name(), "num_bad_epochs");
  const auto cooldown_counter =
      ReadArchiveValue<int64_t>(archive, name(), "cooldown_counter");
  try {
    CheckReduceLROnPlateauOptions(options, base_lrs().size());
  } catch (const UsageError& e) {
    throw CheckpointError(std::string("saved state: ") + e.what());
  }
  if (options.min_lr.size() != base_lrs().size() || std::isnan(best) ||
      bad < 0 || cooldown_counter < 0) {
    throw CheckpointError(
        Plateau("saved state has " + std::to_string(options.min_lr.size()) +
                " min_lrs for " + std::to_string(base_lrs().size()) +
                " param groups, best " + std::to_string(best) + ", " +
                std::to_string(bad) + " bad evaluations and a cooldown of " +
                std::to_string(cooldown_counter) +
                "; expected one min_lr per group, "
                "a best that is a number and counts >= 0"));
  }
  LRScheduler::load(archive);
  options_ = std::move(options);
  best_ = best;
  num_bad_epochs_ = bad;
  cooldown_counter_ = cooldown_counter;
}

}  // namespace accel
