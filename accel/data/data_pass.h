// One pass of a data loader over its samples, and what makes a batch:
// per-sample generators (augmentation that is the same whatever the
// workers), the default collate functions, moves to the device, and the
// worker threads that make batches ahead. data_loader.h builds on it.
//
//   torch::Tensor noise = torch::rand({3}, accel::data::SampleGenerator());
//   auto batch = accel::data::DefaultCollate<Sample>()(std::move(samples));
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/data/example.h>
#include <torch/types.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "accel/data/data_loader_state.h"
#include "accel/data/gradient_state.h"
#include "accel/runtime/base/errors.h"

namespace accel {

namespace data {

// The random generator of the sample being made, on the thread making it:
// seeded from the loader's seed, the epoch and the sample's index, so that
// augmentations drawn from it are the same in every run with that seed,
// whatever num_workers, the number of processes or a resume. Draw from it
// (torch::rand(sizes, accel::data::SampleGenerator())) rather than from
// torch's global generator, which worker threads share in whatever order
// they run. Outside a loader's get() and collate it is seeded 0.
at::Generator& SampleGenerator();

// The seed of sample `index` of `epoch` for a loader seeded `seed`.
uint64_t SampleSeed(uint64_t seed, int64_t epoch, int64_t index);

// Throws DataError "DataLoader: <where>: <the exception in flight>", with
// that exception nested. Call from a catch block.
[[noreturn]] void RethrowWithContext(const std::string& where);
// "3, 17, 4" (at most the first 8, then "...").
std::string ListSamples(const std::vector<int64_t>& ids);

// Whether a dataset takes the generator as get(index, generator).
template <typename Dataset, typename = void>
struct TakesGenerator : std::false_type {};
template <typename Dataset>
struct TakesGenerator<Dataset,
                      std::void_t<decltype(std::declval<Dataset&>().get(
                          size_t{0}, std::declval<at::Generator&>()))>>
    : std::true_type {};

template <typename Dataset>
auto GetSample(Dataset& dataset, size_t index, at::Generator& generator) {
  if constexpr (TakesGenerator<Dataset>::value) {
    return dataset.get(index, generator);
  } else {
    return dataset.get(index);
  }
}

// The type that a dataset's get() returns.
template <typename Dataset>
using SampleOf = std::decay_t<decltype(GetSample(
    std::declval<Dataset&>(), size_t{0}, std::declval<at::Generator&>()))>;

// The default collate function for a sample type; `supported` is false for
// types it does not know, which then need a collate function of their own.
template <typename Sample>
struct DefaultCollate {
  static constexpr bool supported = false;
  using Batch = Sample;
};

template <>
struct DefaultCollate<torch::Tensor> {
  static constexpr bool supported = true;
  using Batch = torch::Tensor;
  static Batch Apply(std::vector<torch::Tensor> samples) {
    return torch::stack(samples);
  }
};

template <typename Data, typename Target>
struct DefaultCollate<torch::data::Example<Data, Target>> {
  static constexpr bool supported = true;
  using Batch = torch::data::Example<Data, Target>;
  static Batch Apply(std::vector<Batch> samples) {
    std::vector<torch::Tensor> data;
    data.reserve(samples.size());
    for (auto& s : samples) data.push_back(std::move(s.data));
    if constexpr (std::is_same_v<Target, torch::Tensor>) {
      std::vector<torch::Tensor> targets;
      targets.reserve(samples.size());
      for (auto& s : samples) targets.push_back(std::move(s.target));
      return {torch::stack(data), torch::stack(targets)};
    } else {
      return {torch::stack(data)};
    }
  }
};

template <>
struct DefaultCollate<std::map<std::string, torch::Tensor>> {
  static constexpr bool supported = true;
  using Batch = std::map<std::string, torch::Tensor>;
  static Batch Apply(std::vector<Batch> samples) {
    Batch batch;
    if (samples.empty()) return batch;
    for (const auto& [key, unused] : samples.front()) {
      std::vector<torch::Tensor> values;
      values.reserve(samples.size());
      for (size_t i = 0; i < samples.size(); ++i) {
        auto it = samples[i].find(key);
        if (it == samples[i].end() ||
            samples[i].size() != samples.front().size()) {
          throw UsageError(
              "DataLoader: samples of one batch have different keys (the "
              "first has '" +
              key + "' and " + std::to_string(samples.front().size()) +
              " keys, sample " + std::to_string(i) + " has " +
              std::to_string(samples[i].size()) +
              " keys); the default collate stacks each key");
        }
        values.push_back(std::move(it->second));
      }
      batch[key] = torch::stack(values);
    }
    return batch;
  }
};

// Moves the tensors of a batch to `device`, through pinned memory when
// `pin` (a GPU). Batch types it does not know are left as they are.
inline torch::Tensor ToDevice(const torch::Tensor& t, torch::Device device,
                              bool pin) {
  if (!t.defined() || t.device() == device) return t;
  if (pin && device.is_cuda() && t.is_cpu()) {
    return t.pin_memory().to(device, /*non_blocking=*/true);
  }
  return t.to(device);
}
inline void MoveBatch(torch::Tensor& batch, torch::Device device, bool pin) {
  batch = ToDevice(batch, device, pin);
}
template <typename Data, typename Target>
void MoveBatch(torch::data::Example<Data, Target>& batch, torch::Device device,
               bool pin) {
  if constexpr (std::is_same_v<Data, torch::Tensor>) {
    batch.data = ToDevice(batch.data, device, pin);
  }
  if constexpr (std::is_same_v<Target, torch::Tensor>) {
    batch.target = ToDevice(batch.target, device, pin);
  }
}
inline void MoveBatch(std::map<std::string, torch::Tensor>& batch,
                      torch::Device device, bool pin) {
  for (auto& [key, value] : batch) value = ToDevice(value, device, pin);
}
template <typename Batch>
void MoveBatch(Batch&, torch::Device, bool) {}

// dispatch_batches: `from_main` returns the main process's tensor on every
// rank (it is given an undefined one elsewhere); each rank keeps its share
// of dim 0: rank r of n the r-th of n equal parts.
using FromMainProcess = std::function<torch::Tensor(const torch::Tensor&)>;

inline torch::Tensor ShareOf(const torch::Tensor& global, int rank, int n) {
  const int64_t rows = global.dim() == 0 ? 0 : global.size(0);
  if (rows % n != 0) {
    throw DataError(
        "DataLoader: dispatch_batches: the main process's batch "
        "has " +
        std::to_string(rows) +
        " rows, not a multiple of the number of processes (" +
        std::to_string(n) + ")");
  }
  return global.narrow(0, rank * (rows / n), rows / n);
}

// Which batch types dispatch_batches can send (those the default collate
// makes).
template <typename Batch>
struct Dispatchable : std::false_type {};
template <>
struct Dispatchable<torch::Tensor> : std::true_type {};
template <>
struct Dispatchable<torch::data::Example<>> : std::true_type {};
template <>
struct Dispatchable<std::map<std::string, torch::Tensor>> : std::true_type {};

inline torch::Tensor DispatchBatch(const torch::Tensor& batch,
                                   const FromMainProcess& from_main, int rank,
                                   int n) {
  return ShareOf(from_main(batch), rank, n);
}
inline torch::data::Example<> DispatchBatch(const torch::data::Example<>& batch,
                                            const FromMainProcess& from_main,
                                            int rank, int n) {
  return {ShareOf(from_main(batch.data), rank, n),
          ShareOf(from_main(batch.target), rank, n)};
}
// The keys travel first, as the bytes of "key\0key\0...".
inline std::map<std::string, torch::Tensor> DispatchBatch(
    const std::map<std::string, torch::Tensor>& batch,
    const FromMainProcess& from_main, int rank, int n) {
  torch::Tensor keys;
  if (rank == 0) {
    std::string joined;
    for (const auto& [key, value] : batch) joined += key + '\0';
    keys = torch::empty({static_cast<int64_t>(joined.size())}, torch::kUInt8);
    std::copy(joined.begin(), joined.end(), keys.data_ptr<uint8_t>());
  }
  const torch::Tensor all_keys = from_main(keys).to(torch::kCPU);
  const char* bytes = reinterpret_cast<const char*>(all_keys.data_ptr());
  std::map<std::string, torch::Tensor> mine;
  for (int64_t start = 0; start < all_keys.numel();) {
    const std::string key(bytes + start);
    const auto it = batch.find(key);
    mine[key] = ShareOf(
        from_main(it == batch.end() ? torch::Tensor() : it->second), rank, n);
    start += static_cast<int64_t>(key.size()) + 1;
  }
  return mine;
}

template <typename Dataset>
size_t SizeOf(const Dataset& dataset) {
  const auto size = dataset.size();  // c10::optional in torch's datasets.
  if constexpr (std::is_integral_v<std::decay_t<decltype(size)>>) {
    return static_cast<size_t>(size);
  } else {
    if (!size) throw UsageError("DataLoader: the dataset must have a size");
    return static_cast<size_t>(*size);
  }
}

// One pass over a loader's batches for one rank: makes them (ahead, on
// worker threads, when asked to) and tells the GradientState where the pass
// stands. Ends when the last iterator of the pass is destroyed, also when
// the loop is left early.
template <typename Sample, typename Batch>
class Pass {
 public:
  using Make = std::function<Batch(const std::vector<int64_t>&)>;
  // Runs on the thread that iterates, on each batch made (dispatch_batches'
  // collectives, which must come in order on one thread).
  using Deliver = std::function<Batch(Batch)>;

  Pass(Make make, std::vector<std::vector<int64_t>> batches, size_t first,
       size_t workers, size_t prefetch, std::shared_ptr<DataLoaderState> state,
       std::shared_ptr<GradientState> gradient_state, int64_t remainder,
       Deliver deliver = nullptr)
      : make_(std::move(make)),
        deliver_(std::move(deliver)),
        batches_(std::move(batches)),
        next_to_make_(first),
        consumed_(first),
        capacity_(workers * std::max<size_t>(prefetch, 1)),
        state_(std::move(state)),
        gradient_state_(std::move(gradient_state)) {
    state_->in_pass = true;
    state_->position = static_cast<int64_t>(first);
    state_->pass_batches = static_cast<int64_t>(batches_.size());
    if (gradient_state_) gradient_state_->BeginPass(this, remainder);
    for (size_t i = 0; i < workers && first < batches_.size(); ++i) {
      workers_.emplace_back([this] { WorkerLoop(); });
    }
  }

  ~Pass() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (auto& worker : workers_) worker.join();
    if (state_->position >= state_->pass_batches) state_->in_pass = false;
    if (gradient_state_) gradient_state_->EndPass(this);
  }

  size_t size() const { return batches_.size(); }

  // The batch at `position`, made or taken from the workers once.
  Batch& At(size_t position) {
    if (position >= batches_.size()) {
      throw UsageError("DataLoader: iterator dereferenced past the last batch");
    }
    if (current_position_ != position || !current_) {
      current_.reset();
      current_ = workers_.empty() ? make_(batches_[position]) : Take(position);
      if (deliver_) current_ = deliver_(std::move(*current_));
      current_position_ = position;
      state_->position = static_cast<int64_t>(position) + 1;
      if (position + 1 == batches_.size() && gradient_state_) {
        gradient_state_->ReachedLastBatch(this);
      }
    }
    return *current_;
  }

 private:
  struct Made {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };

  Batch Take(size_t position) {
    std::unique_lock<std::mutex> lock(mutex_);
    consumed_ = position;
    changed_.notify_all();
    changed_.wait(lock, [&] { return ready_.count(position) > 0; });
    Made made = std::move(ready_[position]);
    ready_.erase(position);
    // Batches before this one were skipped by the caller; drop them.
    ready_.erase(ready_.begin(), ready_.lower_bound(position));
    if (made.error) std::rethrow_exception(made.error);
    return std::move(*made.batch);
  }

  void WorkerLoop() {
    while (true) {
      size_t index;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] {
          return stopping_ || (next_to_make_ < batches_.size() &&
                               next_to_make_ < consumed_ + capacity_);
        });
        if (stopping_) return;
        index = next_to_make_++;
      }
      Made made;
      try {
        made.batch = make_(batches_[index]);
      } catch (...) {
        made.error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ready_[index] = std::move(made);
      }
      changed_.notify_all();
    }
  }

  const Make make_;
  const Deliver deliver_;
  const std::vector<std::vector<int64_t>> batches_;
  std::optional<Batch> current_;
  size_t current_position_ = 0;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<size_t, Made> ready_;
  size_t next_to_make_;
  size_t consumed_;
  const size_t capacity_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;

  std::shared_ptr<DataLoaderState> state_;
  std::shared_ptr<GradientState> gradient_state_;
};

}  // namespace data

}  // namespace accel
