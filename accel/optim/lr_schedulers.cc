#include "accel/optim/lr_schedulers.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "accel/core/state_archive.h"
#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

constexpr double kPi = 3.14159265358979323846;  // Python's math.pi.

bool IsFactor(double gamma) { return std::isfinite(gamma) && gamma >= 0; }

void RequireFactor(const char* schedule, double gamma) {
  if (!IsFactor(gamma)) {
    throw UsageError(std::string(schedule) +
                     ": gamma must be finite and >= 0, found " +
                     std::to_string(gamma));
  }
}

void RequireFinite(const char* schedule, const char* argument, double value) {
  if (!std::isfinite(value)) {
    throw UsageError(std::string(schedule) + ": " + argument +
                     " must be finite, found " + std::to_string(value));
  }
}

void RequirePositive(const char* schedule, const char* argument,
                     int64_t value) {
  if (value <= 0) {
    throw UsageError(std::string(schedule) + ": " + argument +
                     " must be > 0, found " + std::to_string(value));
  }
}

// A saved argument that would not have passed the constructor's checks.
CheckpointError BadSavedArgument(const char* schedule, const char* argument,
                                 const std::string& value) {
  return CheckpointError(std::string(schedule) + " state has " + argument +
                         " " + value +
                         ", which its constructor would have refused");
}

// Python's math.cos(math.pi * t / period), evaluated in torch's order.
double CosineOf(double t, double period) { return std::cos(kPi * t / period); }

}  // namespace

// --- ExponentialLR ---------------------------------------------------------

ExponentialLR::ExponentialLR(torch::optim::Optimizer& optimizer, double gamma)
    : LRScheduler(optimizer), gamma_(gamma) {
  RequireFactor(name(), gamma);
  InitialStep();
}

std::vector<double> ExponentialLR::ComputeLearningRates(int64_t step) const {
  std::vector<double> lrs;
  for (size_t group = 0; group < base_lrs().size(); ++group) {
    const double lr = current_lr(group);
    lrs.push_back(step == 0 ? lr : lr * gamma_);
  }
  return lrs;
}

void ExponentialLR::save(torch::serialize::OutputArchive& archive) const {
  LRScheduler::save(archive);
  archive.write("gamma", c10::IValue(gamma_));
}

void ExponentialLR::load(torch::serialize::InputArchive& archive) {
  const auto gamma = ReadArchiveValue<double>(archive, name(), "gamma");
  if (!IsFactor(gamma)) {
    throw BadSavedArgument(name(), "gamma", std::to_string(gamma));
  }
  LRScheduler::load(archive);
  gamma_ = gamma;
}

// --- MultiStepLR -----------------------------------------------------------

MultiStepLR::MultiStepLR(torch::optim::Optimizer& optimizer,
                         std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer),
      milestones_(std::move(milestones)),
      gamma_(gamma) {
  std::sort(milestones_.begin(), milestones_.end());
  if (!milestones_.empty() && milestones_.front() < 0) {
    throw UsageError("MultiStepLR: milestones must be >= 0, found " +
                     std::to_string(milestones_.front()));
  }
  RequireFactor(name(), gamma);
  InitialStep();
}

std::vector<double> MultiStepLR::ComputeLearningRates(int64_t step) const {
  const auto [first, last] =
      std::equal_range(milestones_.begin(), milestones_.end(), step);
  const auto times = static_cast<double>(last - first);
  std::vector<double> lrs;
  for (size_t group = 0; group < base_lrs().size(); ++group) {
    const double lr = current_lr(group);
    // torch: group['lr'] * gamma ** milestones[last_epoch].
    lrs.push_back(times == 0 ? lr : lr * std::pow(gamma_, times));
  }
  return lrs;
}

void MultiStepLR::save(torch::serialize::OutputArchive& archive) const {
  LRScheduler::save(archive);
  archive.write("milestones", c10::IValue(milestones_));
  archive.write("gamma", c10::IValue(gamma_));
}

void MultiStepLR::load(torch::serialize::InputArchive& archive) {
  auto milestones =
      ReadArchiveValue<std::vector<int64_t>>(archive, name(), "milestones");
  const auto gamma = ReadArchiveValue<double>(archive, name(), "gamma");
  if (!std::is_sorted(milestones.begin(), milestones.end()) ||
      (!milestones.empty() && milestones.front() < 0)) {
    throw BadSavedArgument(name(), "milestones", "out of order or negative");
  }
  if (!IsFactor(gamma)) {
    throw BadSavedArgument(name(), "gamma", std::to_string(gamma));
  }
  LRScheduler::load(archive);
  milestones_ = std::move(milestones);
  gamma_ = gamma;
}

// --- CosineAnnealingLR -----------------------------------------------------

CosineAnnealingLR::CosineAnnealingLR(torch::optim::Optimizer& optimizer,
                                     int64_t t_max, double eta_min)
    : LRScheduler(optimizer), t_max_(t_max), eta_min_(eta_min) {
  RequirePositive(name(), "t_max", t_max);
  RequireFinite(name(), "eta_min", eta_min);
  InitialStep();
}

// torch 1.13's get_lr(), term for term: the chained form, with the step
// after each minimum (where the chained ratio would divide by zero) adding
// the first step's rise again.
std::vector<double> CosineAnnealingLR::ComputeLearningRates(
    int64_t step) const {
  const auto t_max = static_cast<double>(t_max_);
  const bool restart = (step - 1 - t_max_) % (2 * t_max_) == 0;
  std::vector<double> lrs;
  for (size_t group = 0; group < base_lrs().size(); ++group) {
    const double lr = current_lr(group);
    if (step == 0) {
      lrs.push_back(lr);
    } else if (restart) {
      lrs.push_back(lr + (base_lrs()[group] - eta_min_) *
                             (1 - std::cos(kPi / t_max)) / 2);
    } else {
      lrs.push_back((1 + CosineOf(static_cast<double>(step), t_max)) /
                        (1 + CosineOf(static_cast<double>(step - 1), t_max)) *
                        (lr - eta_min_) +
                    eta_min_);
    }
  }
  return lrs;
}

void CosineAnnealingLR::save(torch::serialize::OutputArchive& archive) const {
  LRScheduler::save(archive);
  archive.write("T_max", c10::IValue(t_max_));
  archive.write("eta_min", c10::IValue(eta_min_));
}

void CosineAnnealingLR::load(torch::serialize::InputArchive& archive) {
  const auto t_max = ReadArchiveValue<int64_t>(archive, name(), "T_max");
  const auto eta_min = ReadArchiveValue<double>(archive, name(), "eta_min");
  if (t_max <= 0) {
    throw BadSavedArgument(name(), "T_max", std::to_string(t_max));
  }
  if (!std::isfinite(eta_min)) {
    throw BadSavedArgument(name(), "eta_min", std::to_string(eta_min));
  }
  LRScheduler::load(archive);
  t_max_ = t_max;
  eta_min_ = eta_min;
}

// --- CosineAnnealingWarmRestarts ---------------------------------------------

CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(
    torch::optim::Optimizer& optimizer, int64_t t_0, int64_t t_mult,
    double eta_min)
    : LRScheduler(optimizer), t_0_(t_0), t_mult_(t_mult), eta_min_(eta_min) {
  RequirePositive(name(), "t_0", t_0);
  RequirePositive(name(), "t_mult", t_mult);
  RequireFinite(name(), "eta_min", eta_min);
  InitialStep();
}

// torch counts T_cur up by one per step and, on reaching the period T_i,
// subtracts it and multiplies T_i by t_mult; both stay whole numbers, so
// walking the periods from the start gives torch's T_cur and T_i exactly.
std::vector<double> CosineAnnealingWarmRestarts::ComputeLearningRates(
    int64_t step) const {
  int64_t t_cur = step;
  int64_t t_i = t_0_;
  while (t_cur >= t_i) {
    t_cur -= t_i;
    t_i *= t_mult_;
  }
  const double cosine =
      CosineOf(static_cast<double>(t_cur), static_cast<double>(t_i));
  std::vector<double> lrs;
  for (double base_lr : base_lrs()) {
    lrs.push_back(eta_min_ + (base_lr - eta_min_) * (1 + cosine) / 2);
  }
  return lrs;
}

void CosineAnnealingWarmRestarts::save(
    torch::serialize::OutputArchive& archive) const {
  LRScheduler::save(archive);
  archive.write("T_0", c10::IValue(t_0_));
  archive.write("T_mult", c10::IValue(t_mult_));
  archive.write("eta_min", c10::IValue(eta_min_));
}

void CosineAnnealingWarmRestarts::load(
    torch::serialize::InputArchive& archive) {
  const auto t_0 = ReadArchiveValue<int64_t>(archive, name(), "T_0");
  const auto t_mult = ReadArchiveValue<int64_t>(archive, name(), "T_mult");
  const auto eta_min = ReadArchiveValue<double>(archive, name(), "eta_min");
  if (t_0 <= 0 || t_mult <= 0) {
    throw BadSavedArgument(
        name(), "T_0 and T_mult",
        std::to_string(t_0) + " and " + std::to_string(t_mult));
  }
  if (!std::isfinite(eta_min)) {
    throw BadSavedArgument(name(), "eta_min", std::to_string(eta_min));
  }
  LRScheduler::load(archive);
  t_0_ = t_0;
  t_mult_ = t_mult;
  eta_min_ = eta_min;
}

}  // namespace accel
