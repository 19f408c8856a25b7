// A data loader with Accelerate's sharding: every rank gets full batches of
// `batch_size`, rank r taking batches r, r + N, r + 2N, ... of one shuffled
// order that all ranks share (seeded by `seed` + epoch, so each epoch
// reshuffles and every rank agrees without talking).
//
//   auto dataset = MyDataset(...);  // get(i) -> torch::data::Example<>
//   accel::DataLoaderOptions options;
//   options.batch_size = 8;
//   options.shuffle = true;
//   accel::DataLoader<MyDataset> loader(dataset, options);
//   auto prepared = accelerator.prepare(loader);
//   for (auto& batch : prepared) { batch.data; batch.target; }
//
// even_batches (default): when the samples do not fill the same number of
// full batches on every rank, samples from the start of the epoch's order
// are appended so that they do (Accelerate does the same). Each loop over the
// loader starts the next epoch; epoch() and set_epoch() expose the counter,
// which save_state() records so a resumed run shuffles identically.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/data/datasets/base.h>
#include <torch/data/example.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "accel/runtime/errors.h"

namespace accel {

struct DataLoaderOptions {
  size_t batch_size = 1;
  // Accelerate's split_batches: batch_size is the global batch, and each of
  // N ranks gets batch_size / N of it, so training matches one process with
  // the same batch_size whatever N is.
  bool split_batches = false;
  bool shuffle = false;
  bool drop_last = false;
  bool even_batches = true;
  uint64_t seed = 0;
};

// Where a loader stands; shared by all copies of one loader.
struct DataLoaderState {
  int64_t epoch = 0;  // Epochs started.
};

template <typename Dataset>
class DataLoader {
 public:
  using Batch = torch::data::Example<>;

  DataLoader(Dataset dataset, DataLoaderOptions options)
      : dataset_(std::make_shared<Dataset>(std::move(dataset))),
        options_(options),
        state_(std::make_shared<DataLoaderState>()) {
    if (options_.batch_size == 0) {
      throw UsageError("DataLoader: batch_size must be at least 1");
    }
    const auto size = dataset_->size();  // c10::optional in LibTorch 1.x
    if (!size) throw UsageError("DataLoader: the dataset must have a size");
    dataset_size_ = *size;
  }

  // The same data, sharded for `rank` of `num_replicas` (used by prepare()).
  DataLoader Shard(int rank, int num_replicas, torch::Device device) const {
    DataLoader copy = *this;
    if (options_.split_batches) {
      if (options_.batch_size % num_replicas != 0) {
        throw UsageError("DataLoader: with split_batches, batch_size (" +
                         std::to_string(options_.batch_size) +
                         ") must be a multiple of the number of processes (" +
                         std::to_string(num_replicas) + ")");
      }
      copy.options_.batch_size = options_.batch_size / num_replicas;
    }
    copy.rank_ = rank;
    copy.num_replicas_ = num_replicas;
    copy.device_ = device;
    copy.state_ = std::make_shared<DataLoaderState>(*state_);
    return copy;
  }

  class Iterator {
   public:
    Iterator(const DataLoader* loader,
             std::shared_ptr<std::vector<std::vector<int64_t>>> batches,
             size_t position)
        : loader_(loader), batches_(std::move(batches)), position_(position) {}
    Batch& operator*() {
      if (!current_) current_ = loader_->MakeBatch((*batches_)[position_]);
      return *current_;
    }
    Batch* operator->() { return &**this; }
    Iterator& operator++() {
      ++position_;
      current_.reset();
      return *this;
    }
    bool operator!=(const Iterator& other) const {
      return position_ != other.position_;
    }
    bool operator==(const Iterator& other) const {
      return position_ == other.position_;
    }

   private:
    const DataLoader* loader_;
    std::shared_ptr<std::vector<std::vector<int64_t>>> batches_;
    size_t position_;
    std::optional<Batch> current_;
  };

  // Starts the next epoch.
  Iterator begin() {
    current_epoch_ = std::make_shared<std::vector<std::vector<int64_t>>>(
        BatchesOfEpoch(state_->epoch));
    ++state_->epoch;
    return Iterator(this, current_epoch_, 0);
  }
  Iterator end() {
    return Iterator(this, current_epoch_,
                    current_epoch_ ? current_epoch_->size() : 0);
  }

  // Batches this rank gets per epoch.
  size_t size() const { return BatchesOfEpoch(0).size(); }
  size_t dataset_size() const { return dataset_size_; }
  size_t batch_size() const { return options_.batch_size; }
  // Samples per optimizer step over all ranks.
  size_t total_batch_size() const {
    return options_.batch_size * num_replicas_;
  }
  int64_t epoch() const { return state_->epoch; }
  void set_epoch(int64_t epoch) { state_->epoch = epoch; }
  std::shared_ptr<DataLoaderState> state() const { return state_; }

  // This rank's batches (sample indices) of `epoch`.
  std::vector<std::vector<int64_t>> BatchesOfEpoch(int64_t epoch) const {
    std::vector<int64_t> order(dataset_size_);
    if (options_.shuffle) {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(
          options_.seed + static_cast<uint64_t>(epoch));
      torch::Tensor perm = torch::randperm(static_cast<int64_t>(dataset_size_),
                                           generator, torch::kLong);
      std::copy(perm.data_ptr<int64_t>(),
                perm.data_ptr<int64_t>() + dataset_size_, order.begin());
    } else {
      for (size_t i = 0; i < dataset_size_; ++i) order[i] = i;
    }
    const size_t b = options_.batch_size;
    const size_t n = static_cast<size_t>(num_replicas_);
    size_t samples = order.size();
    if (options_.drop_last) {
      samples =
          options_.even_batches ? samples / (b * n) * (b * n) : samples / b * b;
    } else if (options_.even_batches && samples > 0) {
      samples = (samples + b * n - 1) / (b * n) * (b * n);
    }
    for (size_t i = order.size(); i < samples; ++i) {
      order.push_back(order[i % dataset_size_]);
    }
    order.resize(samples);
    std::vector<std::vector<int64_t>> batches;
    size_t index = 0;
    for (size_t start = 0; start < samples; start += b, ++index) {
      if (index % n != static_cast<size_t>(rank_)) continue;
      const size_t stop = std::min(samples, start + b);
      batches.emplace_back(order.begin() + start, order.begin() + stop);
    }
    return batches;
  }

 private:
  Batch MakeBatch(const std::vector<int64_t>& indices) const {
    std::vector<torch::Tensor> data;
    std::vector<torch::Tensor> targets;
    for (int64_t i : indices) {
      auto example = dataset_->get(static_cast<size_t>(i));
      data.push_back(example.data);
      targets.push_back(example.target);
    }
    return {torch::stack(data).to(device_), torch::stack(targets).to(device_)};
  }

  std::shared_ptr<Dataset> dataset_;
  DataLoaderOptions options_;
  std::shared_ptr<DataLoaderState> state_;
  size_t dataset_size_ = 0;
  int rank_ = 0;
  int num_replicas_ = 1;
  torch::Device device_ = torch::kCPU;
  std::shared_ptr<std::vector<std::vector<int64_t>>> current_epoch_;
};

}  // namespace accel
