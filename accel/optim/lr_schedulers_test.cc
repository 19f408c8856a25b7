// ExponentialLR, MultiStepLR, CosineAnnealingLR, CosineAnnealingWarmRestarts
// and ReduceLROnPlateau against python3-torch's own, step by step and bit
// for bit; the header's documented values; argument checks; save/load.
#include "accel/optim/lr_schedulers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "accel/core/state_archive.h"
#include "accel/optim/reduce_lr_on_plateau.h"
#include "accel/runtime/base/errors.h"
#include "tests/torch_reference.h"

namespace accel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr int kSteps = 30;

// Two param groups (lrs 0.1 and 0.02), as the Python side builds them.
std::vector<torch::optim::OptimizerParamGroup> TwoGroups() {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{torch::ones({2})});
  groups.emplace_back(std::vector<torch::Tensor>{torch::ones({3})},
                      std::make_unique<torch::optim::SGDOptions>(0.02));
  return groups;
}

double Lr(const torch::optim::Optimizer& optimizer, size_t group) {
  return optimizer.param_groups()[group].options().get_lr();
}

// The metric the plateau cases see at each evaluation: falling, then flat
// with noise, a NaN, falling again, flat.
double Metric(int step) {
  static const double kMetrics[] = {5.0, 4.0,  3.9,  3.9999, 3.8997, 3.9, 3.85,
                                    3.9, 4.1,  3.95, NAN,    3.0,    2.5, 2.5,
                                    2.5, 2.49, 2.6,  2.7,    2.8,    2.9};
  return kMetrics[step % 20] - 0.001 * (step / 20);
}

// Every case's lrs of both groups after each step. A case marked "manual"
// halves group 0's lr by hand after step 5 (chained schedules carry it on).
constexpr char kPython[] = R"PY(
import json, math, torch
from torch.optim.lr_scheduler import (ExponentialLR, MultiStepLR,
    CosineAnnealingLR, CosineAnnealingWarmRestarts, ReduceLROnPlateau)

STEPS = 30
METRICS = [5.0, 4.0, 3.9, 3.9999, 3.8997, 3.9, 3.85, 3.9, 4.1, 3.95,
           float("nan"), 3.0, 2.5, 2.5, 2.5, 2.49, 2.6, 2.7, 2.8, 2.9]
def metric(step):
    return METRICS[step % 20] - 0.001 * (step // 20)

def groups():
    return [{"params": [torch.ones(2)]},
            {"params": [torch.ones(3)], "lr": 0.02}]

cases = {
    "exponential": lambda o: ExponentialLR(o, gamma=0.9),
    "multistep": lambda o: MultiStepLR(o, milestones=[7, 3, 3, 11], gamma=0.5),
    "cosine": lambda o: CosineAnnealingLR(o, T_max=5, eta_min=0.001),
    "cosine_manual": lambda o: CosineAnnealingLR(o, T_max=7),
    "exponential_manual": lambda o: ExponentialLR(o, gamma=0.8),
    "warm_restarts": lambda o: CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2,
                                                           eta_min=0.001),
    "warm_restarts_1": lambda o: CosineAnnealingWarmRestarts(o, T_0=4),
    "plateau_min_rel": lambda o: ReduceLROnPlateau(o, patience=1),
    "plateau_max_abs": lambda o: ReduceLROnPlateau(
        o, mode="max", factor=0.5, patience=0, threshold=0.05,
        threshold_mode="abs", cooldown=2, min_lr=[0.02, 0.004]),
    "plateau_min_abs_cooldown": lambda o: ReduceLROnPlateau(
        o, factor=0.3, patience=2, threshold=0.01, threshold_mode="abs",
        cooldown=1, min_lr=0.001, eps=1e-3),
}
out = {}
for name, make in cases.items():
    opt = torch.optim.SGD(groups(), lr=0.1)
    sched = make(opt)
    rows = [[g["lr"] for g in opt.param_groups]]
    for step in range(1, STEPS + 1):
        opt.step()
        if name.startswith("plateau"):
            sched.step(metric(step))
        else:
            sched.step()
        rows.append([g["lr"] for g in opt.param_groups])
        if name.endswith("manual") and step == 5:
            opt.param_groups[0]["lr"] *= 0.5
    out[name] = rows
print(json.dumps(out))
)PY";

using Optimizer = torch::optim::Optimizer;
using Make = std::function<std::unique_ptr<LRScheduler>(Optimizer&)>;

std::map<std::string, Make> Cases() {
  ReduceLROnPlateauOptions max_abs;
  max_abs.mode = "max";
  max_abs.factor = 0.5;
  max_abs.patience = 0;
  max_abs.threshold = 0.05;
  max_abs.threshold_mode = "abs";
  max_abs.cooldown = 2;
  max_abs.min_lr = {0.02, 0.004};
  ReduceLROnPlateauOptions min_abs;
  min_abs.factor = 0.3;
  min_abs.patience = 2;
  min_abs.threshold = 0.01;
  min_abs.threshold_mode = "abs";
  min_abs.cooldown = 1;
  min_abs.min_lr = {0.001};
  min_abs.eps = 1e-3;
  ReduceLROnPlateauOptions min_rel;
  min_rel.patience = 1;
  return {
      {"exponential",
       [](Optimizer& o) { return std::make_unique<ExponentialLR>(o, 0.9); }},
      {"exponential_manual",
       [](Optimizer& o) { return std::make_unique<ExponentialLR>(o, 0.8); }},
      {"multistep",
       [](Optimizer& o) {
         return std::make_unique<MultiStepLR>(
             o, std::vector<int64_t>{7, 3, 3, 11}, 0.5);
       }},
      {"cosine",
       [](Optimizer& o) {
         return std::make_unique<CosineAnnealingLR>(o, 5, 0.001);
       }},
      {"cosine_manual",
       [](Optimizer& o) { return std::make_unique<CosineAnnealingLR>(o, 7); }},
      {"warm_restarts",
       [](Optimizer& o) {
         return std::make_unique<CosineAnnealingWarmRestarts>(o, 3, 2, 0.001);
       }},
      {"warm_restarts_1",
       [](Optimizer& o) {
         return std::make_unique<CosineAnnealingWarmRestarts>(o, 4);
       }},
      {"plateau_min_rel",
       [min_rel](Optimizer& o) {
         return std::make_unique<ReduceLROnPlateau>(o, min_rel);
       }},
      {"plateau_max_abs",
       [max_abs](Optimizer& o) {
         return std::make_unique<ReduceLROnPlateau>(o, max_abs);
       }},
      {"plateau_min_abs_cooldown",
       [min_abs](Optimizer& o) {
         return std::make_unique<ReduceLROnPlateau>(o, min_abs);
       }},
  };
}

void Step(LRScheduler& scheduler, int step) {
  if (auto* plateau = dynamic_cast<ReduceLROnPlateau*>(&scheduler)) {
    plateau->step(Metric(step));
  } else {
    scheduler.step();
  }
}

bool EndsWith(const std::string& text, const std::string& end) {
  return text.size() >= end.size() &&
         text.compare(text.size() - end.size(), end.size(), end) == 0;
}

TEST(LrSchedulersTest, MatchTorchStepByStepBitForBit) {
  const nlohmann::json expected = testing::TorchReference(kPython);
  const auto cases = Cases();
  ASSERT_EQ(expected.size(), cases.size());
  for (const auto& [name, make] : cases) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(expected.contains(name));
    torch::optim::SGD optimizer(TwoGroups(), torch::optim::SGDOptions(0.1));
    std::unique_ptr<LRScheduler> scheduler = make(optimizer);
    int reductions = 0;
    for (int step = 0; step <= kSteps; ++step) {
      if (step > 0) Step(*scheduler, step);
      ASSERT_EQ(scheduler->last_epoch(), step);
      for (size_t group = 0; group < 2; ++group) {
        const double want = expected[name][step][group].get<double>();
        EXPECT_EQ(Lr(optimizer, group), want)
            << "step " << step << " group " << group;
        EXPECT_EQ(scheduler->get_last_lr()[group], want);
      }
      if (step > 0 && expected[name][step][0] != expected[name][step - 1][0]) {
        ++reductions;
      }
      if (EndsWith(name, "manual") && step == 5) {
        auto& options = optimizer.param_groups()[0].options();
        options.set_lr(options.get_lr() * 0.5);
      }
    }
    // Each case changes its lrs (a case that never moves would prove
    // nothing about the schedule).
    EXPECT_GT(reductions, 1);
  }
}

// The values in lr_schedulers.h's header comment.
TEST(LrSchedulersTest, HeaderExamplesHold) {
  auto lrs = [](auto make, int steps) {
    torch::optim::SGD optimizer({torch::ones({1})},
                                torch::optim::SGDOptions(1.0));
    auto scheduler = make(optimizer);
    std::vector<double> values = {Lr(optimizer, 0)};
    for (int i = 0; i < steps; ++i) {
      scheduler->step();
      values.push_back(std::round(Lr(optimizer, 0) * 1000) / 1000);
    }
    return values;
  };
  using ::testing::ElementsAre;
  EXPECT_THAT(
      lrs([](Optimizer& o) { return std::make_unique<ExponentialLR>(o, 0.5); },
          2),
      ElementsAre(1, .5, .25));
  EXPECT_THAT(lrs(
                  [](Optimizer& o) {
                    return std::make_unique<MultiStepLR>(
                        o, std::vector<int64_t>{2, 4}, 0.1);
                  },
                  5),
              ElementsAre(1, 1, .1, .1, .01, .01));
  EXPECT_THAT(lrs(
                  [](Optimizer& o) {
                    return std::make_unique<CosineAnnealingLR>(o, 4);
                  },
                  6),
              ElementsAre(1, .854, .5, .146, 0, .146, .5));
  EXPECT_THAT(lrs(
                  [](Optimizer& o) {
                    return std::make_unique<CosineAnnealingWarmRestarts>(o, 2,
                                                                         2);
                  },
                  6),
              ElementsAre(1, .5, 1, .854, .5, .146, 1));
}

TEST(LrSchedulersTest, SaveLoadResumesTheScheduleAndItsArguments) {
  for (const auto& [name, make] : Cases()) {
    SCOPED_TRACE(name);
    torch::optim::SGD whole(TwoGroups(), torch::optim::SGDOptions(0.1));
    auto uninterrupted = make(whole);
    torch::optim::SGD first(TwoGroups(), torch::optim::SGDOptions(0.1));
    auto before = make(first);
    for (int step = 1; step <= 13; ++step) {
      Step(*uninterrupted, step);
      Step(*before, step);
    }
    const std::string bytes = SaveStateToBytes(*before);
    // The resumed run is built with other arguments: load() restores the
    // saved ones, as torch's load_state_dict does.
    torch::optim::SGD second(TwoGroups(), torch::optim::SGDOptions(0.7));
    std::unique_ptr<LRScheduler> after;
    if (name.rfind("plateau", 0) == 0) {
      after = std::make_unique<ReduceLROnPlateau>(second);
    } else if (name.rfind("exponential", 0) == 0) {
      after = std::make_unique<ExponentialLR>(second, 0.3);
    } else if (name == "multistep") {
      after = std::make_unique<MultiStepLR>(second, std::vector<int64_t>{1});
    } else if (name.rfind("cosine", 0) == 0) {
      after = std::make_unique<CosineAnnealingLR>(second, 2);
    } else {
      after = std::make_unique<CosineAnnealingWarmRestarts>(second, 9, 3);
    }
    LoadStateFromBytes(*after, bytes);
    for (int step = 14; step <= kSteps; ++step) {
      Step(*uninterrupted, step);
      Step(*after, step);
      ASSERT_EQ(Lr(second, 0), Lr(whole, 0)) << "step " << step;
      ASSERT_EQ(Lr(second, 1), Lr(whole, 1)) << "step " << step;
    }
    EXPECT_EQ(after->last_epoch(), kSteps);
  }
}

TEST(LrSchedulersTest, LoadOfAnotherScheduleIsACheckpointErrorAndKeepsState) {
  torch::optim::SGD optimizer({torch::ones({1})}, torch::optim::SGDOptions(1));
  ExponentialLR exponential(optimizer, 0.5);
  const std::string bytes = SaveStateToBytes(exponential);
  torch::optim::SGD other({torch::ones({1})}, torch::optim::SGDOptions(1));
  CosineAnnealingLR cosine(other, 4);
  cosine.step();
  const double lr = Lr(other, 0);
  EXPECT_THAT([&] { LoadStateFromBytes(cosine, bytes); },
              ThrowsMessage<CheckpointError>(
                  HasSubstr("CosineAnnealingLR state has no 'T_max'")));
  EXPECT_EQ(Lr(other, 0), lr);
  EXPECT_EQ(cosine.last_epoch(), 1);
}

TEST(LrSchedulersTest, RejectBadArguments) {
  torch::optim::SGD optimizer(TwoGroups(), torch::optim::SGDOptions(0.1));
  const double inf = std::numeric_limits<double>::infinity();
  auto expect_usage = [](auto make, const std::string& message) {
    EXPECT_THAT(make, ThrowsMessage<UsageError>(HasSubstr(message)));
  };
  expect_usage([&] { ExponentialLR(optimizer, -1); },
               "ExponentialLR: gamma must be finite and >= 0, found -1");
  expect_usage([&] { ExponentialLR(optimizer, inf); }, "gamma must be finite");
  expect_usage(
      [&] {
        MultiStepLR(optimizer, {3, -2});
      },
      "MultiStepLR: milestones must be >= 0, found -2");
  expect_usage([&] { CosineAnnealingLR(optimizer, 0); },
               "CosineAnnealingLR: t_max must be > 0, found 0");
  expect_usage([&] { CosineAnnealingLR(optimizer, 3, NAN); },
               "eta_min must be finite");
  expect_usage([&] { CosineAnnealingWarmRestarts(optimizer, 2, 0); },
               "CosineAnnealingWarmRestarts: t_mult must be > 0, found 0");
  expect_usage([&] { CosineAnnealingWarmRestarts(optimizer, -1); },
               "t_0 must be > 0");
  auto plateau = [&](auto change, const std::string& message) {
    ReduceLROnPlateauOptions options;
    change(options);
    EXPECT_THAT([&] { ReduceLROnPlateau refused(optimizer, options); },
                ThrowsMessage<UsageError>(HasSubstr(message)));
  };
  plateau([](auto& o) { o.mode = "lowest"; },
          "mode must be \"min\" or \"max\", found \"lowest\"");
  plateau([](auto& o) { o.threshold_mode = "pct"; }, "threshold_mode must be");
  plateau([](auto& o) { o.factor = 1.0; },
          "factor must be >= 0 and < 1, found 1");
  plateau([](auto& o) { o.patience = -1; },
          "patience and cooldown must be >= 0");
  plateau(
      [](auto& o) {
        o.min_lr = {0, 0, 0};
      },
      "expected 1 min_lr or 2 (one per param group), found 3");
  plateau([](auto& o) { o.eps = NAN; }, "eps must be finite");
}

TEST(LrSchedulersTest, PlateauStepsOnlyWithAMetric) {
  torch::optim::SGD optimizer({torch::ones({1})}, torch::optim::SGDOptions(1));
  ReduceLROnPlateau plateau(optimizer);
  LRScheduler& base = plateau;
  EXPECT_THAT([&] { base.step(); },
              ThrowsMessage<UsageError>(
                  HasSubstr("ReduceLROnPlateau: step() needs the metric: call "
                            "step(metric)")));
  EXPECT_EQ(plateau.last_epoch(), 0);
  plateau.step(1.5);
  EXPECT_EQ(plateau.last_epoch(), 1);
  EXPECT_EQ(plateau.best(), 1.5);
  // After a failed step() the next one with a metric still works.
  EXPECT_THROW(base.step(), UsageError);
  plateau.step(1.0);
  EXPECT_EQ(plateau.last_epoch(), 2);
}

}  // namespace
}  // namespace accel
