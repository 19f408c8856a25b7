// Accelerate's kwargs handlers and dataloader_config at 1-3 processes: an
// Accelerator made with DistributedDataParallelKwargs(find_unused_parameters),
// InitProcessGroupKwargs(timeout), AutocastKwargs(cache_enabled) and a
// DataLoaderConfiguration(data_seed, non_blocking) behaves as they say, and
// the handlers set the AcceleratorOptions fields they name.
#include "accel/kwargs_handlers.h"

#include <ATen/autocast_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include "tests/multiprocess_main.h"
#include "tests/usage_error.h"

namespace accel::testing {

AcceleratorOptions TestAcceleratorOptions() {
  AcceleratorOptions options;
  options.backend = TestBackend();
  options.seed = 1234;
  options.mixed_precision = "bf16";
  DistributedDataParallelKwargs ddp_kwargs;
  ddp_kwargs.find_unused_parameters = true;
  InitProcessGroupKwargs process_group_kwargs;
  process_group_kwargs.timeout = std::chrono::seconds(17);
  AutocastKwargs autocast_kwargs;
  autocast_kwargs.cache_enabled = false;
  options.kwargs_handlers = {ddp_kwargs, process_group_kwargs, autocast_kwargs};
  options.dataloader_config.data_seed = 77;
  options.dataloader_config.non_blocking = false;
  return options;
}

namespace {

using ::testing::HasSubstr;

Accelerator& A() { return SharedAccelerator(); }

// A trunk every rank uses and a head that none does.
struct TwoHeads : torch::nn::Module {
  TwoHeads() {
    torch::manual_seed(3);
    trunk = register_module("trunk", torch::nn::Linear(4, 4));
    unused = register_module("unused", torch::nn::Linear(4, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) { return trunk->forward(x); }
  torch::nn::Linear trunk{nullptr}, unused{nullptr};
};

TEST(KwargsHandlersTest, UnusedParametersAreSkippedByTheOptimizer) {
  auto net = std::make_shared<TwoHeads>();
  const torch::Tensor unused_before = net->unused->weight.detach().clone();
  const torch::Tensor trunk_before = net->trunk->weight.detach().clone();
  torch::optim::AdamW adamw(net->parameters(),
                            torch::optim::AdamWOptions(0.1).weight_decay(0.5));
  auto [model, optimizer] = A().prepare(net, adamw);
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(100 * A().process_index() + step);
    A().backward(model->forward(torch::randn({2, 4})).pow(2).sum());
    optimizer.step();
    optimizer.zero_grad();
  }
  // Without find_unused_parameters its zero gradient would let AdamW's
  // weight decay shrink it.
  EXPECT_TRUE(torch::equal(net->unused->weight, unused_before));
  EXPECT_FALSE(torch::equal(net->trunk->weight, trunk_before));
  torch::Tensor all = A().gather(net->trunk->weight.detach().reshape({1, -1}));
  for (int r = 1; r < A().num_processes(); ++r) {
    EXPECT_TRUE(torch::equal(all[r], all[0])) << "rank " << r;
  }
}

TEST(KwargsHandlersTest, InitProcessGroupKwargsSetsTheCollectiveTimeout) {
  EXPECT_EQ(A().communicator().default_timeout(), std::chrono::seconds(17));
}

TEST(KwargsHandlersTest, AutocastKwargsReachEveryScope) {
  torch::nn::Linear linear(4, 2);
  // Off already when a model prepared on this thread turned autocast on
  // (it never caches: see accel/optim/autocast.h); LibTorch's default else.
  const bool before = at::autocast::is_autocast_cache_enabled();
  {
    auto autocast = A().autocast();
    EXPECT_FALSE(at::autocast::is_autocast_cache_enabled());
    EXPECT_EQ(linear->forward(torch::ones({1, 4})).scalar_type(),
              torch::kBFloat16);
  }
  EXPECT_EQ(at::autocast::is_autocast_cache_enabled(), before);
  AutocastKwargs off;
  off.enabled = false;
  {
    auto autocast = A().autocast(off);
    EXPECT_EQ(linear->forward(torch::ones({1, 4})).scalar_type(),
              torch::kFloat32);
  }
}

class Indices {
 public:
  torch::Tensor get(size_t i) { return torch::full({1}, static_cast<int>(i)); }
  size_t size() const { return 64; }
};

// This rank's first epoch of a prepared loader whose own seed is `seed`.
std::vector<int> PreparedOrder(uint64_t seed, bool* pinned) {
  DataLoaderOptions options;
  options.batch_size = 4;
  options.shuffle = true;
  options.seed = seed;
  auto loader = A().prepare(DataLoader<Indices>(Indices(), options));
  *pinned = loader.options().pin_memory;
  std::vector<int> order;
  for (auto& batch : loader) {
    for (int64_t i = 0; i < batch.size(0); ++i) {
      order.push_back(batch[i].item<int>());
    }
  }
  return order;
}

TEST(KwargsHandlersTest, DataSeedAndNonBlockingReachEveryPreparedLoader) {
  bool pinned = true;
  const std::vector<int> first = PreparedOrder(1, &pinned);
  EXPECT_FALSE(pinned);                         // non_blocking = false.
  EXPECT_EQ(PreparedOrder(2, &pinned), first);  // data_seed wins.
  A().free_memory();
}

TEST(KwargsHandlersTest, WhatAccelsLoadersAlwaysAreCannotBeTurnedOff) {
  AcceleratorOptions options;
  options.dataloader_config.use_seedable_sampler = false;
  EXPECT_THAT(UsageErrorOf([&] { options.Validate(); }),
              HasSubstr("use_seedable_sampler and use_stateful_dataloader "
                        "cannot be false"));
}

TEST(KwargsHandlersTest, EachHandlerSetsTheFieldsItNames) {
  AcceleratorOptions options;
  DistributedDataParallelKwargs ddp;
  ddp.bucket_cap_mb = 4;
  ddp.broadcast_buffers = false;
  ddp.gradient_as_bucket_view = false;
  ddp.static_graph = true;
  InitProcessGroupKwargs process_group;
  process_group.backend = "mpi";
  GradScalerKwargs scaler;
  scaler.init_scale = 1024;
  scaler.growth_interval = 7;
  options.kwargs_handlers = {ddp, process_group, scaler};
  options.ApplyKwargsHandlers();
  EXPECT_EQ(options.gradient_sync.bucket_cap_bytes, 4u << 20);
  EXPECT_FALSE(options.gradient_sync.broadcast_buffers);
  EXPECT_FALSE(options.gradient_sync.gradient_as_bucket_view);
  EXPECT_TRUE(options.gradient_sync.static_graph);
  EXPECT_FALSE(options.gradient_sync.find_unused_parameters);
  EXPECT_EQ(options.backend, "mpi");
  EXPECT_EQ(options.timeout, AcceleratorOptions().timeout);  // Not given.
  EXPECT_EQ(options.scaler.init_scale, 1024);
  EXPECT_EQ(options.scaler.growth_interval, 7);
}

TEST(KwargsHandlersTest, TwoOfAKindOrABadBucketSizeAreRefused) {
  AcceleratorOptions twice;
  twice.kwargs_handlers = {AutocastKwargs{}, InitProcessGroupKwargs{},
                           AutocastKwargs{}};
  EXPECT_THAT(UsageErrorOf([&] { twice.ApplyKwargsHandlers(); }),
              HasSubstr("kwargs_handlers: two AutocastKwargs; pass at most "
                        "one of each kind"));
  AcceleratorOptions empty_buckets;
  DistributedDataParallelKwargs ddp;
  ddp.bucket_cap_mb = 0;
  empty_buckets.kwargs_handlers = {ddp};
  EXPECT_THAT(UsageErrorOf([&] { empty_buckets.ApplyKwargsHandlers(); }),
              HasSubstr("bucket_cap_mb must be positive, found 0"));
}

}  // namespace
}  // namespace accel::testing
