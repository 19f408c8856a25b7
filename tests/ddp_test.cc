// Data-parallel training equals one process with the global batch; buckets,
// overlap and unused parameters. Every rank is a process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include "accel/parallel/gradient_sync.h"
#include "tests/multiprocess_main.h"
#include "tests/usage_error.h"

namespace accel::testing {
namespace {

constexpr int64_t kSamples = 48;  // Divisible by 4 * lcm(1, 2, 3).
constexpr size_t kPerRankBatch = 4;

class Blobs : public torch::data::datasets::Dataset<Blobs> {
 public:
  Blobs() {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(99);
    x_ = torch::randn({kSamples, 10}, generator);
    y_ = torch::randint(0, 2, {kSamples}, generator, torch::kLong);
  }
  torch::data::Example<> get(size_t i) override { return {x_[i], y_[i]}; }
  torch::optional<size_t> size() const override { return kSamples; }

 private:
  torch::Tensor x_, y_;
};

torch::nn::Sequential MakeModel() {
  torch::manual_seed(7);  // The same initial weights everywhere.
  return torch::nn::Sequential(torch::nn::Linear(10, 32), torch::nn::ReLU(),
                               torch::nn::Linear(32, 2));
}

DataLoader<Blobs> MakeLoader(size_t batch_size) {
  DataLoaderOptions options;
  options.batch_size = batch_size;
  options.shuffle = true;
  options.seed = 3;
  return DataLoader<Blobs>(Blobs(), options);
}

torch::Tensor Loss(torch::nn::Sequential& model,
                   const torch::data::Example<>& batch) {
  return torch::nn::functional::cross_entropy(model->forward(batch.data),
                                              batch.target);
}

// Single-process training with the global batch, on this rank alone.
torch::nn::Sequential TrainReference(int epochs, int num_processes) {
  torch::nn::Sequential model = MakeModel();
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(0.1).momentum(0.9));
  DataLoader<Blobs> loader = MakeLoader(kPerRankBatch * num_processes);
  for (int epoch = 0; epoch < epochs; ++epoch) {
    for (auto& batch : loader) {
      Loss(model, batch).backward();
      optimizer.step();
      optimizer.zero_grad();
    }
  }
  return model;
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

TEST(DdpTest, MatchesOneProcessTrainingWithTheGlobalBatch) {
  Accelerator& accelerator = SharedAccelerator();
  torch::nn::Sequential model = MakeModel();
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(0.1).momentum(0.9));
  DataLoader<Blobs> data = MakeLoader(kPerRankBatch);
  auto [ddp_model, ddp_optimizer, loader] =
      accelerator.prepare(model, optimizer, data);
  EXPECT_EQ(loader.size(),
            kSamples / (kPerRankBatch * accelerator.num_processes()));
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (auto& batch : loader) {
      accelerator.backward(Loss(ddp_model, batch));
      ddp_optimizer.step();
      ddp_optimizer.zero_grad();
    }
  }
  torch::nn::Sequential reference =
      TrainReference(2, accelerator.num_processes());
  EXPECT_LE(MaxDifference(*ddp_model, *reference), 1e-6);
  // And the run did move the weights: the comparison is not vacuous.
  EXPECT_GT(MaxDifference(*ddp_model, *MakeModel()), 1e-3);
}

TEST(DdpTest, SeveralBucketsAllStartDuringBackwardAndStillMatch) {
  Accelerator& accelerator = SharedAccelerator();
  torch::nn::Sequential model = MakeModel();
  GradientSyncOptions options;
  options.first_bucket_bytes = 256;
  options.bucket_cap_bytes = 1024;
  GradientSynchronizer sync(accelerator.communicator(), model->parameters(),
                            options);
  EXPECT_GE(sync.num_buckets(), 3u);
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(0.1).momentum(0.9));
  DataLoader<Blobs> loader =
      MakeLoader(kPerRankBatch)
          .Shard(accelerator.process_index(), accelerator.num_processes(),
                 torch::kCPU);
  for (auto& batch : loader) {
    Loss(model, batch).backward();
    // Every bucket's allreduce was started by backward itself.
    EXPECT_EQ(sync.buckets_launched(), sync.num_buckets());
    sync.finish();
    optimizer.step();
    optimizer.zero_grad();
  }
  torch::nn::Sequential reference =
      TrainReference(1, accelerator.num_processes());
  EXPECT_LE(MaxDifference(*model, *reference), 1e-6);
}

// Gradients live in the buckets (DDP's gradient_as_bucket_view): whatever
// a parameter accumulated on micro-steps without sync, even one it is not
// used in on the syncing micro-step, and however the previous step cleared
// it (set to none, or zeroed in place), reaches the average.
TEST(DdpTest, MicroStepsWithoutSyncKeepEveryContribution) {
  Accelerator& accelerator = SharedAccelerator();
  const int rank = accelerator.process_index();
  torch::manual_seed(5);
  torch::nn::Linear early(3, 3), late(3, 1);
  std::vector<torch::Tensor> parameters;
  for (auto* m : {early.ptr().get(), late.ptr().get()}) {
    for (auto& p : m->parameters()) parameters.push_back(p);
  }
  GradientSynchronizer sync(accelerator.communicator(), parameters, {});
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor x = torch::full({2, 3}, 1.0 + rank + step);
    // Micro-step 1 (no sync): only `early` gets a gradient.
    sync.set_enabled(false);
    early->forward(x).pow(2).sum().backward();
    // Micro-step 2 (sync): only `late` does.
    sync.set_enabled(true);
    late->forward(x).sum().backward();
    std::vector<torch::Tensor> local;
    for (auto& p : parameters) local.push_back(p.grad().clone());
    sync.finish();
    for (size_t i = 0; i < parameters.size(); ++i) {
      const torch::Tensor expected =
          accelerator.reduce(local[i], "sum") / accelerator.num_processes();
      EXPECT_TRUE(torch::allclose(parameters[i].grad(), expected))
          << "step " << step << ", parameter " << i;
    }
    if (step == 0) {
      early->zero_grad(/*set_to_none=*/true);
      late->zero_grad(/*set_to_none=*/true);
    } else {
      for (auto& p : parameters) p.mutable_grad().zero_();
    }
  }
}

TEST(DdpTest, ParametersWithoutGradientsDoNotHangTheStep) {
  Accelerator& accelerator = SharedAccelerator();
  torch::manual_seed(11);
  torch::nn::Linear trunk(4, 4), used_on_rank0(4, 1), never_used(4, 1);
  std::vector<torch::Tensor> parameters;
  for (auto* m :
       {trunk.ptr().get(), used_on_rank0.ptr().get(), never_used.ptr().get()}) {
    for (auto& p : m->parameters()) parameters.push_back(p);
  }
  GradientSynchronizer sync(accelerator.communicator(), parameters, {});
  torch::Tensor x = torch::ones({2, 4});
  torch::Tensor hidden = trunk->forward(x);
  torch::Tensor loss = hidden.sum();
  if (accelerator.is_main_process()) {
    loss = loss + used_on_rank0->forward(hidden).sum();
  }
  const torch::Tensor local_head_grad_weight = [&] {
    loss.backward();
    return used_on_rank0->weight.grad().defined()
               ? used_on_rank0->weight.grad().clone()
               : torch::zeros_like(used_on_rank0->weight);
  }();
  sync.finish();
  // Rank 0's gradient, averaged with zeros from the others.
  torch::Tensor rank0_grad = accelerator.broadcast(local_head_grad_weight, 0);
  EXPECT_TRUE(torch::allclose(used_on_rank0->weight.grad(),
                              rank0_grad / accelerator.num_processes()));
  EXPECT_TRUE(torch::equal(never_used->weight.grad(),
                           torch::zeros_like(never_used->weight)));
  // Every rank ends the step with the same gradients.
  torch::Tensor all = accelerator.gather(trunk->weight.grad().reshape({1, -1}));
  for (int r = 1; r < accelerator.num_processes(); ++r) {
    EXPECT_TRUE(torch::equal(all[r], all[0]));
  }
}

// One step over a trunk every rank uses, a head only rank 0 uses and a
// head no rank uses, synchronized with `options`.
struct UnusedHeads {
  torch::nn::Linear trunk{4, 4}, used_on_rank0{4, 1}, never_used{4, 1};
  std::vector<torch::Tensor> parameters;

  UnusedHeads() {
    torch::manual_seed(11);
    trunk = torch::nn::Linear(4, 4);
    used_on_rank0 = torch::nn::Linear(4, 1);
    never_used = torch::nn::Linear(4, 1);
    for (auto* m : {trunk.ptr().get(), used_on_rank0.ptr().get(),
                    never_used.ptr().get()}) {
      for (auto& p : m->parameters()) parameters.push_back(p);
    }
  }
  void Step(GradientSynchronizer& sync) {
    torch::Tensor hidden = trunk->forward(torch::ones({2, 4}));
    torch::Tensor loss = hidden.sum();
    if (SharedAccelerator().is_main_process()) {
      loss = loss + used_on_rank0->forward(hidden).sum();
    }
    loss.backward();
    sync.finish();
  }
};

// Collectives the communicator ran during `fn`.
template <typename Fn>
uint64_t CollectivesDuring(Fn&& fn) {
  Communicator& comm = SharedAccelerator().communicator();
  const uint64_t before = comm.barrier();
  fn();
  return comm.barrier() - before - 1;
}

TEST(DdpTest, FindUnusedParametersLeavesNoGradientWhereNoRankUsedOne) {
  Accelerator& accelerator = SharedAccelerator();
  GradientSyncOptions options;
  options.find_unused_parameters = true;
  UnusedHeads model;
  GradientSynchronizer sync(accelerator.communicator(), model.parameters,
                            options);
  const uint64_t ran = CollectivesDuring([&] { model.Step(sync); });
  // DDP's semantics: none, so that an optimizer skips it (weight decay and
  // momentum would move it otherwise).
  EXPECT_FALSE(model.never_used->weight.grad().defined());
  EXPECT_FALSE(model.never_used->bias.grad().defined());
  // Used somewhere: averaged as always, zeros from the ranks that did not.
  ASSERT_TRUE(model.used_on_rank0->weight.grad().defined());
  EXPECT_TRUE(model.trunk->weight.grad().defined());
  // One more collective than the buckets: the agreement on what was used.
  EXPECT_EQ(ran, sync.num_buckets() + 1);
  // Each step agrees again: still none after a second one.
  for (auto& p : model.parameters) p.mutable_grad() = torch::Tensor();
  EXPECT_EQ(CollectivesDuring([&] { model.Step(sync); }),
            sync.num_buckets() + 1);
  EXPECT_FALSE(model.never_used->weight.grad().defined());
}

TEST(DdpTest, WithoutFindUnusedParametersAnUnusedOneEndsWithZeros) {
  Accelerator& accelerator = SharedAccelerator();
  UnusedHeads model;
  GradientSynchronizer sync(accelerator.communicator(), model.parameters, {});
  EXPECT_EQ(CollectivesDuring([&] { model.Step(sync); }), sync.num_buckets());
  ASSERT_TRUE(model.never_used->weight.grad().defined());
  EXPECT_EQ(model.never_used->weight.grad().abs().sum().item<float>(), 0);
}

TEST(DdpTest, StaticGraphAgreesOnTheUsedParametersOnce) {
  Accelerator& accelerator = SharedAccelerator();
  GradientSyncOptions options;
  options.static_graph = true;  // Implies finding them, as in DDP.
  UnusedHeads model;
  GradientSynchronizer sync(accelerator.communicator(), model.parameters,
                            options);
  EXPECT_EQ(CollectivesDuring([&] { model.Step(sync); }),
            sync.num_buckets() + 1);
  for (auto& p : model.parameters) p.mutable_grad() = torch::Tensor();
  EXPECT_EQ(CollectivesDuring([&] { model.Step(sync); }), sync.num_buckets());
  EXPECT_FALSE(model.never_used->weight.grad().defined());
  EXPECT_TRUE(model.used_on_rank0->weight.grad().defined());
}

TEST(DdpTest, GradientsAsCopiesEqualTheBucketViews) {
  Accelerator& accelerator = SharedAccelerator();
  UnusedHeads viewed, copied;
  GradientSyncOptions as_copies;
  as_copies.gradient_as_bucket_view = false;
  GradientSynchronizer view_sync(accelerator.communicator(), viewed.parameters,
                                 {});
  GradientSynchronizer copy_sync(accelerator.communicator(), copied.parameters,
                                 as_copies);
  for (int step = 0; step < 3; ++step) {  // Accumulating: no zero_grad.
    viewed.Step(view_sync);
    copied.Step(copy_sync);
  }
  for (size_t i = 0; i < viewed.parameters.size(); ++i) {
    EXPECT_TRUE(
        torch::equal(viewed.parameters[i].grad(), copied.parameters[i].grad()))
        << "parameter " << i;
  }
  // The trunk's weight and bias share a bucket; as copies they share no
  // storage with it or with each other.
  const auto storage = [](UnusedHeads& m, bool bias) {
    return (bias ? m.trunk->bias : m.trunk->weight).grad().storage().data();
  };
  EXPECT_EQ(storage(viewed, false), storage(viewed, true));
  EXPECT_NE(storage(copied, false), storage(copied, true));
}

// Two classes split by a plane, 256 samples: what a compression hook must
// still learn.
class Halves : public torch::data::datasets::Dataset<Halves> {
 public:
  Halves() {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
    x_ = torch::randn({256, 10}, generator);
    y_ = (x_.narrow(1, 0, 5).sum(1) > 0).to(torch::kLong);
  }
  torch::data::Example<> get(size_t i) override { return {x_[i], y_[i]}; }
  torch::optional<size_t> size() const override { return 256; }
  const torch::Tensor& x() const { return x_; }
  const torch::Tensor& y() const { return y_; }

 private:
  torch::Tensor x_, y_;
};

struct HookedRun {
  double accuracy = 0;
  uint64_t bytes = 0;
  std::vector<torch::Tensor> parameters;
};

// 4 epochs of SGD on Halves, the gradients synchronized through `hook`;
// the accuracy over the whole set, the bytes given to the allreduces.
HookedRun TrainWithHook(DDPCommunicationHookType hook,
                        PowerSgdOptions powersgd = {}) {
  Accelerator& accelerator = SharedAccelerator();
  torch::nn::Sequential model = MakeModel();
  GradientSyncOptions options;
  options.comm_hook = hook;
  options.powersgd = powersgd;
  GradientSynchronizer sync(accelerator.communicator(), model->parameters(),
                            options);
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(0.05).momentum(0.9));
  DataLoaderOptions loader_options;
  loader_options.batch_size = 8;
  loader_options.shuffle = true;
  loader_options.seed = 3;
  DataLoader<Halves> loader =
      accelerator.prepare(DataLoader<Halves>(Halves(), loader_options));
  for (int epoch = 0; epoch < 4; ++epoch) {
    for (auto& batch : loader) {
      torch::nn::functional::cross_entropy(model->forward(batch.data),
                                           batch.target)
          .backward();
      sync.finish();
      optimizer.step();
      optimizer.zero_grad();
    }
  }
  HookedRun run;
  Halves all;
  torch::NoGradGuard no_grad;
  run.accuracy = model->forward(all.x())
                     .argmax(1)
                     .eq(all.y())
                     .to(torch::kFloat64)
                     .mean()
                     .item<double>();
  run.bytes = sync.bytes_reduced();
  for (const auto& p : model->parameters()) run.parameters.push_back(p.clone());
  return run;
}

TEST(DdpTest, CompressionHooksHalveTheBytesAndStillLearn) {
  const HookedRun plain = TrainWithHook(DDPCommunicationHookType::kNo);
  EXPECT_GT(plain.accuracy, 0.9);
  for (auto hook :
       {DDPCommunicationHookType::kFp16, DDPCommunicationHookType::kBf16}) {
    const bool fp16 = hook == DDPCommunicationHookType::kFp16;
    const HookedRun hooked = TrainWithHook(hook);
    SCOPED_TRACE(fp16 ? "fp16" : "bf16");
    std::printf(
        "comm hook %s: accuracy %.4f (none %.4f), %llu bytes (none "
        "%llu)\n",
        fp16 ? "fp16" : "bf16", hooked.accuracy, plain.accuracy,
        static_cast<unsigned long long>(hooked.bytes),
        static_cast<unsigned long long>(plain.bytes));
    EXPECT_EQ(hooked.bytes * 2, plain.bytes);
    EXPECT_NEAR(hooked.accuracy, plain.accuracy, 0.03);
    // Rounded gradients: near the plain run's weights, not equal to them.
    double worst = 0;
    for (size_t i = 0; i < plain.parameters.size(); ++i) {
      worst = std::max(worst, (hooked.parameters[i] - plain.parameters[i])
                                  .abs()
                                  .max()
                                  .item<double>());
    }
    std::printf("comm hook %s: weights within %.2g of no hook's\n",
                fp16 ? "fp16" : "bf16", worst);
    EXPECT_GT(worst, 0);
    // Measured at 1-3 processes: fp16 up to 1.5e-4, bf16 up to 0.064.
    EXPECT_LT(worst, fp16 ? 0.002 : 0.2);
  }
}

TEST(DdpTest, PowerSgdSendsAThirdOnceStartedAndStillLearns) {
  const HookedRun plain = TrainWithHook(DDPCommunicationHookType::kNo);
  PowerSgdOptions powersgd;
  powersgd.start_powerSGD_iter = 10;
  const HookedRun hooked =
      TrainWithHook(DDPCommunicationHookType::kPowerSgd, powersgd);
  std::printf(
      "comm hook PowerSGD rank 1 from step 10: accuracy %.4f (none "
      "%.4f), %llu bytes (none %llu)\n",
      hooked.accuracy, plain.accuracy,
      static_cast<unsigned long long>(hooked.bytes),
      static_cast<unsigned long long>(plain.bytes));
  EXPECT_NEAR(hooked.accuracy, plain.accuracy, 0.05);
  // 10 plain steps of 418 floats; then the 32 x 10 weight travels as
  // 32 + 10 numbers, and the 2 x 32 one and the biases (98 numbers) gain
  // too little and travel whole: 140 floats a step.
  const uint64_t steps = plain.bytes / (418 * sizeof(float));
  EXPECT_EQ(hooked.bytes, (10 * 418 + (steps - 10) * 140) * sizeof(float));
  // Before its start step PowerSGD is a plain allreduce, bit for bit.
  powersgd.start_powerSGD_iter = 1 << 20;
  const HookedRun late =
      TrainWithHook(DDPCommunicationHookType::kPowerSgd, powersgd);
  EXPECT_EQ(late.bytes, plain.bytes);
  for (size_t i = 0; i < plain.parameters.size(); ++i) {
    EXPECT_TRUE(torch::equal(late.parameters[i], plain.parameters[i]));
  }
}

TEST(DdpTest, PowerSgdReproducesARankOneGradientExactly) {
  Communicator& comm = SharedAccelerator().communicator();
  PowerSgdOptions options;
  options.use_error_feedback = false;
  PowerSgdBucket bucket(options, {{12, 7}, {5}});
  torch::manual_seed(9);  // The same gradient on every rank.
  torch::Tensor matrix = torch::outer(torch::randn({12}), torch::randn({7}));
  torch::Tensor bias = torch::randn({5});
  torch::Tensor flat = torch::cat({matrix.reshape({-1}), bias});
  const torch::Tensor expected = flat.clone();
  const uint64_t bytes = bucket.Reduce(comm, flat, {});
  EXPECT_TRUE(torch::allclose(flat, expected, 1e-5, 1e-6))
      << (flat - expected).abs().max().item<float>();
  EXPECT_EQ(bytes, (12 + 7 + 5) * sizeof(float));
}

TEST(DdpTest, PowerSgdRefusesARankBelowOne) {
  PowerSgdOptions options;
  options.matrix_approximation_rank = 0;
  GradientSyncOptions sync;
  sync.comm_hook = DDPCommunicationHookType::kPowerSgd;
  sync.powersgd = options;
  torch::nn::Linear linear(3, 3);
  EXPECT_THAT(
      UsageErrorOf([&] {
        GradientSynchronizer(SharedAccelerator().communicator(),
                             linear->parameters(), sync);
      }),
      ::testing::HasSubstr(
          "PowerSGD: matrix_approximation_rank must be at least 1, found 0"));
}

// A model with BatchNorm (running mean and variance, a step count) trained
// on different data on every rank; each rank's buffers as rows of a gather.
torch::Tensor BufferRowsAfterSteps(bool broadcast_buffers, int steps) {
  Accelerator& accelerator = SharedAccelerator();
  torch::manual_seed(5);
  torch::nn::Linear linear(6, 4);
  torch::nn::BatchNorm1d norm(4);
  std::vector<torch::Tensor> parameters = linear->parameters();
  for (auto& p : norm->parameters()) parameters.push_back(p);
  GradientSyncOptions options;
  options.broadcast_buffers = broadcast_buffers;
  GradientSynchronizer sync(accelerator.communicator(), parameters, options,
                            norm->buffers());
  torch::manual_seed(100 + accelerator.process_index());  // Data differ.
  for (int step = 0; step < steps; ++step) {
    torch::Tensor loss =
        norm->forward(linear->forward(torch::randn({8, 6}))).pow(2).sum();
    sync.begin_backward();
    loss.backward();
    sync.finish();
  }
  torch::Tensor mine =
      torch::cat({norm->running_mean, norm->running_var,
                  norm->num_batches_tracked.to(torch::kFloat32).reshape({1})});
  return accelerator.gather(mine.reshape({1, -1}));
}

TEST(DdpTest, BuffersAreRankZerosAfterEverySyncedStep) {
  const torch::Tensor rows = BufferRowsAfterSteps(true, 3);
  for (int r = 1; r < rows.size(0); ++r) {
    EXPECT_TRUE(torch::equal(rows[r], rows[0])) << "rank " << r;
  }
  EXPECT_EQ(rows[0][-1].item<float>(), 3);  // Counted, not reset.
  const torch::Tensor apart = BufferRowsAfterSteps(false, 3);
  for (int r = 1; r < apart.size(0); ++r) {
    EXPECT_FALSE(torch::equal(apart[r], apart[0])) << "rank " << r;
  }
}

TEST(DdpTest, PreparedModelsBroadcastTheirBuffers) {
  Accelerator& accelerator = SharedAccelerator();
  torch::manual_seed(7);
  torch::nn::Sequential model(torch::nn::Linear(10, 8),
                              torch::nn::BatchNorm1d(8), torch::nn::ReLU(),
                              torch::nn::Linear(8, 2));
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(0.1));
  DataLoader<Blobs> data = MakeLoader(kPerRankBatch);
  auto [ddp_model, ddp_optimizer, loader] =
      accelerator.prepare(model, optimizer, data);
  for (auto& batch : loader) {
    accelerator.backward(Loss(ddp_model, batch));
    ddp_optimizer.step();
    ddp_optimizer.zero_grad();
  }
  for (const auto& buffer : ddp_model->named_buffers()) {
    torch::Tensor all =
        accelerator.gather(buffer.value().to(torch::kFloat64).reshape({1, -1}));
    for (int r = 1; r < all.size(0); ++r) {
      EXPECT_TRUE(torch::equal(all[r], all[0]))
          << buffer.key() << " rank " << r;
    }
  }
}

TEST(DdpTest, PrepareGivesEveryRankRankZerosStateInThreeCollectives) {
  Accelerator& accelerator = SharedAccelerator();
  torch::manual_seed(100 + accelerator.process_index());  // Ranks differ.
  torch::nn::Sequential model;
  for (int i = 0; i < 99; ++i) model->push_back(torch::nn::Linear(4, 4));
  model->push_back(torch::nn::BatchNorm1d(4));  // 2 parameters, 3 buffers.
  const uint64_t before = accelerator.communicator().barrier();
  auto prepared = accelerator.prepare(model);
  const uint64_t calls = accelerator.communicator().barrier() - before - 1;
  // 203 tensors: one check, one float32 bucket, one int64 bucket.
  EXPECT_EQ(calls, accelerator.num_processes() == 1 ? 0u : 3u);
  std::vector<torch::Tensor> state = prepared->parameters();
  for (const torch::Tensor& buffer : prepared->buffers()) {
    state.push_back(buffer.to(torch::kFloat32));
  }
  for (const torch::Tensor& tensor : state) {
    const torch::Tensor all =
        accelerator.gather(tensor.detach().reshape({1, -1}));
    for (int r = 1; r < all.size(0); ++r) {
      ASSERT_TRUE(torch::equal(all[r], all[0])) << "rank " << r;
    }
  }
  accelerator.free_memory();
}

}  // namespace
}  // namespace accel::testing
