// What the pieces of a training loop share about the current step, as
// Accelerate's GradientState: whether this micro-step synchronizes gradients
// (gradient accumulation), and where the innermost active data loader stands
// (gather_for_metrics drops the samples that even_batches duplicated on its
// last batch).
//
//   accel::GradientState state;
//   state.set_accumulation_steps(4);
//   state.Advance();               // micro-step 1 of 4
//   state.sync_gradients();        // false until the 4th, or the loader's end
//
// The Accelerator owns one; prepared data loaders report to it while they are
// iterated. Loaders nest (an evaluation loop inside a training loop): the
// innermost active one is the one that counts. Used from the training thread
// only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace accel {

class GradientState {
 public:
  // --- Gradient accumulation ----------------------------------------------
  int accumulation_steps() const { return num_steps_; }
  void set_accumulation_steps(int steps) { num_steps_ = steps; }
  // Accelerate's sync_with_dataloader: the last batch of a loader always
  // syncs, even in the middle of an accumulation cycle.
  void set_sync_with_dataloader(bool sync) { sync_with_dataloader_ = sync; }

  bool sync_gradients() const { return sync_gradients_; }
  void set_sync_gradients(bool sync) { sync_gradients_ = sync; }
  // Micro-steps taken in the current accumulation cycle.
  int64_t step() const { return step_; }
  // Whether micro-steps since the last sync hold unsynced gradients.
  bool pending() const { return step_ % num_steps_ != 0; }
  // Starts a new cycle (every rank at once: the end of a join).
  void ResetCycle() {
    step_ = 0;
    sync_gradients_ = true;
  }

  // Starts a micro-step (Accelerator::accumulate): syncs on every
  // accumulation_steps-th one and, unless !at_loader_end (inside
  // join_uneven_inputs, where ranks' loaders end at different steps), at
  // the end of the active data loader.
  void Advance(bool at_loader_end = true) {
    if (at_loader_end && sync_with_dataloader_ && end_of_dataloader()) {
      step_ = 0;
      sync_gradients_ = true;
      return;
    }
    ++step_;
    sync_gradients_ = step_ % num_steps_ == 0;
  }

  // --- The active data loader ---------------------------------------------
  bool in_dataloader() const { return !loaders_.empty(); }
  // Whether the innermost active loader has handed out its last batch.
  bool end_of_dataloader() const {
    return !loaders_.empty() && loaders_.back().at_end;
  }
  // Samples of the last global batch that are real (not duplicates added by
  // even_batches); 0 when the loader duplicates none.
  int64_t remainder() const {
    return loaders_.empty() ? 0 : loaders_.back().remainder;
  }

  // Called by data loaders: a pass over `loader` begins or ends, or reaches
  // its last batch.
  void BeginPass(const void* loader, int64_t remainder) {
    EndPass(loader);
    loaders_.push_back({loader, remainder, false});
  }
  void EndPass(const void* loader) {
    loaders_.erase(
        std::remove_if(loaders_.begin(), loaders_.end(),
                       [&](const Active& a) { return a.loader == loader; }),
        loaders_.end());
  }
  void ReachedLastBatch(const void* loader) {
    for (auto& active : loaders_) {
      if (active.loader == loader) active.at_end = true;
    }
  }

 private:
  struct Active {
    const void* loader;
    int64_t remainder;
    bool at_end;
  };
  int num_steps_ = 1;
  bool sync_with_dataloader_ = true;
  bool sync_gradients_ = true;
  int64_t step_ = 0;
  std::vector<Active> loaders_;
};

}  // namespace accel
