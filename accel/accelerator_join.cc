// join_uneven_inputs (see accelerator.h): ranks that run out of batches
// shadow the gradient syncs of those still training, as torch's Join does
// for DDP.
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <exception>
#include <string>
#include <vector>

#include "accel/accelerator.h"
#include "accel/checkpoint/state_dict.h"
#include "accel/core/tensor_ops.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"

namespace accel {

JoinScope::JoinScope(JoinScope&& other) noexcept
    : accelerator_(other.accelerator_),
      joining_(other.joining_),
      exceptions_(other.exceptions_) {
  other.accelerator_ = nullptr;
}

JoinScope::~JoinScope() noexcept(false) {
  if (accelerator_ == nullptr) return;
  accelerator_->EndJoin(joining_, std::uncaught_exceptions() != exceptions_);
}

JoinScope Accelerator::join_uneven_inputs(
    const std::vector<Joinable>& joinables, std::optional<bool> even_batches) {
  if (join_active_) {
    throw UsageError(
        "join_uneven_inputs: already inside a join_uneven_inputs scope");
  }
  for (const Joinable& joinable : joinables) {
    SynchronizerOf(joinable.module, "join_uneven_inputs");  // Prepared?
  }
  JoinScope scope;
  scope.accelerator_ = this;
  scope.exceptions_ = std::uncaught_exceptions();
  if (!use_distributed()) {
    if (even_batches) {
      ACCEL_LOG(WARNING) << "join_uneven_inputs: overriding even_batches is "
                            "only supported for distributed training; one "
                            "process gets every batch anyway";
    }
    join_active_ = true;
    return scope;
  }
  if (options_.invariant_micro_batches != 0) {
    throw UsageError(
        "join_uneven_inputs: not available with invariant_micro_batches: "
        "every process runs its share of every global batch");
  }
  if (options_.zero_stage > 0) {
    throw UsageError(
        "join_uneven_inputs: not available under ZeRO (zero_stage " +
        std::to_string(options_.zero_stage) +
        "): each rank holds a share of the training state that every step "
        "needs; give every rank the same number of batches (even_batches)");
  }
  const bool even = even_batches.value_or(this->even_batches());
  for (const auto& loader : state_->prepared.loaders()) {
    join_saved_even_batches_.emplace_back(loader,
                                          loader->even_batches_override);
    loader->even_batches_override = even;
  }
  join_active_ = true;
  joining_ = !even;  // As Accelerate: even batches need no join.
  scope.joining_ = joining_;
  return scope;
}

void Accelerator::EndJoin(bool joining, bool unwinding) {
  for (auto& [loader, saved] : join_saved_even_batches_) {
    loader->even_batches_override = saved;
  }
  join_saved_even_batches_.clear();
  join_active_ = false;
  joining_ = false;
  if (!joining || unwinding) return;
  // Shadow the others' syncing steps until no rank trains; the first
  // shadow carries what this rank accumulated since its last sync.
  bool trained_last = true;
  bool pending = state_->gradients.pending();
  const int64_t micro_steps = state_->gradients.step();
  while (true) {
    const std::vector<int64_t> counts = CountRanksTraining(false);
    if (counts[0] == 0) break;
    trained_last = false;
    ShadowGradientSync(/*keep_gradients=*/pending, counts);
    pending = false;
  }
  if (pending) {
    ACCEL_LOG(WARNING)
        << "join_uneven_inputs: rank " << process_index() << "'s last "
        << micro_steps % gradient_accumulation_steps()
        << " micro-step(s) were not synced or applied: no rank synced after "
           "them (inside the join the end of a loader does not sync); give "
           "each rank a multiple of gradient_accumulation_steps batches";
  }
  state_->gradients.ResetCycle();
  SyncFromLastTrainer(trained_last);
}

// Over the ranks: [those still training, then for each prepared model's
// reducer those that sync it in this backward] (the trainers agree on
// which: accumulate() and no_sync() name the same models everywhere).
std::vector<int64_t> Accelerator::CountRanksTraining(bool training) {
  RECORD_USER_SCOPE("accel::join");
  const std::vector<GradientReducer*> synchronizers =
      state_->prepared.synchronizers();
  std::vector<int64_t> counts(synchronizers.size() + 1, 0);
  counts[0] = training ? 1 : 0;
  for (size_t i = 0; i < synchronizers.size(); ++i) {
    counts[i + 1] = training && synchronizers[i]->enabled() ? 1 : 0;
  }
  AllreduceHostValues(communicator(), counts.data(), counts.size(),
                      torch::kInt64, ReduceOp::kSum,
                      At(CallSite::Here(), "join_uneven_inputs"));
  return counts;
}

// One syncing backward with zero gradients (or, keep_gradients, those the
// rank accumulated) for the reducers the trainers sync (counts, as
// CountRanksTraining's): the same collectives, in the same order, as a rank
// that trains (buffers, buckets, the usage agreement).
void Accelerator::ShadowGradientSync(bool keep_gradients,
                                     const std::vector<int64_t>& counts) {
  if (!keep_gradients) {
    torch::NoGradGuard no_grad;
    for (const auto& model : state_->prepared.models()) {
      for (torch::Tensor& p : model->parameters()) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
    }
  }
  std::vector<GradientReducer*> synced;
  const std::vector<GradientReducer*> synchronizers =
      state_->prepared.synchronizers();
  for (size_t i = 0; i < synchronizers.size(); ++i) {
    if (counts[i + 1] > 0) synced.push_back(synchronizers[i]);
  }
  for (GradientReducer* synchronizer : synced) {
    synchronizer->set_call_site(CallSite::Here());
    synchronizer->set_deferred(true);
    synchronizer->begin_backward();
  }
  for (GradientReducer* synchronizer : synced) {
    synchronizer->finish();
    synchronizer->set_deferred(false);
  }
}

// The ranks that trained to the end hold the same models (each step's
// average reached them all); the highest of them gives every rank its
// parameters and buffers, as DDP's join hook does.
void Accelerator::SyncFromLastTrainer(bool trained_last) {
  int64_t source = trained_last ? process_index() : -1;
  AllreduceHostValues(communicator(), &source, 1, torch::kInt64, ReduceOp::kMax,
                      At(CallSite::Here(), "join_uneven_inputs"));
  std::vector<std::string> names;
  std::vector<torch::Tensor> tensors;
  int index = 0;
  for (const auto& model : state_->prepared.models()) {
    for (const StateEntry& entry : StateDict(*model)) {
      names.push_back("model_" + std::to_string(index) + "." + entry.name);
      tensors.push_back(entry.tensor);
    }
    ++index;
  }
  BroadcastCoalesced(communicator(), names, tensors, static_cast<int>(source),
                     At(CallSite::Here(), "join_uneven_inputs"));
}

}  // namespace accel
