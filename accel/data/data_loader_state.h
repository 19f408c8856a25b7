// What a data loader is configured with (DataLoaderOptions) and where it
// stands (DataLoaderState: epoch, batches handed out, what a checkpoint
// records and restores). See data_loader.h for the loader itself.
//
//   accel::DataLoaderOptions options;
//   options.batch_size = 8;
//   auto [epoch, samples_done] = loader.state()->Checkpoint();
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

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
  // Threads that make batches ahead of the training loop (0: batches are
  // made when the loop asks for them), and how many each keeps ready.
  size_t num_workers = 0;
  size_t prefetch_factor = 2;
  // Batches for a GPU are made in pinned memory and copied asynchronously.
  bool pin_memory = true;
};

// Where a loader stands; shared by all copies of one loader, and recorded by
// save_state. A position inside an epoch is counted in samples of the
// epoch's order that every rank together has taken, which means the same
// at any number of processes: a checkpoint saved at N processes resumes at
// another N with no sample of the epoch skipped or repeated.
struct DataLoaderState {
  int64_t epoch = 0;         // Passes started (the current one included).
  int64_t position = 0;      // Batches handed out in the current pass.
  int64_t pass_batches = 0;  // Batches in the current pass.
  bool in_pass = false;
  // Samples of the epoch's order that the current pass started after (a
  // resumed pass), and that all ranks take per batch of the pass.
  int64_t pass_start = 0;
  int64_t samples_per_batch = 0;
  int64_t dataset_size = 0;
  // Samples of the epoch's order the next pass skips (a checkpoint's).
  int64_t resume_samples = 0;
  // This rank's batch size and the loader's sharding (set by Shard()).
  int64_t rank_batch_size = 1;
  int64_t num_replicas = 1;
  bool split_batches = false;
  // join_uneven_inputs' even_batches, over the loader's own, for the
  // passes that start while it is set.
  std::optional<bool> even_batches_override;

  // The epoch to run next and the samples of it already done: what a
  // checkpoint records.
  std::pair<int64_t, int64_t> Checkpoint() const {
    if (in_pass && position < pass_batches) {
      return {epoch - 1, std::min(dataset_size,
                                  pass_start + position * samples_per_batch)};
    }
    return {epoch, 0};
  }
  void Restore(int64_t next_epoch, int64_t samples_done) {
    epoch = next_epoch;
    resume_samples = std::max<int64_t>(samples_done, 0);
    position = 0;
    in_pass = false;
  }
  // A position that an older accel recorded as batches per rank, at
  // `saved_processes` processes.
  void RestoreBatches(int64_t next_epoch, int64_t batches_done,
                      int64_t saved_processes) {
    const int64_t global_batch = split_batches
                                     ? rank_batch_size * num_replicas
                                     : rank_batch_size * saved_processes;
    Restore(next_epoch, batches_done * global_batch);
  }
};

}  // namespace accel
