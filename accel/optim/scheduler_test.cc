// The schedules against python3-torch's own LambdaLR/StepLR running
// transformers' formulas, the header's documented values, argument checks,
// and save/load.
#include "accel/optim/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "accel/core/state_archive.h"
#include "accel/runtime/base/errors.h"
#include "tests/torch_reference.h"

namespace accel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// An SGD optimizer with two param groups (lrs 0.1 and 0.02; default 0.1),
// as the Python side builds it.
struct TwoGroups {
  TwoGroups()
      : optimizer({torch::optim::OptimizerParamGroup({torch::ones({2})}),
                   torch::optim::OptimizerParamGroup(
                       {torch::ones({3})},
                       std::make_unique<torch::optim::SGDOptions>(0.02))},
                  torch::optim::SGDOptions(0.1)) {}
  double lr(size_t group) const {
    return optimizer.param_groups()[group].options().get_lr();
  }
  torch::optim::SGD optimizer;
};

// The same schedules in Python: transformers' formulas (as in
// transformers/optimization.py) on torch's LambdaLR, and torch's StepLR.
constexpr char kPythonSchedules[] = R"PY(
import json, math, torch
from torch.optim.lr_scheduler import LambdaLR, StepLR

def warmup(step, w):
    return float(step) / float(max(1, w))

def constant_with_warmup(w):
    return lambda s: warmup(s, w) if s < w else 1.0

def linear(w, t):
    def f(s):
        if s < w: return warmup(s, w)
        return max(0.0, float(t - s) / float(max(1, t - w)))
    return f

def cosine(w, t, cycles):
    def f(s):
        if s < w: return warmup(s, w)
        progress = float(s - w) / float(max(1, t - w))
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(cycles) * 2.0 * progress)))
    return f

def hard_restarts(w, t, cycles):
    def f(s):
        if s < w: return warmup(s, w)
        progress = float(s - w) / float(max(1, t - w))
        if progress >= 1.0: return 0.0
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(cycles) * progress) % 1.0))))
    return f

def polynomial(w, t, lr_init, lr_end, power):
    def f(s):
        if s < w: return warmup(s, w)
        if s > t: return lr_end / lr_init
        pct_remaining = 1 - (s - w) / (t - w)
        return ((lr_init - lr_end) * pct_remaining**power + lr_end) / lr_init
    return f

cases = {
    "constant": lambda o: LambdaLR(o, lambda s: 1.0),
    "constant_with_warmup": lambda o: LambdaLR(o, constant_with_warmup(3)),
    "linear": lambda o: LambdaLR(o, linear(3, 10)),
    "linear_no_warmup": lambda o: LambdaLR(o, linear(0, 7)),
    "cosine": lambda o: LambdaLR(o, cosine(3, 10, 0.5)),
    "cosine_1.5_cycles": lambda o: LambdaLR(o, cosine(2, 12, 1.5)),
    "hard_restarts": lambda o: LambdaLR(o, hard_restarts(2, 12, 3)),
    "polynomial": lambda o: LambdaLR(o, polynomial(3, 10, 0.1, 1e-4, 2.0)),
    "exponential": lambda o: LambdaLR(o, lambda s: 0.95 ** s),
    "per_group": lambda o: LambdaLR(o, [lambda s: 1.0 / (s + 1), lambda s: s * 0.5]),
    "step_lr": lambda o: StepLR(o, step_size=3, gamma=0.1),
    "step_lr_1": lambda o: StepLR(o, step_size=1, gamma=0.7),
}
out = {}
for name, make in cases.items():
    opt = torch.optim.SGD([{"params": [torch.ones(2)]},
                           {"params": [torch.ones(3)], "lr": 0.02}], lr=0.1)
    sched = make(opt)
    lrs = [sched.get_last_lr()]
    for _ in range(STEPS):
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr())
    out[name] = lrs
print(json.dumps(out))
)PY";

constexpr int kSteps = 16;

using Factory =
    std::function<std::unique_ptr<LRScheduler>(torch::optim::Optimizer&)>;

std::map<std::string, Factory> Cases() {
  using Optimizer = torch::optim::Optimizer;
  return {
      {"constant", [](Optimizer& o) { return get_constant_schedule(o); }},
      {"constant_with_warmup",
       [](Optimizer& o) { return get_constant_schedule_with_warmup(o, 3); }},
      {"linear",
       [](Optimizer& o) { return get_linear_schedule_with_warmup(o, 3, 10); }},
      {"linear_no_warmup",
       [](Optimizer& o) { return get_linear_schedule_with_warmup(o, 0, 7); }},
      {"cosine",
       [](Optimizer& o) { return get_cosine_schedule_with_warmup(o, 3, 10); }},
      {"cosine_1.5_cycles",
       [](Optimizer& o) {
         return get_cosine_schedule_with_warmup(o, 2, 12, 1.5);
       }},
      {"hard_restarts",
       [](Optimizer& o) {
         return get_cosine_with_hard_restarts_schedule_with_warmup(o, 2, 12, 3);
       }},
      {"polynomial",
       [](Optimizer& o) {
         return get_polynomial_decay_schedule_with_warmup(o, 3, 10, 1e-4, 2.0);
       }},
      {"exponential",
       [](Optimizer& o) {
         return std::make_unique<LambdaLR>(
             o, [](int64_t s) { return std::pow(0.95, s); });
       }},
      {"per_group",
       [](Optimizer& o) {
         return std::make_unique<LambdaLR>(
             o, std::vector<LambdaLR::Factor>{
                    [](int64_t s) { return 1.0 / (s + 1); },
                    [](int64_t s) { return s * 0.5; }});
       }},
      {"step_lr",
       [](Optimizer& o) { return std::make_unique<StepLR>(o, 3, 0.1); }},
      {"step_lr_1",
       [](Optimizer& o) { return std::make_unique<StepLR>(o, 1, 0.7); }},
  };
}

TEST(SchedulerTest, MatchesTorchAndTransformersStepByStep) {
  std::string script = kPythonSchedules;
  script.replace(script.find("STEPS"), 5, std::to_string(kSteps));
  const nlohmann::json expected = testing::TorchReference(script);

  const auto cases = Cases();
  ASSERT_EQ(expected.size(), cases.size());
  for (const auto& [name, make] : cases) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(expected.contains(name));
    TwoGroups groups;
    std::unique_ptr<LRScheduler> scheduler = make(groups.optimizer);
    for (int step = 0; step <= kSteps; ++step) {
      if (step > 0) scheduler->step();
      const auto& want = expected[name][step];
      ASSERT_EQ(scheduler->last_epoch(), step);
      const std::vector<double> lrs = scheduler->get_last_lr();
      ASSERT_EQ(lrs.size(), 2u);
      for (size_t group = 0; group < 2; ++group) {
        // Bit for bit: the same operations in the same order as Python.
        EXPECT_EQ(lrs[group], want[group].get<double>())
            << "step " << step << " group " << group;
        EXPECT_EQ(groups.lr(group), lrs[group]);
      }
    }
  }
}

// torch's OneCycleLR on SGD (momentum cycles) and on AdamW (beta1 cycles):
// each step's lr of both groups and momentum of group 0.
constexpr char kPythonOneCycle[] = R"PY(
import json, torch
from torch.optim.lr_scheduler import OneCycleLR

def groups():
    return [{"params": [torch.ones(2)]}, {"params": [torch.ones(3)], "lr": 0.02}]

cases = {
    "sgd_cos": (lambda: torch.optim.SGD(groups(), lr=0.1, momentum=0.9),
                dict(max_lr=[1.0, 0.5], total_steps=10)),
    "adamw_linear_three_phase": (
        lambda: torch.optim.AdamW(groups(), lr=0.1),
        dict(max_lr=[0.3, 0.2], total_steps=13, pct_start=0.25,
             anneal_strategy="linear", three_phase=True, div_factor=10.0,
             final_div_factor=100.0, base_momentum=0.8, max_momentum=0.9)),
}
out = {}
for name, (make, kwargs) in cases.items():
    opt = make()
    sched = OneCycleLR(opt, **kwargs)
    def momentum():
        g = opt.param_groups[0]
        return g["betas"][0] if "betas" in g else g["momentum"]
    rows = [sched.get_last_lr() + [momentum()]]
    for _ in range(kwargs["total_steps"]):
        opt.step()
        sched.step()
        rows.append(sched.get_last_lr() + [momentum()])
    out[name] = rows
print(json.dumps(out))
)PY";

double Momentum(torch::optim::Optimizer& optimizer) {
  auto& options = optimizer.param_groups()[0].options();
  if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
    return std::get<0>(adamw->betas());
  }
  return static_cast<torch::optim::SGDOptions&>(options).momentum();
}

TEST(SchedulerTest, OneCycleMatchesTorchStepByStepAndStopsAtItsEnd) {
  const nlohmann::json expected = testing::TorchReference(kPythonOneCycle);
  auto param_groups = [] {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>{torch::ones({2})});
    groups.emplace_back(std::vector<torch::Tensor>{torch::ones({3})});
    return groups;
  };
  torch::optim::SGD sgd(param_groups(),
                        torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::AdamW adamw(param_groups(), torch::optim::AdamWOptions(0.1));
  OneCycleLROptions three_phase;
  three_phase.pct_start = 0.25;
  three_phase.anneal_strategy = "linear";
  three_phase.three_phase = true;
  three_phase.div_factor = 10;
  three_phase.final_div_factor = 100;
  three_phase.base_momentum = 0.8;
  three_phase.max_momentum = 0.9;
  struct Case {
    std::string name;
    torch::optim::Optimizer* optimizer;
    std::unique_ptr<OneCycleLR> scheduler;
  };
  std::vector<Case> cases;
  cases.push_back(
      {"sgd_cos", &sgd,
       std::make_unique<OneCycleLR>(sgd, std::vector<double>{1.0, 0.5}, 10)});
  cases.push_back({"adamw_linear_three_phase", &adamw,
                   std::make_unique<OneCycleLR>(
                       adamw, std::vector<double>{0.3, 0.2}, 13, three_phase)});
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto& rows = expected[c.name];
    EXPECT_EQ(c.scheduler->total_steps(),
              std::optional<int64_t>(rows.size() - 1));
    for (size_t step = 0; step < rows.size(); ++step) {
      if (step > 0) c.scheduler->step();
      const std::vector<double> lrs = c.scheduler->get_last_lr();
      EXPECT_EQ(lrs[0], rows[step][0].get<double>()) << "step " << step;
      EXPECT_EQ(lrs[1], rows[step][1].get<double>()) << "step " << step;
      EXPECT_EQ(Momentum(*c.optimizer), rows[step][2].get<double>())
          << "step " << step;
    }
    // torch raises past the end, and so does accel.
    EXPECT_THAT([&] { c.scheduler->step(); },
                ::testing::ThrowsMessage<UsageError>(
                    HasSubstr("Tried to step " + std::to_string(rows.size()) +
                              " times. The specified number of total steps "
                              "is " +
                              std::to_string(rows.size() - 1))));
  }
}

TEST(SchedulerTest, OneCycleSaveLoadRestoresItsPositionAndMomentum) {
  torch::optim::AdamW adamw({torch::ones({1})}, torch::optim::AdamWOptions(1));
  OneCycleLR scheduler(adamw, 1.0, 20);
  for (int i = 0; i < 7; ++i) scheduler.step();
  const std::string bytes = SaveStateToBytes(scheduler);
  const double lr = scheduler.get_last_lr()[0];
  const double beta1 = std::get<0>(static_cast<torch::optim::AdamWOptions&>(
                                       adamw.param_groups()[0].options())
                                       .betas());
  torch::optim::AdamW other({torch::ones({1})}, torch::optim::AdamWOptions(1));
  OneCycleLR resumed(other, 0.5, 40);  // Built otherwise: the state decides.
  LoadStateFromBytes(resumed, bytes);
  EXPECT_EQ(resumed.total_steps(), std::optional<int64_t>(20));
  EXPECT_EQ(resumed.get_last_lr()[0], lr);
  EXPECT_EQ(std::get<0>(static_cast<torch::optim::AdamWOptions&>(
                            other.param_groups()[0].options())
                            .betas()),
            beta1);
  scheduler.step();
  resumed.step();
  EXPECT_EQ(resumed.get_last_lr(), scheduler.get_last_lr());
}

TEST(SchedulerTest, OneCycleRejectsBadArguments) {
  torch::optim::SGD sgd({torch::ones({1})}, torch::optim::SGDOptions(1));
  EXPECT_THROW(OneCycleLR(sgd, 1.0, 0), UsageError);
  EXPECT_THROW(OneCycleLR(sgd, {1.0, 2.0}, 10), UsageError);
  OneCycleLROptions bad;
  bad.anneal_strategy = "exp";
  EXPECT_THROW(OneCycleLR(sgd, 1.0, 10, bad), UsageError);
  bad = {};
  bad.pct_start = 1.5;
  EXPECT_THROW(OneCycleLR(sgd, 1.0, 10, bad), UsageError);
  torch::optim::Adagrad adagrad({torch::ones({1})},
                                torch::optim::AdagradOptions(1));
  EXPECT_THAT([&] { OneCycleLR(adagrad, 1.0, 10); },
              ::testing::ThrowsMessage<UsageError>(
                  HasSubstr("must support momentum or beta1")));
  OneCycleLROptions no_momentum;
  no_momentum.cycle_momentum = false;
  EXPECT_NO_THROW(OneCycleLR(adagrad, 1.0, 10, no_momentum));
}

// The lrs of group 0 (base lr 1.0) for steps 0..n-1.
std::vector<double> Trace(
    const std::function<std::unique_ptr<LRScheduler>(torch::optim::Optimizer&)>&
        make,
    int n) {
  torch::optim::SGD optimizer({torch::ones({1})}, torch::optim::SGDOptions(1));
  std::unique_ptr<LRScheduler> scheduler = make(optimizer);
  std::vector<double> lrs;
  for (int step = 0; step < n; ++step) {
    if (step > 0) scheduler->step();
    lrs.push_back(std::round(scheduler->get_last_lr()[0] * 1000) / 1000);
  }
  return lrs;
}

TEST(SchedulerTest, HeaderExamplesHold) {
  using Optimizer = torch::optim::Optimizer;
  EXPECT_THAT(Trace([](Optimizer& o) { return get_constant_schedule(o); }, 3),
              ElementsAre(1, 1, 1));
  EXPECT_THAT(
      Trace(
          [](Optimizer& o) { return get_constant_schedule_with_warmup(o, 4); },
          6),
      ElementsAre(0, .25, .5, .75, 1, 1));
  const auto linear = Trace(
      [](Optimizer& o) { return get_linear_schedule_with_warmup(o, 2, 10); },
      12);
  EXPECT_THAT(std::vector<double>(linear.begin(), linear.begin() + 5),
              ElementsAre(0, .5, 1, .875, .75));
  EXPECT_EQ(linear[10], 0);
  EXPECT_EQ(linear[11], 0);
  EXPECT_THAT(
      Trace(
          [](Optimizer& o) { return get_cosine_schedule_with_warmup(o, 0, 4); },
          5),
      ElementsAre(1, .854, .5, .146, 0));
  EXPECT_THAT(Trace(
                  [](Optimizer& o) {
                    return get_cosine_with_hard_restarts_schedule_with_warmup(
                        o, 0, 4, 2);
                  },
                  5),
              ElementsAre(1, .5, 1, .5, 0));
  EXPECT_THAT(Trace(
                  [](Optimizer& o) {
                    return get_polynomial_decay_schedule_with_warmup(o, 0, 4,
                                                                     0.0, 2.0);
                  },
                  5),
              ElementsAre(1, .563, .25, .063, 0));
  EXPECT_THAT(Trace(
                  [](Optimizer& o) {
                    return std::make_unique<LambdaLR>(
                        o, [](int64_t step) { return std::pow(0.9, step); });
                  },
                  3),
              ElementsAre(1, .9, .81));
  EXPECT_THAT(
      Trace([](Optimizer& o) { return std::make_unique<StepLR>(o, 2, 0.1); },
            5),
      ElementsAre(1, 1, .1, .1, .01));
  EXPECT_THAT(
      Trace(
          [](Optimizer& o) { return std::make_unique<OneCycleLR>(o, 1.0, 10); },
          10),
      ElementsAre(.04, .52, 1, .95, .812, .611, .389, .188, .05, 0));
}

TEST(SchedulerTest, ConstructionPerformsTheInitialStep) {
  TwoGroups groups;
  auto scheduler = get_linear_schedule_with_warmup(groups.optimizer, 10, 100);
  EXPECT_EQ(scheduler->last_epoch(), 0);
  EXPECT_EQ(groups.lr(0), 0.0);  // Warmup starts at 0, like torch.
  EXPECT_THAT(scheduler->base_lrs(), ElementsAre(0.1, 0.02));
  scheduler->step();
  EXPECT_DOUBLE_EQ(groups.lr(0), 0.01);
  EXPECT_DOUBLE_EQ(groups.lr(1), 0.002);
}

// The header's example of a schedule of one's own.
class HalveEveryEpoch : public LRScheduler {
 public:
  HalveEveryEpoch(torch::optim::Optimizer& optimizer, int64_t steps_per_epoch)
      : LRScheduler(optimizer), steps_per_epoch_(steps_per_epoch) {
    InitialStep();
  }

 protected:
  std::vector<double> ComputeLearningRates(int64_t step) const override {
    std::vector<double> lrs;
    for (double base : base_lrs()) {
      lrs.push_back(base * std::pow(0.5, step / steps_per_epoch_));
    }
    return lrs;
  }

 private:
  int64_t steps_per_epoch_;
};

class ForgetsInitialStep : public LRScheduler {
 public:
  using LRScheduler::LRScheduler;

 protected:
  std::vector<double> ComputeLearningRates(int64_t) const override {
    return base_lrs();
  }
  const char* name() const override { return "ForgetsInitialStep"; }
};

TEST(SchedulerTest, SchedulesOfOnesOwn) {
  TwoGroups groups;
  HalveEveryEpoch scheduler(groups.optimizer, 2);
  for (int i = 0; i < 4; ++i) scheduler.step();
  EXPECT_THAT(scheduler.get_last_lr(), ElementsAre(0.025, 0.005));

  TwoGroups other;
  ForgetsInitialStep broken(other.optimizer);
  EXPECT_THAT([&] { broken.step(); },
              ::testing::ThrowsMessage<UsageError>(HasSubstr(
                  "ForgetsInitialStep::step: the scheduler's constructor did "
                  "not call InitialStep()")));
}

TEST(SchedulerTest, RejectsBadArguments) {
  TwoGroups groups;
  auto& o = groups.optimizer;
  EXPECT_THAT([&] { get_linear_schedule_with_warmup(o, -1, 10); },
              ::testing::ThrowsMessage<UsageError>(HasSubstr(
                  "get_linear_schedule_with_warmup: step counts "
                  "must not be negative, found num_warmup_steps -1")));
  EXPECT_THROW(get_constant_schedule_with_warmup(o, -5), UsageError);
  EXPECT_THROW(get_cosine_schedule_with_warmup(o, 0, -1), UsageError);
  EXPECT_THROW(get_cosine_schedule_with_warmup(o, 0, 10, NAN), UsageError);
  EXPECT_THROW(get_cosine_with_hard_restarts_schedule_with_warmup(o, 0, 10, -1),
               UsageError);
  EXPECT_THAT([&] { get_polynomial_decay_schedule_with_warmup(o, 5, 5); },
              ::testing::ThrowsMessage<UsageError>(
                  HasSubstr("num_training_steps (5) must exceed")));
  EXPECT_THAT(
      [&] { get_polynomial_decay_schedule_with_warmup(o, 0, 5, 0.5); },
      ::testing::ThrowsMessage<UsageError>(HasSubstr(
          "lr_end (0.500000) must be smaller than the optimizer's lr")));
  EXPECT_THAT([&] { StepLR(o, 0); }, ::testing::ThrowsMessage<UsageError>(
                                         HasSubstr("step_size must be > 0")));
  EXPECT_THROW(StepLR(o, 1, -0.5), UsageError);
  EXPECT_THAT(
      [&] {
        LambdaLR(o, std::vector<LambdaLR::Factor>{[](int64_t) { return 1.0; }});
      },
      ::testing::ThrowsMessage<UsageError>(
          HasSubstr("expected 2 factors (one per param group), found 1")));
  EXPECT_THROW(LambdaLR(o, LambdaLR::Factor()), UsageError);

  // A factor that is not finite fails at the step that produces it.
  LambdaLR diverging(o, [](int64_t step) { return 1.0 / (3 - step); });
  diverging.step();
  diverging.step();
  EXPECT_THAT(
      [&] { diverging.step(); },
      ::testing::ThrowsMessage<UsageError>(HasSubstr(
          "LambdaLR: learning rate of param group 0 at step 3 is inf")));
  EXPECT_EQ(diverging.last_epoch(), 2);  // Unchanged by the failed step.

  // Param groups added after the scheduler was built.
  TwoGroups more;
  auto scheduler = get_constant_schedule(more.optimizer);
  more.optimizer.add_param_group(
      torch::optim::OptimizerParamGroup({torch::ones({1})}));
  EXPECT_THAT([&] { scheduler->step(); },
              ::testing::ThrowsMessage<UsageError>(HasSubstr(
                  "the optimizer has 3 param groups, but the scheduler was "
                  "built for 2")));
}

void Load(LRScheduler& scheduler, const std::string& bytes) {
  LoadStateFromBytes(scheduler, bytes);
}

std::string Save(const LRScheduler& scheduler) {
  return SaveStateToBytes(scheduler);
}

TEST(SchedulerTest, SaveLoadResumesTheSchedule) {
  TwoGroups original;
  auto scheduler = get_cosine_schedule_with_warmup(original.optimizer, 3, 20);
  for (int i = 0; i < 7; ++i) scheduler->step();
  const std::string saved = Save(*scheduler);

  TwoGroups restored;
  auto resumed = get_cosine_schedule_with_warmup(restored.optimizer, 3, 20);
  Load(*resumed, saved);
  EXPECT_EQ(resumed->last_epoch(), 7);
  EXPECT_EQ(resumed->get_last_lr(), scheduler->get_last_lr());
  EXPECT_EQ(restored.lr(0), original.lr(0));
  EXPECT_EQ(restored.lr(1), original.lr(1));
  for (int i = 0; i < 5; ++i) {
    scheduler->step();
    resumed->step();
    EXPECT_EQ(resumed->get_last_lr(), scheduler->get_last_lr());
  }
}

TEST(SchedulerTest, StepLRLoadRestoresItsParameters) {
  TwoGroups original;
  StepLR scheduler(original.optimizer, 2, 0.5);
  for (int i = 0; i < 3; ++i) scheduler.step();
  TwoGroups restored;
  StepLR resumed(restored.optimizer, 10, 0.9);
  Load(resumed, Save(scheduler));
  EXPECT_EQ(resumed.step_size(), 2);
  EXPECT_EQ(resumed.gamma(), 0.5);
  scheduler.step();
  resumed.step();
  EXPECT_EQ(resumed.get_last_lr(), scheduler.get_last_lr());
  EXPECT_DOUBLE_EQ(resumed.get_last_lr()[0], 0.025);
}

TEST(SchedulerTest, MismatchedLoadIsACheckpointErrorAndChangesNothing) {
  TwoGroups two;
  auto saved_scheduler = get_linear_schedule_with_warmup(two.optimizer, 2, 9);
  for (int i = 0; i < 4; ++i) saved_scheduler->step();
  const std::string saved = Save(*saved_scheduler);

  torch::optim::SGD one({torch::ones({1})}, torch::optim::SGDOptions(0.3));
  auto scheduler = get_linear_schedule_with_warmup(one, 2, 9);
  EXPECT_THAT([&] { Load(*scheduler, saved); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("LambdaLR state is for 2 param groups, but the "
                            "optimizer has 1")));
  EXPECT_EQ(scheduler->last_epoch(), 0);
  EXPECT_THAT(scheduler->get_last_lr(), ElementsAre(0.0));

  // StepLR's own keys are missing from a LambdaLR's state.
  TwoGroups other;
  StepLR step_lr(other.optimizer, 2);
  EXPECT_THAT([&] { Load(step_lr, saved); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("StepLR state has no 'step_size'")));

  torch::serialize::OutputArchive empty;
  std::ostringstream bytes;
  empty.save_to(bytes);
  EXPECT_THAT([&] { Load(*scheduler, bytes.str()); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("LambdaLR state has no 'last_epoch'")));
}

}  // namespace
}  // namespace accel
