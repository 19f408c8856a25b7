// The training-loop half of Accelerate's API, with every rank a process:
// gradient accumulation, no_sync, clipping, gather_for_metrics, process
// control, typed prepare, mid-epoch checkpoints and end_training.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "accel/runtime/base/errors.h"
#include "tests/multiprocess_main.h"

namespace accel::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Accelerator& A() { return SharedAccelerator(); }
int N() { return A().num_processes(); }
int R() { return A().process_index(); }

// Samples of a random classification task, the same on every rank.
class Blobs : public torch::data::datasets::Dataset<Blobs> {
 public:
  explicit Blobs(int64_t samples) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(99);
    x_ = torch::randn({samples, 6}, generator);
    y_ = torch::randint(0, 2, {samples}, generator, torch::kLong);
  }
  torch::data::Example<> get(size_t i) override { return {x_[i], y_[i]}; }
  torch::optional<size_t> size() const override { return x_.size(0); }

 private:
  torch::Tensor x_, y_;
};

// Sample i is the number i.
class Indices {
 public:
  explicit Indices(size_t n) : n_(n) {}
  torch::Tensor get(size_t i) { return torch::tensor(static_cast<int64_t>(i)); }
  size_t size() const { return n_; }

 private:
  size_t n_;
};

torch::nn::Sequential MakeModel() {
  torch::manual_seed(7);  // The same initial weights everywhere.
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 2));
}

DataLoaderOptions Loader(size_t batch_size, bool shuffle = true) {
  DataLoaderOptions options;
  options.batch_size = batch_size;
  options.shuffle = shuffle;
  options.seed = 3;
  return options;
}

torch::Tensor Loss(torch::nn::Sequential& model,
                   const torch::data::Example<>& batch) {
  return torch::nn::functional::cross_entropy(model->forward(batch.data),
                                              batch.target);
}

double MaxDifference(torch::nn::Module& a, torch::nn::Module& b) {
  double worst = 0;
  auto pa = a.parameters();
  auto pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>());
  }
  return worst;
}

std::vector<torch::Tensor> Snapshot(torch::nn::Module& model) {
  std::vector<torch::Tensor> values;
  for (auto& p : model.parameters()) values.push_back(p.detach().clone());
  return values;
}

bool SameParameters(torch::nn::Module& model,
                    const std::vector<torch::Tensor>& values) {
  auto now = model.parameters();
  for (size_t i = 0; i < now.size(); ++i) {
    if (!torch::equal(now[i], values[i])) return false;
  }
  return true;
}

// Every prepared object is forgotten after each test, so that save_state and
// load_state see only the test's own.
class TrainingLoopTest : public ::testing::Test {
 protected:
  void TearDown() override {
    A().free_memory();
    A().set_gradient_accumulation_steps(1);
  }
};

TEST_F(TrainingLoopTest, GradientAccumulationMatchesOneStepOverTheBigBatch) {
  constexpr int kSteps = 2;
  constexpr size_t kMicroBatch = 2;
  constexpr int64_t kSamples = 72;  // Divisible by 2 * 2 * N for N = 1..3.
  A().set_gradient_accumulation_steps(kSteps);
  torch::nn::Sequential net = MakeModel();
  torch::optim::SGD sgd(net->parameters(),
                        torch::optim::SGDOptions(0.1).momentum(0.9));
  DataLoader<Blobs> data(Blobs(kSamples), Loader(kMicroBatch));
  auto [model, optimizer, loader] = A().prepare(net, sgd, data);
  int micro_steps = 0;
  for (auto& batch : loader) {
    auto accumulate = A().accumulate(model);
    const auto before = Snapshot(*model);
    A().backward(Loss(model, batch));
    optimizer.step();
    optimizer.zero_grad();
    ++micro_steps;
    // The optimizer moves only on every kSteps-th micro-step.
    EXPECT_EQ(A().sync_gradients(), micro_steps % kSteps == 0);
    EXPECT_EQ(!SameParameters(*model, before), A().sync_gradients())
        << "micro-step " << micro_steps;
  }
  // One process with the whole global batch of each optimizer step.
  torch::nn::Sequential reference = MakeModel();
  torch::optim::SGD reference_sgd(reference->parameters(),
                                  torch::optim::SGDOptions(0.1).momentum(0.9));
  DataLoader<Blobs> whole(Blobs(kSamples), Loader(kMicroBatch * kSteps * N()));
  for (auto& batch : whole) {
    Loss(reference, batch).backward();
    reference_sgd.step();
    reference_sgd.zero_grad();
  }
  EXPECT_LE(MaxDifference(*model, *reference), 1e-6);
  EXPECT_GT(MaxDifference(*model, *MakeModel()), 1e-3);  // It did train.
}

TEST_F(TrainingLoopTest, TheLastBatchOfTheLoaderAlwaysSyncs) {
  A().set_gradient_accumulation_steps(5);
  torch::nn::Sequential net = MakeModel();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  DataLoader<Blobs> data(Blobs(72), Loader(2));
  auto [model, optimizer, loader] = A().prepare(net, sgd, data);
  std::vector<bool> syncs;
  for (auto& batch : loader) {
    auto accumulate = A().accumulate(model);
    A().backward(Loss(model, batch));
    syncs.push_back(A().sync_gradients());
    optimizer.step();
    optimizer.zero_grad();
  }
  const size_t batches = 36 / N();  // 36, 18 or 12: not multiples of 5.
  ASSERT_EQ(syncs.size(), batches);
  for (size_t i = 0; i + 1 < batches; ++i) {
    EXPECT_EQ(syncs[i], (i + 1) % 5 == 0) << "batch " << i;
  }
  EXPECT_TRUE(syncs.back());
  // Every rank ends with the same parameters.
  torch::Tensor all = A().gather(
      model[0]->as<torch::nn::Linear>()->weight.detach().reshape({1, -1}));
  for (int r = 1; r < N(); ++r) EXPECT_TRUE(torch::equal(all[r], all[0]));
}

TEST_F(TrainingLoopTest, NoSyncKeepsGradientsLocalUntilASyncedBackward) {
  torch::nn::Sequential model = A().prepare(MakeModel());
  torch::Tensor x = torch::full({2, 6}, static_cast<float>(R() + 1));
  auto loss = [&] { return model->forward(x).sum(); };
  {
    auto no_sync = A().no_sync(model);
    A().backward(loss());
  }
  torch::Tensor local = model->parameters()[0].grad().clone();
  torch::Tensor all_local = A().gather(local.reshape({1, -1}));
  if (N() > 1) {
    EXPECT_FALSE(torch::equal(all_local[0], all_local[1]));
  }
  A().backward(loss());  // Synced: the average of what each rank has now.
  torch::Tensor synced = model->parameters()[0].grad();
  EXPECT_TRUE(torch::allclose(synced.reshape({-1}), (all_local * 2).mean(0),
                              1e-5, 1e-6));
  torch::nn::Sequential stranger = MakeModel();
  EXPECT_THAT(
      [&] {
        try {
          auto scope = A().no_sync(stranger);
        } catch (const UsageError& e) {
          return std::string(e.what());
        }
        return std::string();
      }(),
      HasSubstr("not prepared by this Accelerator"));
}

TEST_F(TrainingLoopTest, ClipGradNormReturnsTheNormOfTheSyncedGradients) {
  torch::nn::Sequential model = A().prepare(MakeModel());
  torch::Tensor x = torch::full({2, 6}, static_cast<float>(R() + 1));
  A().backward(model->forward(x).pow(2).sum() * 100);
  double expected = 0;
  for (auto& p : model->parameters())
    expected += p.grad().pow(2).sum().item<double>();
  expected = std::sqrt(expected);
  const double norm = A().clip_grad_norm_(model->parameters(), 1.0);
  EXPECT_NEAR(norm, expected, 1e-4 * expected);
  torch::Tensor norms = A().gather(torch::tensor({norm}, torch::kFloat64));
  for (int r = 1; r < N(); ++r) EXPECT_EQ(norms[r].item<double>(), norm);
  double after = 0;
  for (auto& p : model->parameters())
    after += p.grad().pow(2).sum().item<double>();
  EXPECT_NEAR(std::sqrt(after), 1.0, 1e-4);
  A().clip_grad_value_(model->parameters(), 0.001);
  for (auto& p : model->parameters()) {
    EXPECT_LE(p.grad().abs().max().item<double>(), 0.001 + 1e-9);
  }
}

TEST_F(TrainingLoopTest, GatherForMetricsGivesEachSampleOnceInDatasetOrder) {
  // 22 samples, batch 4: the last global batch is padded with duplicates.
  DataLoader<Indices> data(Indices(22), Loader(4, /*shuffle=*/false));
  auto loader = A().prepare(data);
  std::vector<torch::Tensor> seen;
  std::vector<torch::Tensor> seen_in_maps;
  std::vector<torch::Tensor> plain;
  for (auto& batch : loader) {
    seen.push_back(A().gather_for_metrics(batch));
    auto map = A().gather_for_metrics(
        std::map<std::string, torch::Tensor>{{"ids", batch * 2}});
    seen_in_maps.push_back(map["ids"] / 2);
    auto vector = A().gather_for_metrics(std::vector<torch::Tensor>{batch});
    EXPECT_TRUE(torch::equal(vector[0], seen.back()));
    plain.push_back(A().gather(batch));
  }
  EXPECT_TRUE(torch::equal(torch::cat(seen), torch::arange(22)));
  EXPECT_TRUE(torch::equal(torch::cat(seen_in_maps), torch::arange(22)));
  // gather keeps the duplicates: 24 samples at 2 and 3 processes.
  EXPECT_EQ(torch::cat(plain).size(0), N() == 1 ? 22 : 24);
  // Outside a loader's last batch it is a plain gather.
  EXPECT_EQ(A().gather_for_metrics(torch::ones({3})).size(0), 3 * N());
}

// A Python (predictions, labels) tuple ports as {predictions, labels} and
// unpacks into two tensors.
TEST_F(TrainingLoopTest, GatherForMetricsOfABracedPairUnpacksIntoTwo) {
  DataLoader<Indices> data(Indices(10), Loader(2, /*shuffle=*/false));
  auto loader = A().prepare(data);
  int64_t seen = 0;
  for (auto& batch : loader) {
    auto [ids, doubled] = A().gather_for_metrics({batch, batch * 2});
    static_assert(std::is_same_v<decltype(ids), torch::Tensor>);
    EXPECT_TRUE(torch::equal(doubled, ids * 2));
    seen += ids.size(0);
    auto [first, second] = A().gather({batch, batch + 1});
    EXPECT_EQ(first.size(0), 2 * N());
    EXPECT_TRUE(torch::equal(second, first + 1));
  }
  EXPECT_EQ(seen, 10);  // Duplicates of even_batches dropped, as for one.
}

TEST_F(TrainingLoopTest, MainProcessFirstRunsTheMainProcessBeforeTheOthers) {
  const std::string file = std::string(std::getenv("TEST_TMPDIR")) +
                           "/main_first_" + std::to_string(N());
  {
    auto first = A().main_process_first();
    if (A().is_main_process()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::ofstream(file) << "cached";
    } else {
      std::ifstream in(file);
      std::string content;
      in >> content;
      EXPECT_EQ(content, "cached") << "rank " << R() << " went first";
    }
  }
  { auto local = A().local_main_process_first(); }
  A().wait_for_everyone();
}

TEST_F(TrainingLoopTest, OnProcessWrappersRunOnlyWhereAsked) {
  int main_calls = 0, last_calls = 0, second_calls = 0;
  auto on_main = A().on_main_process([&](int add) { main_calls += add; });
  auto on_last = A().on_last_process([&] { ++last_calls; });
  auto on_second = A().on_process([&] { ++second_calls; }, 1);
  on_main(5);
  on_last();
  on_second();
  EXPECT_EQ(main_calls, A().is_main_process() ? 5 : 0);
  EXPECT_EQ(last_calls, A().is_last_process() ? 1 : 0);
  EXPECT_EQ(second_calls, R() == 1 ? 1 : 0);
  EXPECT_EQ(A().is_last_process(), R() == N() - 1);
  EXPECT_EQ(A().distributed_type(),
            N() == 1 ? DistributedType::kNo : DistributedType::kMultiCpu);
}

TEST_F(TrainingLoopTest, SplitBetweenProcessesGivesEachRankItsShare) {
  const std::vector<int> items = {0, 1, 2, 3, 4, 5, 6};
  const std::vector<int> mine = A().split_between_processes(items);
  // divmod: the first 7 % N ranks get one more.
  const size_t expected = 7 / N() + (R() < 7 % N() ? 1 : 0);
  EXPECT_EQ(mine.size(), expected);
  torch::Tensor all = A().gather(A().pad_across_processes(
      torch::tensor(std::vector<int64_t>(mine.begin(), mine.end())), 0, -1));
  std::vector<int64_t> flat;
  for (int64_t i = 0; i < all.numel(); ++i) {
    if (all[i].item<int64_t>() >= 0) flat.push_back(all[i].item<int64_t>());
  }
  EXPECT_THAT(flat, ElementsAre(0, 1, 2, 3, 4, 5, 6));
  // Padding: every rank the same length, the last element repeated.
  const auto padded = A().split_between_processes(items, true);
  EXPECT_EQ(padded.size(), static_cast<size_t>((7 + N() - 1) / N()));
  torch::Tensor rows = A().split_between_processes(torch::arange(7), true);
  EXPECT_EQ(rows.size(0), (7 + N() - 1) / N());
  auto map = A().split_between_processes(std::map<std::string, torch::Tensor>{
      {"a", torch::arange(7)}, {"b", torch::arange(7) * 10}});
  EXPECT_TRUE(torch::equal(map["b"], map["a"] * 10));
  EXPECT_THROW(A().split_between_processes(std::map<std::string, torch::Tensor>{
                   {"a", torch::arange(7)}, {"b", torch::arange(6)}}),
               UsageError);
}

TEST_F(TrainingLoopTest, CheckTriggerIsTrueEverywhereWhenOneRankRaisedIt) {
  if (A().is_last_process()) A().set_trigger();
  EXPECT_TRUE(A().check_trigger());
  EXPECT_FALSE(A().check_trigger());
}

struct Net : torch::nn::Module {
  Net() : fc(register_module("fc", torch::nn::Linear(6, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc->forward(x); }
  torch::nn::Linear fc;
};

TEST_F(TrainingLoopTest, APreparedScheduleWithAnEndNeverStepsPastIt) {
  torch::nn::Sequential net = MakeModel();
  torch::optim::SGD sgd(net->parameters(),
                        torch::optim::SGDOptions(0.1).momentum(0.9));
  DataLoader<Blobs> data(Blobs(20), Loader(4));
  // Counted before prepare, at one process: 5 steps of 4 samples. At N > 1
  // the prepared scheduler steps N times per step over 20 padded to 4 N
  // per step: more than 5 in all.
  const int64_t total = static_cast<int64_t>(data.size());
  auto [model, optimizer, loader, scheduler] = A().prepare(
      net, sgd, data, std::make_unique<OneCycleLR>(sgd, 1.0, total));
  int64_t asked = 0;
  for (auto& batch : loader) {
    A().backward(Loss(model, batch));
    optimizer.step();
    EXPECT_NO_THROW(scheduler.step());
    asked += N();
    optimizer.zero_grad();
  }
  if (N() > 1) {
    EXPECT_GT(asked, total);  // What torch would refuse.
  }
  EXPECT_EQ(scheduler->last_epoch(), total);
}

TEST_F(TrainingLoopTest, PrepareKeepsTheTypesItIsGiven) {
  auto net = A().prepare(std::make_shared<Net>());
  static_assert(std::is_same_v<decltype(net), std::shared_ptr<Net>>);
  EXPECT_EQ(net->forward(torch::ones({1, 6})).size(1), 2);
  torch::optim::AdamW adamw(net->parameters());
  auto optimizer = A().prepare(adamw);
  static_assert(std::is_same_v<decltype(optimizer),
                               AcceleratedOptimizer<torch::optim::AdamW>>);
  EXPECT_EQ(&optimizer.optimizer(), &adamw);
  EXPECT_EQ(&A().unwrap_model(net), &net);
}

// A user object whose state save_state carries.
struct Counter {
  int64_t value = 0;
  void save(torch::serialize::OutputArchive& archive) const {
    archive.write("value", c10::IValue(value));
  }
  void load(torch::serialize::InputArchive& archive) {
    c10::IValue v;
    archive.read("value", v);
    value = v.toInt();
  }
};

// A run of 3 epochs of 6 steps, saving after `save_after_steps` steps.
struct RunResult {
  std::vector<torch::Tensor> final_parameters;
  int64_t counter = 0;
};

RunResult Train(const std::string& save_to, int save_after_steps,
                const std::string& resume_from) {
  torch::nn::Sequential net = MakeModel();
  torch::optim::AdamW adamw(net->parameters(),
                            torch::optim::AdamWOptions(1e-2));
  DataLoaderOptions options = Loader(2);
  options.split_batches = true;
  options.batch_size = 6;  // Global; 6 / N per rank.
  DataLoader<Blobs> data(Blobs(36), options);
  auto [model, optimizer, loader] = A().prepare(net, adamw, data);
  Counter counter;
  A().register_for_checkpointing(counter);
  if (!resume_from.empty()) A().load_state(resume_from);
  int steps = static_cast<int>(loader.epoch()) * 6;
  for (int64_t epoch = loader.epoch(); epoch < 3; ++epoch) {
    for (auto& batch : loader) {
      // Dropout-like randomness from the global generator, restored too.
      torch::Tensor noise = torch::randn({1}) * 1e-3;
      A().backward(Loss(model, batch) + noise.sum());
      optimizer.step();
      optimizer.zero_grad();
      ++counter.value;
      if (++steps == save_after_steps) A().save_state(save_to);
    }
  }
  RunResult run{Snapshot(*model), counter.value};
  A().free_memory();
  return run;
}

// Accelerate's free_memory(*objects): the handles given are reset and the
// memory that went with them is counted; a handle kept elsewhere keeps it.
TEST_F(TrainingLoopTest, FreeMemoryResetsTheHandlesAndCountsWhatWent) {
  auto train_one_step = [](auto& model, auto& optimizer) {
    A().backward(model->forward(torch::ones({4, 6})).pow(2).sum());
    optimizer.step();
  };
  int64_t parameters = 0;
  for (const auto& p : MakeModel()->parameters()) parameters += p.numel();
  const int64_t state_bytes = 16 * parameters;  // fp32 weights, grads, m, v.

  torch::nn::Sequential net = MakeModel();
  auto adamw = std::make_unique<torch::optim::AdamW>(
      net->parameters(), torch::optim::AdamWOptions(1e-2));
  auto [model, optimizer, scheduler] =
      A().prepare(net, *adamw, get_constant_schedule(*adamw));
  net = nullptr;  // The prepared handles are the only ones left.
  train_one_step(model, optimizer);

  const Accelerator::FreedMemory freed =
      A().free_memory(model, optimizer, scheduler, adamw);
  EXPECT_EQ(freed.models, 1);
  EXPECT_EQ(freed.optimizers, 1);
  EXPECT_EQ(freed.schedulers, 1);
  EXPECT_EQ(freed.data_loaders, 0);
  EXPECT_EQ(freed.handles, 4);
  // Parameters, gradients (in DDP's buckets at N > 1) and AdamW's state.
  EXPECT_GE(freed.bytes, state_bytes);
  EXPECT_LE(freed.bytes, 2 * state_bytes);
  EXPECT_TRUE(model.is_empty());
  EXPECT_EQ(adamw, nullptr);
  EXPECT_THAT([&] { optimizer.step(); },
              ::testing::ThrowsMessage<UsageError>(
                  HasSubstr("AcceleratedOptimizer: used after "
                            "accelerator.free_memory() released this handle")));
  EXPECT_THAT([&] { scheduler.step(); },
              ::testing::ThrowsMessage<UsageError>(
                  HasSubstr("AcceleratedScheduler: used after")));

  // The program keeps its own handle to the model: its parameters stay.
  torch::nn::Sequential kept = MakeModel();
  torch::optim::AdamW kept_adamw(kept->parameters(),
                                 torch::optim::AdamWOptions(1e-2));
  auto [again, again_optimizer] = A().prepare(kept, kept_adamw);
  train_one_step(again, again_optimizer);
  const Accelerator::FreedMemory kept_freed = A().free_memory(again);
  EXPECT_EQ(kept_freed.handles, 1);
  EXPECT_LT(kept_freed.bytes, 4 * parameters);
  EXPECT_FALSE(kept.is_empty());
  EXPECT_EQ(kept->parameters().size(), 4u);
}

TEST_F(TrainingLoopTest, ResumingInTheMiddleOfAnEpochGivesTheSameParameters) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) +
                          "/mid_epoch_" + std::to_string(N());
  A().set_seed(21);
  const RunResult straight = Train(dir, /*save_after_steps=*/8, "");
  A().set_seed(500);  // Another generator state: load_state restores it.
  const RunResult resumed = Train(dir + "_unused", -1, dir);
  ASSERT_EQ(straight.final_parameters.size(), resumed.final_parameters.size());
  for (size_t i = 0; i < straight.final_parameters.size(); ++i) {
    EXPECT_TRUE(
        torch::equal(straight.final_parameters[i], resumed.final_parameters[i]))
        << "parameter " << i;
  }
  EXPECT_EQ(straight.counter, 18);
  EXPECT_EQ(resumed.counter, 18);  // 8 restored + the remaining 10 steps.
}

TEST_F(TrainingLoopTest, SkipFirstBatchesSkipsThisProcesssFirstBatches) {
  DataLoader<Indices> data(Indices(24), Loader(2, /*shuffle=*/false));
  auto loader = A().prepare(data);
  auto skipping = A().skip_first_batches(loader, 2);
  std::vector<int64_t> firsts;
  for (auto& batch : skipping) firsts.push_back(batch[0].item<int64_t>());
  // Rank r's batches start at 2 r, 2 (r + N), ...; the first two are gone.
  ASSERT_EQ(firsts.size(), static_cast<size_t>(12 / N() - 2));
  EXPECT_EQ(firsts[0], 2 * (R() + 2 * N()));
  std::vector<int64_t> next;
  for (auto& batch : skipping) next.push_back(batch[0].item<int64_t>());
  EXPECT_EQ(next.size(), static_cast<size_t>(12 / N()));  // Whole again.
}

TEST_F(TrainingLoopTest, TriggerSyncInBackwardSyncsInsideNoSync) {
  torch::nn::Sequential model = A().prepare(MakeModel());
  torch::Tensor x = torch::full({2, 6}, static_cast<float>(R() + 1));
  auto no_sync = A().no_sync(model);
  {
    auto sync = A().trigger_sync_in_backward(model);
    A().backward(model->forward(x).sum());
  }
  torch::Tensor all =
      A().gather(model->parameters()[0].grad().reshape({1, -1}));
  for (int r = 1; r < N(); ++r) EXPECT_TRUE(torch::equal(all[r], all[0]));
}

TEST_F(TrainingLoopTest, StateHooksSeeTheModelsAndTheFolder) {
  torch::nn::Sequential model = A().prepare(MakeModel());
  const std::string dir =
      std::string(std::getenv("TEST_TMPDIR")) + "/hooks_" + std::to_string(N());
  std::vector<std::string> calls;
  A().register_save_state_pre_hook(
      [&](const std::vector<std::shared_ptr<torch::nn::Module>>& models,
          const std::string& folder) {
        calls.push_back("save " + folder + " " + std::to_string(models.size()));
      });
  A().register_load_state_pre_hook(
      [&](const std::vector<std::shared_ptr<torch::nn::Module>>& models,
          const std::string& folder) {
        calls.push_back("load " + folder + " " + std::to_string(models.size()));
      });
  A().save_state(dir);
  A().wait_for_everyone();
  A().load_state(dir);
  EXPECT_THAT(calls, ElementsAre("save " + dir + " 1", "load " + dir + " 1"));
  // save(): the main process writes, atomically.
  A().save(std::vector<torch::Tensor>{torch::arange(3)}, dir + "/extra.pt");
  A().wait_for_everyone();
  std::vector<torch::Tensor> back;
  torch::load(back, dir + "/extra.pt");
  EXPECT_TRUE(torch::equal(back.at(0), torch::arange(3)));
}

TEST_F(TrainingLoopTest, LoadStateWithoutAFolderNeedsAProjectDir) {
  EXPECT_THROW(A().load_state(), UsageError);
  EXPECT_EQ(A().latest_checkpoint(), "");
}

// Last: the process group is gone afterwards.
TEST_F(TrainingLoopTest, EndTrainingLeavesTheJob) {
  A().end_training();
  A().end_training();  // A second call does nothing.
  try {
    A().gather(torch::ones({1}));
    ADD_FAILURE() << "gather after end_training worked";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("after end_training()"));
  }
}

}  // namespace
}  // namespace accel::testing
