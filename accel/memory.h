// Accelerate's find_executable_batch_size: runs a training function with a
// batch size and, when a rank runs out of memory, runs it again on every
// rank with a smaller one (90% of it, as Accelerate 1.x), until it fits.
//
//   accel::Accelerator accelerator;
//   double accuracy = accel::find_executable_batch_size(
//       accelerator,
//       [&](int64_t batch_size) {
//         accelerator.free_memory();  // What the last try prepared.
//         auto loader = accelerator.prepare(MakeLoader(batch_size));
//         ... prepare the model and optimizer, train, evaluate ...
//         return accuracy;
//       },
//       /*starting_batch_size=*/128);
//
// Unlike Accelerate's, every rank agrees on each try. A rank that runs out
// of memory interrupts the others' collectives (Communicator::Interrupt:
// they fail within about a second instead of waiting for it), every rank's
// try ends, the ranks exchange how it ended, and all of them try again with
// the same smaller size over a renewed communicator, or all stop. Out of
// memory is std::bad_alloc or LibTorch's "can't allocate memory" (its CPU
// allocator's error; Accelerate matches the same text), also when nested
// in another accel error. Any other failure ends the search on every rank:
// the rank that failed rethrows its exception, the others throw PeerError
// naming it. Memory the process keeps for reuse (host_memory.h) goes back
// to the system when the search starts, and again before each retry, and
// stays unkept for the rest of the run: freed blocks kept in the heap
// between live ones count against a memory limit but may not fit the next
// try's tensors, and made the search stop early (//tools/bench:
// batch_size_search, 300 MB a rank: batch 63 kept against 108 unkept).
//
// Needs a backend that can renew its communicator (gloo; not mpi, which
// cannot cancel a collective: a retry there fails with a UsageError).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "accel/accelerator.h"

namespace accel {

struct ExecutableBatchSizeOptions {
  int64_t starting_batch_size = 128;
  // The next size to try after `batch_size` ran out of memory; empty:
  // int(batch_size * 0.9), as Accelerate's reduce_batch_size_fn.
  std::function<int64_t(int64_t batch_size)> reduce_batch_size;
};

namespace internal {

// Whether `error` (or an exception nested in it) is running out of memory.
bool IsOutOfMemory(std::exception_ptr error);

// One try of the search on this rank; see find_executable_batch_size.
class BatchSizeTry {
 public:
  BatchSizeTry(Accelerator& accelerator, int64_t batch_size)
      : accelerator_(accelerator), batch_size_(batch_size) {}
  // The try's function threw `error` (out of memory or not): the other
  // ranks' collectives are interrupted.
  void Failed(std::exception_ptr error);
  // Exchanges how the try ended with the other ranks (every rank calls
  // it). True: every rank succeeded. False: a rank ran out of memory and
  // the communicator is renewed for the next try. Throws when a rank
  // failed otherwise (its own exception on that rank).
  bool Agree();

 private:
  Accelerator& accelerator_;
  const int64_t batch_size_;
  std::exception_ptr error_;
  bool out_of_memory_ = false;
  bool interrupted_ = false;  // By another rank's Interrupt.
};

// Before the first try: memory kept for reuse goes back to the system, and
// large blocks get their own mappings from then on, so that no try leaves
// free memory scattered among the heap's live blocks for the next one.
void StartSearch();
// The next size after `batch_size`; UsageError when it does not shrink.
int64_t NextBatchSize(const ExecutableBatchSizeOptions& options,
                      int64_t batch_size);
// Error when no size is left to try.
[[noreturn]] void NoBatchSizeLeft(const std::vector<int64_t>& tried);

}  // namespace internal

// Runs function(batch_size) from options.starting_batch_size down until it
// returns on every rank; returns its result. See the top of this file.
template <typename Function>
std::invoke_result_t<Function, int64_t> find_executable_batch_size(
    Accelerator& accelerator, Function&& function,
    const ExecutableBatchSizeOptions& options) {
  using Result = std::invoke_result_t<Function, int64_t>;
  std::vector<int64_t> tried;
  internal::StartSearch();
  for (int64_t batch_size = options.starting_batch_size;;
       batch_size = internal::NextBatchSize(options, batch_size)) {
    if (batch_size <= 0) internal::NoBatchSizeLeft(tried);
    tried.push_back(batch_size);
    internal::BatchSizeTry attempt(accelerator, batch_size);
    if constexpr (std::is_void_v<Result>) {
      try {
        function(batch_size);
      } catch (...) {
        attempt.Failed(std::current_exception());
      }
      if (attempt.Agree()) return;
    } else {
      std::optional<Result> result;
      try {
        result.emplace(function(batch_size));
      } catch (...) {
        attempt.Failed(std::current_exception());
      }
      if (attempt.Agree()) return std::move(*result);
    }
  }
}

template <typename Function>
std::invoke_result_t<Function, int64_t> find_executable_batch_size(
    Accelerator& accelerator, Function&& function,
    int64_t starting_batch_size = 128) {
  ExecutableBatchSizeOptions options;
  options.starting_batch_size = starting_batch_size;
  return find_executable_batch_size(accelerator,
                                    std::forward<Function>(function), options);
}

}  // namespace accel
