// dataloader_config.dispatch_batches at 1-3 processes: only the main
// process reads samples; every process gets the batch it would have read
// itself (the same samples, in the same order, as without dispatching),
// for Example<>, Tensor and map batches, with and without worker threads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/data/example.h>

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "accel/accelerator.h"
#include "accel/data/data_loader.h"
#include "accel/runtime/base/errors.h"
#include "tests/multiprocess_main.h"

namespace accel::testing {

AcceleratorOptions TestAcceleratorOptions() {
  AcceleratorOptions options;
  options.backend = TestBackend();
  options.seed = 1234;
  options.dataloader_config.dispatch_batches = true;
  return options;
}

namespace {

using ::testing::HasSubstr;

Accelerator& A() { return SharedAccelerator(); }

std::atomic<int> samples_read{0};

constexpr size_t kSamples = 11;  // Padded to full batches on every rank.

// Sample i: data [i, 10 i], target i.
struct Numbers {
  torch::data::Example<> get(size_t i) const {
    ++samples_read;
    const float v = static_cast<float>(i);
    return {torch::tensor({v, 10 * v}), torch::tensor(static_cast<int64_t>(i))};
  }
  size_t size() const { return kSamples; }
};

struct NumberTensors {
  torch::Tensor get(size_t i) const {
    ++samples_read;
    return torch::tensor({static_cast<double>(i)}, torch::kDouble);
  }
  size_t size() const { return kSamples; }
};

struct NumberFields {
  std::map<std::string, torch::Tensor> get(size_t i) const {
    ++samples_read;
    const int64_t v = static_cast<int64_t>(i);
    return {{"ids", torch::tensor({v, v})}, {"mask", torch::tensor(v % 2)}};
  }
  size_t size() const { return kSamples; }
};

DataLoaderOptions Options(size_t workers) {
  DataLoaderOptions options;
  options.batch_size = 2;
  options.shuffle = true;
  options.seed = 3;
  options.num_workers = workers;
  return options;
}

// The samples of each batch this rank would read itself.
template <typename Dataset>
std::vector<std::vector<int64_t>> OwnBatches(const DataLoaderOptions& options) {
  return DataLoader<Dataset>(Dataset(), options)
      .Shard(A().process_index(), A().num_processes(), torch::kCPU)
      .BatchesOfEpoch(0);
}

// Samples read by this process during `work`, and by all of them.
template <typename Work>
std::pair<int, int> SamplesRead(Work work) {
  A().wait_for_everyone();
  samples_read = 0;
  work();
  const int mine = samples_read.load();
  const int all = A().reduce(torch::tensor(mine), "sum").item<int>();
  return {mine, all};
}

std::vector<int64_t> Ids(const torch::Tensor& column) {
  const torch::Tensor c = column.to(torch::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

class DispatchBatchesTest : public ::testing::TestWithParam<size_t> {};

TEST_P(DispatchBatchesTest, EveryRankGetsItsOwnBatchFromTheMainProcess) {
  const DataLoaderOptions options = Options(GetParam());
  auto loader = A().prepare(DataLoader<Numbers>(Numbers(), options));
  EXPECT_EQ(loader.dispatches_batches(), A().use_distributed());
  const auto expected = OwnBatches<Numbers>(options);
  std::vector<std::vector<int64_t>> got;
  const auto [mine, all] = SamplesRead([&] {
    for (auto& batch : loader) {
      const std::vector<int64_t> ids = Ids(batch.target);
      EXPECT_EQ(Ids(batch.data.select(1, 0)), ids);
      EXPECT_TRUE(batch.data.select(1, 1).equal(batch.data.select(1, 0) * 10));
      got.push_back(ids);
    }
  });
  EXPECT_EQ(got, expected);
  // 11 samples; at N processes padded to full batches of 2 on every rank.
  const int n = A().num_processes();
  const int read = n == 1 ? 11 : (11 + 2 * n - 1) / (2 * n) * (2 * n);
  EXPECT_EQ(all, read);
  if (A().process_index() != 0) EXPECT_EQ(mine, 0);
}

TEST_P(DispatchBatchesTest, TensorAndMapBatchesToo) {
  const DataLoaderOptions options = Options(GetParam());
  auto tensors =
      A().prepare(DataLoader<NumberTensors>(NumberTensors(), options));
  auto fields = A().prepare(DataLoader<NumberFields>(NumberFields(), options));
  const auto expected = OwnBatches<NumberTensors>(options);
  std::vector<std::vector<int64_t>> got_tensors, got_fields;
  const auto [mine, all] = SamplesRead([&] {
    for (auto& batch : tensors) {
      EXPECT_EQ(batch.scalar_type(), torch::kDouble);
      got_tensors.push_back(Ids(batch.select(1, 0)));
    }
    for (auto& batch : fields) {
      ASSERT_EQ(batch.size(), 2u);
      const std::vector<int64_t> ids = Ids(batch.at("ids").select(1, 1));
      EXPECT_EQ(Ids(batch.at("mask")), Ids(batch.at("ids").select(1, 0) % 2));
      got_fields.push_back(ids);
    }
  });
  EXPECT_EQ(got_tensors, expected);
  EXPECT_EQ(got_fields, expected);
  if (A().process_index() != 0) EXPECT_EQ(mine, 0);
  EXPECT_GT(all, 0);
}

INSTANTIATE_TEST_SUITE_P(Workers, DispatchBatchesTest,
                         ::testing::Values(size_t{0}, size_t{2}));

TEST(DispatchBatchesMisuseTest, UnevenBatchesAndOtherBatchTypesAreRefused) {
  if (!A().use_distributed()) GTEST_SKIP() << "one process dispatches nothing";
  DataLoaderOptions uneven = Options(0);
  uneven.even_batches = false;
  try {
    A().prepare(DataLoader<Numbers>(Numbers(), uneven));
    ADD_FAILURE() << "dispatch_batches without even_batches was accepted";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("needs even_batches"));
  }
  DataLoader<Numbers, std::vector<int64_t>> ids(
      Numbers(), Options(0), [](std::vector<torch::data::Example<>> samples) {
        return std::vector<int64_t>(samples.size());
      });
  try {
    A().prepare(ids);
    ADD_FAILURE() << "a custom batch type was accepted";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("can send batches of"));
  }
}

}  // namespace
}  // namespace accel::testing
