// A data loader with Accelerate's sharding: every rank gets full batches of
// `batch_size`, rank r taking batches r, r + N, r + 2N, ... of one shuffled
// order that all ranks share (seeded by `seed` + epoch, so each epoch
// reshuffles and every rank agrees without talking).
//
//   class MyDataset {                    // any class with get(i) and size()
//    public:
//     torch::data::Example<> get(size_t i);  // or a torch::Tensor, or a
//     size_t size() const;                   // std::map<std::string, Tensor>
//   };
//   accel::DataLoaderOptions options;
//   options.batch_size = 8;
//   options.shuffle = true;
//   options.num_workers = 2;             // batches made ahead on 2 threads
//   accel::DataLoader<MyDataset> loader(MyDataset(), options);
//   auto prepared = accelerator.prepare(loader);
//   for (auto& batch : prepared) { batch.data; batch.target; }
//
// Samples are combined into a batch by a collate function: by default
// torch::stack of each field (Example<> -> Example<> of stacked data and
// targets, Tensor -> stacked Tensor, map -> map of stacked tensors). Pass
// your own as the third argument for anything else:
//
//   accel::DataLoader<Words, std::vector<std::string>> words(
//       Words(), options, [](std::vector<std::string> samples) {
//         return samples;
//       });
//
// even_batches (default): when the samples do not fill the same number of
// full batches on every rank, samples from the start of the epoch's order
// are appended so that they do (as Accelerate does; gather_for_metrics drops
// them again). Each loop over the loader is the next epoch; epoch() and
// set_epoch() expose the counter. save_state() records the epoch and, when
// called in the middle of one, how many batches were handed out, so a
// resumed run continues with the next batch; skip_first_batches() does the
// same by hand. A pass left with `break` differs between the two views: in
// this process the next loop is the next epoch, but a save_state() after
// the break records the position inside the pass left, so a run resumed
// from it first gives that pass's remaining batches (as Accelerate's
// stateful loader does). Save inside the loop, or after it ends, where both
// agree.
//
// With num_workers > 0, worker threads make up to num_workers *
// prefetch_factor batches ahead, so loading overlaps training; the
// dataset's get() must then be safe to call from several threads. Batches
// for a GPU are made in pinned memory and copied without blocking.
#pragma once

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>
#include <torch/types.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "accel/data/data_loader_state.h"
#include "accel/data/data_pass.h"
#include "accel/data/gradient_state.h"
#include "accel/runtime/base/errors.h"

namespace accel {

template <typename Dataset,
          typename Batch =
              typename data::DefaultCollate<data::SampleOf<Dataset>>::Batch>
class DataLoader {
 public:
  using Sample = data::SampleOf<Dataset>;
  using CollateFn = std::function<Batch(std::vector<Sample>)>;

  DataLoader(Dataset dataset, DataLoaderOptions options)
      : DataLoader(std::move(dataset), options, DefaultCollateFn()) {}

  DataLoader(Dataset dataset, DataLoaderOptions options, CollateFn collate)
      : dataset_(std::make_shared<Dataset>(std::move(dataset))),
        options_(options),
        collate_(std::move(collate)),
        state_(std::make_shared<DataLoaderState>()) {
    if (options_.batch_size == 0) {
      throw UsageError("DataLoader: batch_size must be at least 1, found 0");
    }
    state_->rank_batch_size = static_cast<int64_t>(options_.batch_size);
    if (!collate_)
      throw UsageError("DataLoader: the collate function is empty");
    dataset_size_ = data::SizeOf(*dataset_);
  }

  // The same data, sharded for `rank` of `num_replicas` (used by prepare()).
  DataLoader Shard(
      int rank, int num_replicas, torch::Device device,
      std::shared_ptr<GradientState> gradient_state = nullptr) const {
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
    copy.state_->rank_batch_size =
        static_cast<int64_t>(copy.options_.batch_size);
    copy.state_->num_replicas = num_replicas;
    copy.state_->split_batches = options_.split_batches;
    copy.gradient_state_ = std::move(gradient_state);
    return copy;
  }

  // The same loader, whose next pass starts after its first `batches`
  // batches (Accelerate's skip_first_batches). It replaces a position that
  // load_state restored, so a script that computes its own resume step gets
  // the same batches. Later passes are whole.
  DataLoader SkipFirstBatches(int64_t batches) const {
    if (batches < 0) {
      throw UsageError(
          "skip_first_batches: the number of batches must not be "
          "negative, found " +
          std::to_string(batches));
    }
    DataLoader copy = *this;
    copy.skip_next_ = batches;
    return copy;
  }

  class Iterator {
   public:
    using PassType = data::Pass<Sample, Batch>;
    Iterator(std::shared_ptr<PassType> pass, size_t position)
        : pass_(std::move(pass)), position_(position) {}
    Batch& operator*() { return pass_->At(position_); }
    Batch* operator->() { return &**this; }
    Iterator& operator++() {
      ++position_;
      return *this;
    }
    bool operator!=(const Iterator& other) const {
      return position_ != other.position_;
    }
    bool operator==(const Iterator& other) const {
      return position_ == other.position_;
    }

   private:
    std::shared_ptr<PassType> pass_;
    size_t position_;
  };

  // Starts the next epoch (or resumes the one a checkpoint stopped in).
  Iterator begin() {
    const int64_t epoch = state_->epoch;
    // A checkpoint's position is in samples of the epoch; skip_first_batches
    // counts this rank's batches of the whole epoch and replaces it.
    size_t start_sample = static_cast<size_t>(std::min<int64_t>(
        state_->resume_samples, static_cast<int64_t>(dataset_size_)));
    size_t skip_batches = 0;
    if (skip_next_) {
      start_sample = 0;
      skip_batches = static_cast<size_t>(*skip_next_);
    }
    skipped_ = skip_next_ ? skip_batches : 0;
    skip_next_.reset();
    state_->resume_samples = 0;
    ++state_->epoch;
    auto batches = BatchesOfEpoch(epoch, start_sample);
    const size_t first = std::min(batches.size(), skip_batches);
    const bool dispatching = dispatch_ && num_replicas_ > 1;
    if (dispatching && !EvenBatches()) {
      throw UsageError(
          "DataLoader: dispatch_batches needs even_batches: every process "
          "must take each batch the main process sends");
    }
    if (dispatching && rank_ == 0) {
      batches = GlobalBatchesOfEpoch(epoch, start_sample);
    }
    state_->pass_start = static_cast<int64_t>(start_sample);
    state_->samples_per_batch = static_cast<int64_t>(total_batch_size());
    state_->dataset_size = static_cast<int64_t>(dataset_size_);
    typename Iterator::PassType::Make make =
        [dataset = dataset_, collate = collate_, device = device_,
         pin = options_.pin_memory, seed = options_.seed,
         epoch](const std::vector<int64_t>& ids) {
          at::Generator& generator = data::SampleGenerator();
          std::vector<Sample> samples;
          samples.reserve(ids.size());
          for (int64_t i : ids) {
            generator.set_current_seed(data::SampleSeed(seed, epoch, i));
            try {
              samples.push_back(
                  data::GetSample(*dataset, static_cast<size_t>(i), generator));
            } catch (...) {
              data::RethrowWithContext("the data set's get(" +
                                       std::to_string(i) + ") in epoch " +
                                       std::to_string(epoch));
            }
          }
          // Collate's own draws (mixup, ...) follow from the batch's first
          // sample, under another seed than that sample's.
          generator.set_current_seed(
              ~data::SampleSeed(seed, epoch, ids.empty() ? 0 : ids.front()));
          std::optional<Batch> batch;
          try {
            batch.emplace(collate(std::move(samples)));
          } catch (...) {
            data::RethrowWithContext("collating the batch of samples " +
                                     data::ListSamples(ids) + " in epoch " +
                                     std::to_string(epoch));
          }
          generator.set_current_seed(0);
          data::MoveBatch(*batch, device, pin);
          return std::move(*batch);
        };
    typename Iterator::PassType::Deliver deliver;
    if (dispatching) {
      // Only the main process reads samples; the others get their share of
      // each batch it makes.
      if (rank_ != 0) {
        make = [](const std::vector<int64_t>&) { return Batch(); };
      }
      if constexpr (data::Dispatchable<Batch>::value) {
        deliver = [from_main = dispatch_, rank = rank_,
                   n = num_replicas_](Batch batch) {
          return data::DispatchBatch(batch, from_main, rank, n);
        };
      }
    }
    auto pass = std::make_shared<typename Iterator::PassType>(
        std::move(make), std::move(batches), first, options_.num_workers,
        options_.prefetch_factor, state_, gradient_state_,
        Remainder(dataset_size_ - start_sample), std::move(deliver));
    current_pass_ = pass;
    return Iterator(std::move(pass), first);
  }
  Iterator end() {
    auto pass = current_pass_.lock();
    return Iterator(nullptr, pass ? pass->size() : 0);
  }

  // Batches this rank gets in an epoch: Python's len(prepared_loader), the
  // whole epoch also after load_state resumed in the middle of one (a loop
  // that computes its epoch and step from accelerator.step() / size()
  // stays right). A loader that skip_first_batches returned counts the
  // epoch less the skipped batches, until its shortened pass ends (as
  // Accelerate's skipped loader). What a pass has left: batches_remaining().
  size_t size() const {
    size_t skipped = 0;
    if (skip_next_) {
      skipped = static_cast<size_t>(*skip_next_);
    } else if (skipped_ > 0 && !current_pass_.expired() && state_->in_pass) {
      skipped = skipped_;
    }
    return batches_per_epoch() - std::min(batches_per_epoch(), skipped);
  }
  // Batches of the pass under way that this rank has not been given yet
  // (0 once the last one is out); between passes, those the next pass
  // gives: a whole epoch, or what is left of one that load_state or
  // skip_first_batches resumes.
  size_t batches_remaining() const {
    if (!current_pass_.expired() && state_->in_pass) {
      return static_cast<size_t>(
          std::max<int64_t>(state_->pass_batches - state_->position, 0));
    }
    if (skip_next_) return size();
    const size_t done = static_cast<size_t>(std::min<int64_t>(
        state_->resume_samples, static_cast<int64_t>(dataset_size_)));
    return Plan(dataset_size_ - done).batches_per_rank;
  }
  // Batches this rank gets in a whole epoch.
  size_t batches_per_epoch() const {
    return Plan(dataset_size_).batches_per_rank;
  }
  size_t dataset_size() const { return dataset_size_; }
  size_t batch_size() const { return options_.batch_size; }
  // Samples per optimizer step over all ranks.
  size_t total_batch_size() const {
    return options_.batch_size * num_replicas_;
  }
  const DataLoaderOptions& options() const { return options_; }
  // Before Shard(): prepare() applies the Accelerator's batching options.
  DataLoaderOptions& mutable_options() { return options_; }
  int64_t epoch() const { return state_->epoch; }
  void set_epoch(int64_t epoch) { state_->epoch = epoch; }
  std::shared_ptr<DataLoaderState> state() const { return state_; }
  Dataset& dataset() { return *dataset_; }

  // Accelerate's dispatch_batches (set by prepare()): the main process
  // makes every process's batch and `from_main` sends it (returns the main
  // process's tensor on every rank); the others read no sample. Batches of
  // the default collate's types only (a UsageError otherwise).
  void DispatchFromMainProcess(data::FromMainProcess from_main) {
    if constexpr (!data::Dispatchable<Batch>::value) {
      throw UsageError(
          "dispatch_batches: the main process can send batches of "
          "torch::Tensor, torch::data::Example<> or std::map<std::string, "
          "torch::Tensor> only, not this loader's collated type");
    }
    dispatch_ = std::move(from_main);
  }
  bool dispatches_batches() const { return static_cast<bool>(dispatch_); }

  // The batches of every rank, step by step: batch k holds rank 0's k-th
  // batch, then rank 1's, ... (what the main process makes under
  // dispatch_batches).
  std::vector<std::vector<int64_t>> GlobalBatchesOfEpoch(
      int64_t epoch, size_t start_sample = 0) const {
    const std::vector<std::vector<int64_t>> all =
        BatchesOfEpoch(epoch, start_sample, /*every_rank=*/true);
    const size_t n = static_cast<size_t>(num_replicas_);
    std::vector<std::vector<int64_t>> global((all.size() + n - 1) / n);
    for (size_t i = 0; i < all.size(); ++i) {
      global[i / n].insert(global[i / n].end(), all[i].begin(), all[i].end());
    }
    return global;
  }

  // This rank's batches (sample indices) of `epoch`, or of what is left of
  // it after the first `start_sample` samples of its order (a resumed
  // epoch, laid out over this loader's processes as a fresh one would be);
  // every_rank: all ranks' batches, in order.
  std::vector<std::vector<int64_t>> BatchesOfEpoch(
      int64_t epoch, size_t start_sample = 0, bool every_rank = false) const {
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
    start_sample = std::min(start_sample, dataset_size_);
    const Layout plan = Plan(dataset_size_ - start_sample);
    // Padding repeats samples from the start of the epoch's order.
    std::vector<int64_t> pass(order.begin() + start_sample, order.end());
    for (size_t i = 0; pass.size() < plan.samples; ++i) {
      pass.push_back(order[i % dataset_size_]);
    }
    pass.resize(plan.samples);
    const size_t b = options_.batch_size;
    const size_t n = static_cast<size_t>(num_replicas_);
    std::vector<std::vector<int64_t>> batches;
    size_t index = 0;
    for (size_t start = 0; start < plan.samples; start += b, ++index) {
      if (!every_rank && index % n != static_cast<size_t>(rank_)) continue;
      const size_t stop = std::min(plan.samples, start + b);
      batches.emplace_back(pass.begin() + start, pass.begin() + stop);
    }
    return batches;
  }

 private:
  static CollateFn DefaultCollateFn() {
    static_assert(data::DefaultCollate<Sample>::supported,
                  "accel::DataLoader: the default collate stacks "
                  "torch::data::Example<>, torch::Tensor or "
                  "std::map<std::string, torch::Tensor> samples; for other "
                  "sample types pass a collate function as the third "
                  "constructor argument");
    if constexpr (data::DefaultCollate<Sample>::supported) {
      return [](std::vector<Sample> samples) {
        return data::DefaultCollate<Sample>::Apply(std::move(samples));
      };
    } else {
      return nullptr;
    }
  }

  struct Layout {
    size_t samples;  // After padding or dropping.
    size_t batches_per_rank;
  };
  // How a pass over `samples` samples is laid out: padded with the first
  // ones of the epoch up to full batches on every rank (even_batches), or
  // cut to full batches (drop_last). One process is never padded, as in
  // Accelerate.
  Layout Plan(size_t samples) const {
    const size_t b = options_.batch_size;
    const size_t n = static_cast<size_t>(num_replicas_);
    if (options_.drop_last) {
      samples = EvenBatches() ? samples / (b * n) * (b * n) : samples / b * b;
    } else if (EvenBatches() && n > 1 && samples > 0) {
      samples = (samples + b * n - 1) / (b * n) * (b * n);
    }
    const size_t batches = (samples + b - 1) / b;
    const size_t r = static_cast<size_t>(rank_);
    return {samples, batches / n + (r < batches % n ? 1 : 0)};
  }

  bool EvenBatches() const {
    return state_->even_batches_override.value_or(options_.even_batches);
  }

  // Real samples in the last global batch of a pass over `samples`, when
  // even_batches filled it up with duplicates (what gather_for_metrics
  // keeps); 0 when none were added.
  int64_t Remainder(size_t samples) const {
    if (options_.drop_last || !EvenBatches()) return 0;
    return static_cast<int64_t>(samples % total_batch_size());
  }

  std::shared_ptr<Dataset> dataset_;
  DataLoaderOptions options_;
  CollateFn collate_;
  std::shared_ptr<DataLoaderState> state_;
  std::shared_ptr<GradientState> gradient_state_;
  size_t dataset_size_ = 0;
  int rank_ = 0;
  int num_replicas_ = 1;
  torch::Device device_ = torch::kCPU;
  std::optional<int64_t> skip_next_;
  size_t skipped_ = 0;  // Batches skip_first_batches took off the last pass.
  std::weak_ptr<data::Pass<Sample, Batch>> current_pass_;
  data::FromMainProcess dispatch_;
};

}  // namespace accel
