// ZeRO stages 1-3 (DeepSpeed's Zero Redundancy Optimizer, torch's
// ZeroRedundancyOptimizer, FSDP's SHARD_GRAD_OP and FULL_SHARD): each rank
// keeps the optimizer state, under stage 2 also the reduced gradients, and
// under stage 3 also the parameters, of its share of the parameters only.
//
//   accel::ZeroOptimizer zero(comm, /*stage=*/2, adamw, model->parameters());
//   auto reducer = zero.MakeGradientReducer(model->buffers(), {});
//   loss.backward();  reducer->finish();          // grads reduce-scattered
//   zero.AttachGradients();                       // pieces get their grads
//   adamw.step();                                 // steps this rank's share
//   zero.AllGatherParameters(site);               // everyone's share back
//
// How: the optimizer's trainable parameters (per dtype and device) become
// views of one flat buffer, which is cut into num_processes contiguous
// shares of ceil(total / N) elements. The optimizer's param groups are
// pointed at this rank's pieces of them (views of the flat buffer), so any
// elementwise LibTorch optimizer (SGD, Adam, AdamW, RMSprop, Adagrad) steps
// exactly what it would have stepped of the whole parameter, keeping state
// for 1/N of the elements; an all-gather into the flat buffer then gives
// every rank the updated parameters.
//
// Gradients: under stage 1 the model's DDP allreduce runs as before (every
// rank holds full gradients, and a piece's gradient is a view of its
// parameter's). Under stages 2-3 each gradient goes into its bucket as
// autograd produces it and the parameter's .grad is freed; each bucket is
// reduce-scattered, one in flight while the next fills, then its buffer
// goes. Buckets are of GradientSyncOptions::first_bucket_bytes (1 MiB);
// a larger parameter is a bucket of its own, reduced from the gradient
// autograd made (no copy). A rank then holds its share of the reduced
// gradients plus, during backward, about three gradients of its largest
// parameter (the one in flight, and autograd's new one with the copy it
// makes to the parameter's layout).
// Inside no_sync the gradients accumulate locally in .grad at full size,
// as under DDP: accumulation costs the full gradients' memory.
//
// Stage 3: each unit (sharded_units.h) has flat buffers of its own, and a
// rank keeps only its share of them (the pieces the optimizer steps are
// views of that share). A unit's flat buffer holds data only from just
// before its forward to just after it, and from the gradient reaching its
// output to the last of its parameters' gradients: its storage is
// allocated and all-gathered into, then freed (storage resizing, so that
// views and tensors autograd saved see the refilled data). The next unit's
// gather is started before a unit runs (the previous one's in backward),
// so a rank holds at most two units' parameters at once. Parameters in no
// unit stay whole on every rank, stepped as under stage 2; frozen ones are
// not sharded at all.
//
// Mixed-precision parameters (ZeroPrecision, FSDP's MixedPrecisionPolicy):
// with a param_dtype other than the parameters' own (bf16 for float32
// ones), each flat buffer and the model's parameters, their views, hold
// param_dtype, and every rank keeps its share in the parameters' own dtype
// beside it (`shard`, under every stage): the master copy the optimizer
// steps, whose state is then of that dtype too. An all-gather sends the
// share cast to param_dtype (half the bytes of float32), so forward and
// backward compute in param_dtype and autograd's gradients are of it.
// Gradients are reduced in reduce_dtype (param_dtype unless set) and land
// in the master dtype's shard_grad (under stage 1, DDP's reduction, then a
// master-dtype copy of each piece). Without a param_dtype the parameters'
// own dtype is stepped, as LibTorch optimizers do.
//
// Deliberate differences from DeepSpeed: no fp32 master copy unless
// param_dtype asks for one, and no padding of parameters to alignment; the
// flat buffer pads its end to N shares so that every all-gather has one
// count.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accel/parallel/gradient_sync.h"
#include "accel/parallel/sharded_units.h"
#include "accel/runtime/comm/communicator.h"

namespace accel {

// Where each rank's share of a flat buffer of tensors lies: tensor i
// starts at offset(i); rank r owns [begin(r), end(r)), shares of
// shard_size() = ceil(total / world_size) elements (the last ones shorter
// or empty).
class ShardLayout {
 public:
  ShardLayout() = default;
  ShardLayout(const std::vector<int64_t>& numels, int world_size);

  int64_t total() const { return total_; }
  int64_t shard_size() const { return shard_size_; }
  // world_size * shard_size: the flat buffer's length.
  int64_t padded() const { return shard_size_ * world_size_; }
  int64_t offset(size_t tensor) const { return offsets_[tensor]; }
  int64_t begin(int rank) const;
  int64_t end(int rank) const;
  // Elements of [lo, hi) in each rank's share (reduce_scatter's counts).
  std::vector<size_t> Counts(int64_t lo, int64_t hi) const;

  // A tensor's part in one rank's share: `length` elements from `begin`
  // (in the tensor's flattened order).
  struct Piece {
    size_t tensor;
    int64_t begin;
    int64_t length;
  };
  std::vector<Piece> Pieces(int rank) const;

 private:
  std::vector<int64_t> offsets_;
  int64_t total_ = 0;
  int64_t shard_size_ = 0;
  int world_size_ = 1;
};

// FSDP's MixedPrecisionPolicy for what ZeroOptimizer shards (see above):
// unset members keep the parameters' dtype (param_dtype) or param_dtype
// (reduce_dtype). Both must be floating-point.
struct ZeroPrecision {
  std::optional<c10::ScalarType> param_dtype = std::nullopt;
  std::optional<c10::ScalarType> reduce_dtype = std::nullopt;
  // Stage 3: a unit's floating-point tensor arguments go to param_dtype.
  bool cast_forward_inputs = true;
};

struct ZeroGroup;    // One flat buffer (zero_group.h).
class UnitSchedule;  // Stage 3's gathers and frees (zero_units.h).

class ZeroOptimizer {
 public:
  // Takes over `optimizer`'s trainable parameters (see above); under
  // stage 3 `units` holds each unit's parameters, in the order the model
  // runs the units. UsageError, before anything changes, for a stage
  // outside 1..3, an optimizer that already holds state, a parameter that
  // appears twice, under stages 2-3 an optimizer that does not hold
  // exactly the trainable parameters of its model (`model_parameters`),
  // stage 3 without units, or a precision dtype that is not floating-point.
  ZeroOptimizer(Communicator& comm, int stage,
                torch::optim::Optimizer& optimizer,
                const std::vector<torch::Tensor>& model_parameters,
                const std::vector<std::vector<torch::Tensor>>& units = {},
                const ZeroPrecision& precision = {});
  ~ZeroOptimizer();

  int stage() const { return stage_; }
  // Whether some parameters compute in another dtype than the master
  // shards the optimizer steps (ZeroPrecision::param_dtype).
  bool mixed_precision() const;
  // The parameters it shards (the optimizer's trainable ones).
  const std::vector<torch::Tensor>& parameters() const { return parameters_; }

  // Hybrid sharding (HSDP, FSDP's HYBRID_SHARD): the shares are those of
  // this optimizer's communicator (dp_shard), and every rank of `replicas`
  // (dp_replicate) holds the same share of its own copy. Under stages 2-3
  // each reduce-scattered bucket is then all-reduced across replicas, as
  // soon as it is in, and the gradients averaged over both groups;
  // `data_parallel` (both, and cp) is what the model's buffers are
  // broadcast over. Stage 1's reduction is the model's DDP synchronizer,
  // which its caller makes over `data_parallel`. Call it before
  // MakeGradientReducer.
  void ReplicateAcross(Communicator& replicas, Communicator& data_parallel);
  // This rank's replica (0 without ReplicateAcross): replica 0's ranks
  // write the pieces of a sharded checkpoint, the others hold copies.
  int replica_index() const { return replica_index_; }

  // Stages 2-3: the reducer that replaces the model's DDP synchronizer; it
  // reduce-scatters the gradients of parameters() (and under stage 3 frees
  // each unit's parameters once their gradients are in). The model's
  // buffers keep DDP's broadcast_buffers.
  std::unique_ptr<GradientReducer> MakeGradientReducer(
      const std::vector<torch::Tensor>& model_buffers,
      const GradientSyncOptions& options);

  // Points each piece's .grad at this rank's part of the reduced gradient
  // (after the sync; idempotent until the next backward).
  void AttachGradients();
  // After the optimizer stepped: every rank gets every updated share
  // (under stage 3, of the parameters in no unit; the units' are gathered
  // when they next run).
  // `site`: the program's optimizer.step(), for diagnostics.
  void AllGatherParameters(CallSite site) {
    AllGatherParameters(
        site, "optimizer.step (ZeRO all-gather of the updated parameters)");
  }

  // Stage 3: what the units call around their forward and backward (null
  // under stages 1-2).
  std::shared_ptr<UnitRunner> unit_runner() const;
  // Stage 3: `names` (a parameter's TensorImpl to its name) are what a read
  // of a released parameter names (released_memory.h).
  void NameReleasedParameters(const std::map<const void*, std::string>& names);
  // Stage 3: every unit's parameters whole on every rank, for save_state
  // and load_state; ReshardEveryUnit then takes each rank's share of them
  // back as it is (a load's values) and frees them. No-ops under stages
  // 1-2. Every rank calls them.
  // `adopt` false (a load that failed) frees them without taking values.
  void GatherEveryUnit();
  void ReshardEveryUnit(bool adopt = true);
  // Calls visit(i, value) for each of `tensors` with its whole value,
  // one unit at a time (in the order the tensors come); every rank calls
  // it. The value is the tensor itself (under stage 3 with its unit
  // gathered), or for a mixed-precision parameter its master values,
  // gathered whole in the master dtype. Without either it only visits.
  // `api` and `site`: the program's call (get_state_dict, save_model),
  // which diagnostics name.
  void ForEachGathered(
      const std::vector<torch::Tensor>& tensors,
      const std::function<void(size_t, const torch::Tensor&)>& visit,
      const char* api, CallSite site);
  // The model's parameters whole again, as before the optimizer was
  // sharded (under mixed precision in the master dtype), for a program
  // that drops the prepared objects (free_memory); the sharding is over
  // after it. Every rank calls it.
  void ReturnParameters();
  // The process left the job (end_training): what needs the other ranks
  // later (a gather, a step, free_memory) is a UsageError saying so, not a
  // call into the group's freed communicator.
  void LeaveJob();
  // This rank's pieces, for sharded checkpoints: elements [begin, begin +
  // values.numel()) of the model's `parameter` (flattened), `values` being
  // the 1-D tensor the optimizer steps for them (its state is keyed by it).
  struct Piece {
    torch::Tensor parameter;
    int64_t begin = 0;
    torch::Tensor values;
  };
  std::vector<Piece> Pieces() const;
  // After a load wrote every rank's pieces' values: every rank gets the
  // parameters it keeps whole (stages 1-2, and under stage 3 those in no
  // unit). Every rank calls it.
  void ShareLoadedPieces(CallSite site) {
    AllGatherParameters(
        site, "load_state (ZeRO all-gather of the loaded parameters)");
  }

  // Zeroes the parameters' gradients and the pieces' (the optimizer alone
  // would zero only the pieces).
  void ZeroGrad();

  // This rank's gradient pieces of the given parameters (those it shards),
  // for norms and clipping across shards; `covered` gets the parameters
  // found.
  std::vector<torch::Tensor> GradientPieces(
      const std::vector<torch::Tensor>& of,
      std::vector<const void*>* covered) const;

 private:
  // `api`: what diagnostics call the all-gathers.
  void AllGatherParameters(CallSite site, const char* api);

  Communicator& Comm(const char* api) const;

  Communicator* comm_;                // Null once the process left the job.
  Communicator* replicas_ = nullptr;  // HSDP (ReplicateAcross).
  Communicator* data_parallel_ = nullptr;  // HSDP: buffers' broadcast.
  int replica_index_ = 0;
  int rank_;
  int stage_;
  torch::optim::Optimizer& optimizer_;
  std::vector<torch::Tensor> parameters_;
  std::vector<std::shared_ptr<ZeroGroup>> groups_;
  std::shared_ptr<UnitSchedule> units_;  // Stage 3.
};

// Tensor parallelism for the norms below: the parameters in `split`
// (TensorImpl addresses, accel/parallel/parallel_linear.h's
// TensorParallelParameters) are held in different shares by the ranks of
// `group`, whose parts of the norm are summed over it; the others are the
// same on every rank of it and count once. No group: nothing is split.
struct TensorParallelNorm {
  Communicator* group = nullptr;
  std::vector<const void*> split;
};

// Accelerator::clip_grad_norm_ when nothing is sharded: torch's
// clip_grad_norm_, with |g|^p summed in float64, so that the norm (and the
// coefficient) equals ClipGradNormAcrossShards' however the gradients are
// sharded; it can differ from torch's float32 norm in the last bits.
// UsageError for a norm_type that is not positive. Returns the norm.
double ClipGradNorm(const std::vector<torch::Tensor>& parameters,
                    double max_norm, double norm_type,
                    const TensorParallelNorm& tensor_parallel = {},
                    CallSite site = {});

// Accelerator::clip_grad_norm_ when optimizers are sharded: the norm of the
// gradients of `parameters` over every rank's pieces (one allreduce), the
// same on every rank, and each piece scaled as torch's clip_grad_norm_
// scales whole gradients. Parameters that no optimizer here shards count
// once (their gradients are the same on every rank). Returns the norm.
double ClipGradNormAcrossShards(Communicator& comm,
                                const std::vector<ZeroOptimizer*>& sharded,
                                const std::vector<torch::Tensor>& parameters,
                                double max_norm, double norm_type,
                                CallSite site,
                                const TensorParallelNorm& tensor_parallel = {});

// The gradients clip_grad_value_ clips: this rank's pieces of the sharded
// parameters, and the whole gradients of the others.
std::vector<torch::Tensor> GradientsToClip(
    const std::vector<ZeroOptimizer*>& sharded,
    const std::vector<torch::Tensor>& parameters);

}  // namespace accel
