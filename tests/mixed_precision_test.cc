// fp16 loss scaling, prepared schedulers, automatic checkpoints of their
// state, object collectives and save_model, with every rank a process. The
// Accelerator here runs with --mixed_precision=fp16 (on the CPU: the loss
// scaling alone) and a project_dir.
#include <ATen/autocast_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>

#include "accel/optim/autocast.h"
#include "accel/runtime/base/errors.h"
#include "tests/multiprocess_main.h"

namespace accel::testing {

AcceleratorOptions TestAcceleratorOptions() {
  AcceleratorOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(20);
  options.seed = 1234;
  options.mixed_precision = "fp16";
  options.project_dir = std::string(std::getenv("TEST_TMPDIR")) + "/project_" +
                        std::getenv("WORLD_SIZE");
  return options;
}

namespace {

using ::testing::HasSubstr;

Accelerator& A() { return SharedAccelerator(); }
int N() { return A().num_processes(); }
int R() { return A().process_index(); }

torch::nn::Sequential MakeModel() {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::Tanh(),
                               torch::nn::Linear(8, 1));
}

std::vector<torch::Tensor> Snapshot(torch::nn::Module& model) {
  std::vector<torch::Tensor> values;
  for (auto& p : model.parameters()) values.push_back(p.detach().clone());
  return values;
}

bool Unchanged(torch::nn::Module& model, const std::vector<torch::Tensor>& v) {
  auto now = model.parameters();
  for (size_t i = 0; i < now.size(); ++i) {
    if (!torch::equal(now[i], v[i])) return false;
  }
  return true;
}

class MixedPrecisionTest : public ::testing::Test {
 protected:
  void TearDown() override {
    A().free_memory();
    A().set_gradient_accumulation_steps(1);
  }
  torch::Tensor Loss(torch::nn::Sequential& model) {
    return model->forward(torch::full({2, 4}, 0.1 * (R() + 1))).pow(2).sum();
  }
};

TEST_F(MixedPrecisionTest, AnOverflowOnOneRankSkipsTheStepOnEveryRank) {
  ASSERT_NE(A().scaler(), nullptr);
  torch::nn::Sequential net = MakeModel();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, optimizer, scheduler] =
      A().prepare(net, sgd, get_linear_schedule_with_warmup(sgd, 0, 1000));
  const double scale = A().scaler()->get_scale();
  // A clean step: the optimizer moves, the scheduler steps once per process.
  A().backward(Loss(model));
  auto before = Snapshot(*model);
  optimizer.step();
  scheduler.step();
  optimizer.zero_grad();
  EXPECT_FALSE(A().optimizer_step_was_skipped());
  EXPECT_FALSE(Unchanged(*model, before));
  EXPECT_EQ(scheduler->last_epoch(), N());
  // The last rank's gradient overflows after the sync.
  A().backward(Loss(model));
  if (A().is_last_process()) {
    model->parameters()[0].mutable_grad()[0][0] =
        std::numeric_limits<float>::infinity();
  }
  before = Snapshot(*model);
  optimizer.step();
  scheduler.step();
  optimizer.zero_grad();
  EXPECT_TRUE(A().optimizer_step_was_skipped()) << "rank " << R();
  EXPECT_TRUE(optimizer.step_was_skipped());
  EXPECT_TRUE(Unchanged(*model, before));
  EXPECT_EQ(A().scaler()->get_scale(), scale / 2);
  EXPECT_EQ(scheduler->last_epoch(), N());  // Not stepped after a skip.
}

TEST_F(MixedPrecisionTest, ClippingUnscalesTheGradientsOnce) {
  torch::nn::Sequential net = MakeModel();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  // The unscaled, synced gradient norm, computed without accel.
  torch::nn::Sequential reference = MakeModel();
  torch::Tensor mean_loss = torch::zeros({});
  for (int r = 0; r < N(); ++r) {
    mean_loss =
        mean_loss +
        reference->forward(torch::full({2, 4}, 0.1 * (r + 1))).pow(2).sum();
  }
  (mean_loss / N()).backward();
  double expected = 0;
  for (auto& p : reference->parameters()) {
    expected += p.grad().pow(2).sum().item<double>();
  }
  expected = std::sqrt(expected);

  auto [model, optimizer] = A().prepare(net, sgd);
  A().backward(Loss(model));
  const double norm = A().clip_grad_norm_(model->parameters(), 1e9);
  EXPECT_NEAR(norm, expected, 1e-4 * expected);
  const auto before = Snapshot(*model);
  optimizer.step();  // Does not divide by the scale a second time.
  optimizer.zero_grad();
  auto after = model->parameters();
  auto grads_applied = (before[0] - after[0]).abs().max().item<double>();
  EXPECT_GT(grads_applied, 1e-6);
  EXPECT_LT(grads_applied, 10.0);
}

TEST_F(MixedPrecisionTest, SchedulerWaitsForTheMicroStepsThatSync) {
  A().set_gradient_accumulation_steps(2);
  torch::nn::Sequential net = MakeModel();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, optimizer, scheduler] =
      A().prepare(net, sgd, get_constant_schedule_with_warmup(sgd, 50));
  for (int micro = 0; micro < 4; ++micro) {
    auto accumulate = A().accumulate(model);
    A().backward(Loss(model));
    optimizer.step();
    scheduler.step();
    optimizer.zero_grad();
  }
  EXPECT_EQ(scheduler->last_epoch(), 2 * N());
  EXPECT_DOUBLE_EQ(scheduler.get_last_lr()[0], 0.1 * (2.0 * N()) / 50);
}

class Numbers {
 public:
  torch::Tensor get(size_t i) { return torch::full({4}, 0.01 * i); }
  size_t size() const { return 24; }
};

TEST_F(MixedPrecisionTest, WithSplitBatchesTheSchedulerStepsOncePerStep) {
  torch::nn::Sequential net = MakeModel();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  DataLoaderOptions options;
  options.batch_size = 6;
  options.split_batches = true;
  DataLoader<Numbers> data(Numbers(), options);
  auto [model, optimizer, loader, scheduler] =
      A().prepare(net, sgd, data, get_constant_schedule_with_warmup(sgd, 50));
  int steps = 0;
  for (auto& batch : loader) {
    A().backward(model->forward(batch).sum());
    optimizer.step();
    scheduler.step();
    optimizer.zero_grad();
    ++steps;
  }
  EXPECT_EQ(steps, 4);
  EXPECT_EQ(scheduler->last_epoch(), 4);
}

// Rank 0 alone would reduce at the third evaluation (1, 5, 5 at patience
// 1), rank 1 alone never (3, -1, -1): agreed, the mean is 2 each time at 2
// processes, and every rank reduces at the third, stepping once per call.
TEST_F(MixedPrecisionTest, APreparedPlateauAgreesOnTheMetricAndStepsOnce) {
  torch::nn::Sequential net = MakeModel();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  ReduceLROnPlateauOptions options;
  options.patience = 1;
  options.factor = 0.5;
  auto [model, optimizer, plateau] =
      A().prepare(net, sgd, std::make_unique<ReduceLROnPlateau>(sgd, options));
  const double first = R() == 0 ? 1.0 : R() == 1 ? 3.0 : 2.0;
  const double later = R() == 0 ? 5.0 : R() == 1 ? -1.0 : 2.0;
  plateau.step(first);
  EXPECT_EQ(plateau->last_epoch(), 1);
  plateau.step(later);
  EXPECT_EQ(sgd.param_groups()[0].options().get_lr(), 0.1);
  plateau.step(later);
  EXPECT_EQ(plateau->last_epoch(), 3);
  EXPECT_EQ(sgd.param_groups()[0].options().get_lr(), 0.05);
  auto& reduce = static_cast<ReduceLROnPlateau&>(plateau.scheduler());
  EXPECT_EQ(reduce.best(), N() == 1 ? 1.0 : 2.0);
  // The same value on every rank is used as it is, bit for bit.
  plateau.step(0.1 + 0.2);
  EXPECT_EQ(reduce.best(), 0.1 + 0.2);
  EXPECT_THAT([&] { plateau.step(); },
              ::testing::ThrowsMessage<UsageError>(
                  HasSubstr("step() needs the metric")));
  auto other = A().prepare(get_constant_schedule(sgd));
  EXPECT_THAT([&] { other.step(1.0); },
              ::testing::ThrowsMessage<UsageError>(
                  HasSubstr("only a ReduceLROnPlateau steps with a metric")));
}

TEST_F(MixedPrecisionTest, ScalerAndSchedulerStateComeBackFromACheckpoint) {
  torch::nn::Sequential net = MakeModel();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, optimizer, scheduler] =
      A().prepare(net, sgd, get_cosine_schedule_with_warmup(sgd, 2, 20));
  for (int step = 0; step < 3; ++step) {
    A().backward(Loss(model));
    optimizer.step();
    scheduler.step();
    optimizer.zero_grad();
  }
  const double scale = A().scaler()->get_scale();
  const int64_t epoch = scheduler->last_epoch();
  const double lr = scheduler.get_last_lr()[0];
  const std::string saved = A().save_state();
  // Change both: an overflow halves the scale; more steps move the schedule.
  A().backward(Loss(model));
  model->parameters()[0].mutable_grad()[0][0] = std::nan("");
  optimizer.step();
  A().backward(Loss(model));
  optimizer.step();
  scheduler.step();
  ASSERT_NE(A().scaler()->get_scale(), scale);
  EXPECT_EQ(A().load_state(), saved);
  EXPECT_EQ(A().scaler()->get_scale(), scale);
  EXPECT_EQ(scheduler->last_epoch(), epoch);
  EXPECT_EQ(scheduler.get_last_lr()[0], lr);
  EXPECT_EQ(sgd.param_groups()[0].options().get_lr(), lr);
}

TEST_F(MixedPrecisionTest, LoadStateFallsBackPastADamagedCheckpoint) {
  torch::nn::Sequential net = MakeModel();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, optimizer] = A().prepare(net, sgd);
  const std::string good = A().save_state();
  const std::string damaged = A().save_state();
  A().wait_for_everyone();
  if (A().is_last_process()) {
    // This rank's own file of the newest checkpoint is damaged.
    FILE* f =
        std::fopen((damaged + "/" + RandomStatesFile(R())).c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 60, SEEK_SET);
    std::fputc('X', f);
    std::fclose(f);
  }
  A().wait_for_everyone();
  EXPECT_EQ(A().load_state(), good);
}

// A folder given by name: one rank's damaged file stops every rank before
// any of them changes its state.
TEST_F(MixedPrecisionTest, LoadStateOfAFolderFailsOnEveryRankIfOneCannot) {
  torch::nn::Sequential net = MakeModel();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, optimizer] = A().prepare(net, sgd);
  const std::string saved = A().save_state();
  A().backward(Loss(model));
  optimizer.step();
  const std::vector<torch::Tensor> trained = Snapshot(*model);
  A().wait_for_everyone();
  if (A().is_last_process()) {
    std::fclose(std::fopen((saved + "/" + RandomStatesFile(R())).c_str(), "w"));
  }
  A().wait_for_everyone();
  std::string message = "no CheckpointError";
  try {
    A().load_state(saved);
  } catch (const CheckpointError& e) {
    message = e.what();
  }
  if (N() > 1) {
    EXPECT_THAT(message,
                HasSubstr("cannot load checkpoint '" + saved + "': rank " +
                          std::to_string(N() - 1) + ": "));
  }
  EXPECT_THAT(message, HasSubstr(RandomStatesFile(N() - 1)));
  EXPECT_TRUE(Unchanged(*model, trained));
}

TEST_F(MixedPrecisionTest, AutocastRunsMatmulsInTheLowerPrecision) {
  torch::nn::Linear linear(4, 2);
  {
    // fp16 on a CPU: LibTorch 1.13 has no float16 autocast there.
    auto autocast = A().autocast();
    EXPECT_EQ(linear->forward(torch::ones({1, 4})).scalar_type(),
              torch::kFloat32);
  }
  {
    AutocastScope bf16(c10::DeviceType::CPU, c10::ScalarType::BFloat16);
    EXPECT_EQ(linear->forward(torch::ones({1, 4})).scalar_type(),
              torch::kBFloat16);
    { AutocastScope nested(c10::DeviceType::CPU, c10::ScalarType::BFloat16); }
    EXPECT_EQ(linear->forward(torch::ones({1, 4})).scalar_type(),
              torch::kBFloat16);
  }
  EXPECT_EQ(linear->forward(torch::ones({1, 4})).scalar_type(),
            torch::kFloat32);
}

// --mixed_precision=bf16 takes effect on the prepared model with no code in
// the loop, as Accelerate's prepare() wraps forward (it did nothing unless
// the program opened accelerator.autocast() itself). The gradients, the
// optimizer's step and the parameters stay float32, and a step's update
// reaches the next forward (no stale casted weight).
TEST_F(MixedPrecisionTest, APreparedModelComputesInBf16WithNoCodeInTheLoop) {
  AcceleratorOptions options = TestAcceleratorOptions();
  options.mixed_precision = "bf16";
  options.project_dir = "";  // The shared Accelerator's is in use.
  torch::manual_seed(3);
  torch::nn::Linear linear(4, 2);
  torch::optim::SGD sgd(linear->parameters(), torch::optim::SGDOptions(0.5));
  const torch::Tensor x = torch::rand({3, 4});
  {
    Accelerator bf16(options);
    auto [model, optimizer] = bf16.prepare(linear, sgd);
    const torch::Tensor out = model->forward(x);
    EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
    bf16.backward(out.sum());
    EXPECT_EQ(linear->weight.grad().scalar_type(), torch::kFloat32);
    const torch::Tensor before = linear->weight.detach().clone();
    optimizer.step();
    optimizer.zero_grad();
    EXPECT_EQ(linear->weight.scalar_type(), torch::kFloat32);
    EXPECT_FALSE(torch::equal(linear->weight, before));
    const torch::Tensor expected = torch::nn::functional::linear(
        x.to(torch::kBFloat16), linear->weight.detach().to(torch::kBFloat16),
        linear->bias.detach().to(torch::kBFloat16));
    EXPECT_TRUE(torch::equal(model->forward(x), expected));
    {
      AutocastKwargs full;
      full.enabled = false;
      auto off = bf16.autocast(full);
      EXPECT_EQ(model->forward(x).scalar_type(), torch::kFloat32);
    }
    EXPECT_EQ(model->forward(x).scalar_type(), torch::kBFloat16);
  }
  // Until the Accelerator ends.
  EXPECT_EQ(linear->forward(x).scalar_type(), torch::kFloat32);
}

// A scope that keeps casted weights (AutocastKwargs' cache_enabled, torch's
// default) under prepare()'s autocast: each step's forward sees the weights
// the last step wrote. The floor held LibTorch's cache open, and the
// scope's casts of step 0 served every later step.
TEST_F(MixedPrecisionTest, ACachingScopeSeesEveryStepsWeights) {
  AcceleratorOptions options = TestAcceleratorOptions();
  options.mixed_precision = "bf16";
  options.project_dir = "";
  torch::manual_seed(5);
  torch::nn::Linear linear(4, 2);
  torch::optim::SGD sgd(linear->parameters(), torch::optim::SGDOptions(10));
  const torch::Tensor x = torch::rand({3, 4});
  Accelerator bf16(options);
  auto [model, optimizer] = bf16.prepare(linear, sgd);
  AutocastKwargs cached;
  cached.cache_enabled = true;
  for (int step = 0; step < 3; ++step) {
    torch::Tensor out;
    {
      auto scope = bf16.autocast(cached);
      out = model->forward(x);
      EXPECT_TRUE(at::autocast::is_autocast_cache_enabled());
    }
    const torch::Tensor fresh = torch::nn::functional::linear(
        x.to(torch::kBFloat16), linear->weight.detach().to(torch::kBFloat16),
        linear->bias.detach().to(torch::kBFloat16));
    EXPECT_TRUE(torch::equal(out, fresh)) << "step " << step;
    bf16.backward(out.sum());
    optimizer.step();
    optimizer.zero_grad();
  }
  EXPECT_FALSE(at::autocast::is_autocast_cache_enabled());  // The floor's.
}

// Scopes and prepare() in any order: a model prepared inside a scope
// stays under autocast once the scope ends (it fell back to float32), and
// free_memory() ends it (it turned it on for good).
TEST_F(MixedPrecisionTest, PrepareInsideAScopeKeepsTheModelInBf16) {
  AcceleratorOptions options = TestAcceleratorOptions();
  options.mixed_precision = "bf16";
  options.project_dir = "";
  torch::nn::Linear linear(4, 2);
  const torch::Tensor x = torch::rand({3, 4});
  Accelerator bf16(options);
  std::optional<AutocastScope> scope(bf16.autocast());
  auto model = bf16.prepare(linear);
  scope.reset();
  EXPECT_EQ(model->forward(x).scalar_type(), torch::kBFloat16);
  {
    // A scope left open past another's end.
    std::optional<AutocastScope> outer(bf16.autocast());
    AutocastKwargs full;
    full.enabled = false;
    std::optional<AutocastScope> off(bf16.autocast(full));
    outer.reset();
    EXPECT_EQ(model->forward(x).scalar_type(), torch::kFloat32);
    off.reset();
    EXPECT_EQ(model->forward(x).scalar_type(), torch::kBFloat16);
  }
  bf16.free_memory();
  EXPECT_EQ(linear->forward(x).scalar_type(), torch::kFloat32);
}

// Two Accelerators on one thread: the second one's end took the first
// one's autocast with it, and the first's model ran in float32.
TEST_F(MixedPrecisionTest, ASecondAcceleratorLeavesTheFirstsAutocast) {
  AcceleratorOptions options = TestAcceleratorOptions();
  options.mixed_precision = "bf16";
  options.project_dir = "";
  torch::nn::Linear linear(4, 2), other(4, 2);
  const torch::Tensor x = torch::rand({3, 4});
  {
    Accelerator first(options);
    auto model = first.prepare(linear);
    {
      Accelerator second(options);
      second.prepare(other);
    }
    EXPECT_EQ(model->forward(x).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(linear->forward(x).scalar_type(), torch::kFloat32);
}

TEST_F(MixedPrecisionTest, GatherObjectAndBroadcastObjectList) {
  const std::vector<std::string> all = A().gather_object(
      std::vector<std::string>(R() + 1, std::string(R(), 'x')));
  ASSERT_EQ(all.size(), static_cast<size_t>(N() * (N() + 1) / 2));
  EXPECT_EQ(all.back(), std::string(N() - 1, 'x'));
  std::vector<std::pair<std::string, double>> config;
  if (A().is_last_process()) config = {{"lr", 0.5}, {"name", 2.0}};
  A().broadcast_object_list(config, N() - 1);
  ASSERT_EQ(config.size(), 2u);
  EXPECT_EQ(config[0].first, "lr");
  EXPECT_EQ(config[1].second, 2.0);
}

TEST_F(MixedPrecisionTest, SaveModelWritesSafetensorsThatLoadBack) {
  torch::nn::Sequential model = A().prepare(MakeModel());
  const std::string dir = A().project_dir() + "/weights";
  A().save_model(model, dir, "200B");  // Several shards.
  A().wait_for_everyone();
  torch::nn::Sequential copy(torch::nn::Linear(4, 8), torch::nn::Tanh(),
                             torch::nn::Linear(8, 1));
  LoadModelWeightsInto(*copy, dir);
  for (size_t i = 0; i < copy->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(copy->parameters()[i], model->parameters()[i]));
  }
  const auto state = A().get_state_dict(model);
  EXPECT_EQ(state.count("0.weight"), 1u);
  EXPECT_TRUE(torch::equal(state.at("2.bias"), model->parameters()[3]));
}

}  // namespace
}  // namespace accel::testing
