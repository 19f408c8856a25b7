// Data-parallel gradient averaging in the manner of torch's DDP: gradients
// are grouped into buckets, and each bucket's allreduce starts as soon as
// all of its gradients have been accumulated during backward, overlapping
// the rest of backward. Buckets are reduced in the same order on every rank.
//
//   accel::GradientSynchronizer sync(comm, model->parameters(), {});
//   loss.backward();     // hooks start bucket allreduces as grads arrive
//   sync.finish();       // waits for them; .grad now holds the average
//
// As torch DDP's gradient_as_bucket_view, each parameter's .grad becomes a
// view of its bucket the first time it syncs: later backwards accumulate
// straight into the bucket, and nothing is copied in or out (zero_grad that
// zeroes in place keeps the view; one that sets gradients to none costs one
// copy into the bucket at the next sync).
//
// As torch DDP's broadcast_buffers (on by default), the model's buffers
// (BatchNorm's running statistics, ...) become rank 0's on every step that
// syncs: DDP copies them before each forward; LibTorch's modules have no
// forward hook, so the copy starts as backward begins (forward has updated
// them, backward does not) and lands in finish(), overlapping backward. The
// next forward sees rank 0's buffers, as under DDP, and after training every
// rank holds the same ones (under DDP each keeps its last forward's update).
//
// A parameter that got no gradient in a step (unused in the forward pass)
// contributes the gradient it holds (zeros if none); its bucket is launched
// when finish() runs, so a step never hangs on it. A parameter that none of
// the ranks used ends the step with a zero gradient rather than none, unless
// find_unused_parameters (or static_graph) is on: then it keeps what it had.
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "accel/parallel/powersgd.h"
#include "accel/runtime/comm/communicator.h"

namespace accel {

// torch DDP's communication hooks that compress each bucket for its
// allreduce (Accelerate's DDPCommunicationHookType FP16 and BF16): the
// bucket is divided by the number of processes, cast to the 16-bit type,
// summed in it, and cast back. Half the bytes travel; each gradient
// carries the 16-bit type's rounding (about 3 significant digits for fp16,
// 2 for bf16, whose range is float32's). Buckets of other dtypes than
// float32 and float64 travel as they are.
// kPowerSgd: accel/parallel/powersgd.h, with GradientSyncOptions::powersgd; its
// steps reduce each bucket after backward (three allreduces: the members
// sent whole, the Ps, the Qs) rather than during it.
enum class DDPCommunicationHookType { kNo, kFp16, kBf16, kPowerSgd };

struct GradientSyncOptions {
  // As torch DDP: a small first bucket so that communication starts early,
  // then buckets of up to bucket_cap_bytes.
  size_t first_bucket_bytes = 1 << 20;
  size_t bucket_cap_bytes = 25 << 20;
  // torch DDP's broadcast_buffers: every syncing step gives each rank rank
  // 0's buffers (see above).
  bool broadcast_buffers = true;
  // torch DDP's find_unused_parameters: each syncing step also agrees, in
  // one allreduce of a byte per parameter, which parameters some rank used;
  // one that no rank used keeps the gradient it had (none after a
  // zero_grad that sets them to none), as under DDP, so that the optimizer
  // skips it (AdamW would otherwise decay it and move it by its momentum).
  // Off, such a parameter ends the step with a zero gradient. Either way a
  // parameter that gets no gradient never hangs the step.
  bool find_unused_parameters = false;
  // torch DDP's static_graph: the set of used parameters is the same every
  // step, so find_unused_parameters' agreement runs at the first syncing
  // step only (and static_graph alone turns it on, as in DDP).
  bool static_graph = false;
  // torch DDP's gradient_as_bucket_view (above). False: after each sync the
  // gradients are tensors of their own, copied out of the buckets (one
  // more gradient's worth of memory and a copy per step; torch's default).
  bool gradient_as_bucket_view = true;
  DDPCommunicationHookType comm_hook = DDPCommunicationHookType::kNo;
  PowerSgdOptions powersgd;  // For kPowerSgd.
  // FSDP's reduce_dtype: floating-point buckets of another dtype are
  // averaged in this one (divided first, cast, summed, cast back), as the
  // 16-bit hooks do; it takes the place of kFp16 / kBf16's dtype.
  std::optional<c10::ScalarType> reduce_dtype;
};

// Which parameters share a bucket: indices into `parameters` (those that
// require a gradient), one group per bucket, in the order the buckets are
// reduced. Like DDP: reverse registration order (roughly the order in which
// backward produces gradients), a first bucket of up to first_bucket_bytes,
// then buckets of up to bucket_cap_bytes; one dtype and device per bucket.
std::vector<std::vector<size_t>> AssignBuckets(
    const std::vector<torch::Tensor>& parameters,
    const GradientSyncOptions& options);

// What the Accelerator drives around backward for a prepared model:
// DDP's averaging (GradientSynchronizer) or ZeRO stage 2's sharded
// reduction (accel/parallel/zero.h).
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  // Called just before backward.
  virtual void begin_backward() = 0;
  // Completes the step's reduction after backward.
  virtual void finish() = 0;
  // While disabled (no_sync / gradient accumulation), backward leaves the
  // local gradients alone and finish() does nothing.
  virtual void set_enabled(bool enabled) = 0;
  virtual bool enabled() const = 0;
  // Where the backward that the next reductions belong to was called, for
  // their diagnostics.
  virtual void set_call_site(CallSite site) = 0;
  // Deferred: the reductions all start in finish(), in a fixed order, not
  // as gradients arrive (join_uneven_inputs: a rank that shadows the
  // others' backward cannot follow the order their gradients arrive in).
  virtual void set_deferred(bool /*deferred*/) {}
  // Whether a step's reduction is under way across several backward calls
  // (invariant_micro_batches: some of the step's micro-batches are still to
  // come); then the step's gradient is not complete yet.
  virtual bool mid_step() const { return false; }
  // UsageError naming `operation` (the optimizer's step, clipping,
  // save_state) while mid_step().
  virtual void CheckStepComplete(const char* /*operation*/) const {}
  // The prepared optimizer stepped or zeroed the gradients: the step's
  // gradient has been used (or dropped).
  virtual void StepEnded() {}
};

class GradientSynchronizer : public GradientReducer {
 public:
  // `buffers`: the model's buffers, for broadcast_buffers.
  GradientSynchronizer(Communicator& comm,
                       const std::vector<torch::Tensor>& parameters,
                       const GradientSyncOptions& options,
                       const std::vector<torch::Tensor>& buffers = {});
  ~GradientSynchronizer() override;

  // Starts copying rank 0's buffers when this step syncs
  // (broadcast_buffers).
  void begin_backward() override;

  // Launches buckets whose gradients never all arrived, waits for every
  // bucket, and writes the averages to .grad.
  void finish() override;

  void set_enabled(bool enabled) override;
  // The bucket allreduces are named "backward".
  void set_call_site(CallSite site) override;
  void set_deferred(bool deferred) override;
  bool enabled() const override;

  size_t num_buckets() const;
  // Bytes handed to the bucket allreduces since construction (what the
  // hooks halve; a ring allreduce sends 2 (N - 1) / N of them per rank).
  uint64_t bytes_reduced() const;
  // Buckets whose allreduce has started in the current step (all of them
  // by the end of a backward in which every parameter got a gradient).
  size_t buckets_launched() const;

  struct State;  // Shared with the autograd hooks.

 private:
  std::shared_ptr<State> state_;
};

// Gradient synchronization of some models turned off (or on) for a scope:
// Accelerator::no_sync, accumulate and trigger_sync_in_backward. Restores
// what was there before, in reverse order.
class [[nodiscard]] NoSyncScope {
 public:
  NoSyncScope() = default;
  NoSyncScope(NoSyncScope&&) = default;
  NoSyncScope& operator=(NoSyncScope&&) = default;
  ~NoSyncScope();
  // Sets the synchronizer's sync to `enabled` until the scope ends; a null
  // synchronizer (one process) is ignored.
  void Add(GradientReducer* synchronizer, bool enabled = false);

 private:
  std::vector<std::pair<GradientReducer*, bool>> restore_;
};

}  // namespace accel
