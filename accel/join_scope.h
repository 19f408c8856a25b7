// Accelerate's join_uneven_inputs (torch's Join over DDP): the scope
// Accelerator::join_uneven_inputs returns and the models it names.
//
//   {
//     accel::JoinScope join = accelerator.join_uneven_inputs(
//         {model}, /*even_batches=*/false);
//     for (auto& batch : loader) { ... accelerator.backward(loss); ... }
//   }  // waits here for the ranks that still have batches
//
// Inside the scope, prepared loaders run with `even_batches` (default: the
// Accelerator's); with it off, ranks may get different numbers of
// batches. Each syncing backward then first counts the ranks still
// training (one small allreduce); a rank whose loop has ended waits at
// the scope's end, taking part in the others' gradient syncs with zero
// gradients (so each average is the sum over the ranks that trained,
// divided by num_processes, as DDP's default), until every rank is done;
// then every prepared model gets the parameters and buffers of a rank
// that trained to the end. Under gradient accumulation the end of a
// rank's loader does not force a sync (the ranks' loaders end at
// different steps): a rank that ran out in the middle of a cycle gives
// its unsynced gradients to the others' next sync; micro-steps left once
// every rank is done are not applied (a warning counts them), as under
// DDP's Join. Inside the scope the buckets are reduced after backward,
// model by model (the order a finishing rank can follow), so backward
// does not overlap communication there. Only backward's collectives are
// shadowed: other collectives inside the loop would meet a finished rank's
// count (the collective checks name both). `joinables` must be prepared models.
// UsageError under ZeRO (zero_stage > 0). With one process it only sets
// even_batches (a warning, as Accelerate's, when one is given).
#pragma once

#include <torch/nn/module.h>

#include "accel/prepare_traits.h"

namespace accel {

class Accelerator;

// A prepared model named in join_uneven_inputs' joinables (any model type
// prepare() takes), so that `{model}` ports Python's `[model]`.
struct Joinable {
  template <typename Model>
  Joinable(const Model& model)  // NOLINT: implicit, for braced lists.
      : module(detail::ModulePointer(model)) {}
  const torch::nn::Module* module;
};

// What join_uneven_inputs returns: while it lives, the prepared models'
// gradient syncs may see ranks run out of batches; its end waits for the
// others (see join_uneven_inputs).
class [[nodiscard]] JoinScope {
 public:
  JoinScope() = default;
  JoinScope(JoinScope&& other) noexcept;
  JoinScope& operator=(JoinScope&&) = delete;
  // The join, unless the scope is left by an exception (the other
  // processes then learn of the failure from this one).
  ~JoinScope() noexcept(false);
  // Whether ranks may run out of batches at different steps (even_batches
  // off, several processes).
  bool enabled() const { return joining_; }

 private:
  friend class Accelerator;
  Accelerator* accelerator_ = nullptr;
  bool joining_ = false;
  int exceptions_ = 0;
};

}  // namespace accel
