// ZeRO stages 1 and 2 (DeepSpeed's Zero Redundancy Optimizer, torch's
// ZeroRedundancyOptimizer and FSDP's SHARD_GRAD_OP): each rank keeps the
// optimizer state, and under stage 2 the reduced gradients, of its share of
// the parameters only.
//
//   accel::ZeroOptimizer zero(comm, /*stage=*/2, adamw, model->parameters());
//   auto reducer = zero.MakeGradientReducer(model->buffers(), {});
//   loss.backward();  reducer->finish();          // grads reduce-scattered
//   zero.AttachGradients();                       // pieces get their grads
//   adamw.step();                                 // steps this rank's share
//   zero.AllGatherParameters();                   // everyone's share back
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
// parameter's). Under stage 2 each gradient goes into its bucket as
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
// Deliberate differences from DeepSpeed: no fp32 master copy (the
// parameters' own dtype is stepped, as LibTorch optimizers do), and no
// padding of parameters to alignment; the flat buffer pads its end to
// N shares so that every all-gather has one count.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "accel/gradient_sync.h"
#include "accel/runtime/comm/communicator.h"

namespace accel {

// Where each rank's share of a flat buffer of tensors lies: tensor i
// starts at offset(i); rank r owns [begin(r), end(r)), shares of
// shard_size() = ceil(total / world_size) elements (the last ones shorter
// or empty).
class ShardLayout {
 public:
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

struct ZeroGroup;  // One flat buffer (zero.cc).

class ZeroOptimizer {
 public:
  // Takes over `optimizer`'s trainable parameters (see above). UsageError,
  // before anything changes, for a stage outside 1..2, an optimizer that
  // already holds state, a parameter that appears twice, or under stage 2
  // an optimizer that does not hold exactly the trainable parameters of
  // its model (`model_parameters`).
  ZeroOptimizer(Communicator& comm, int stage,
                torch::optim::Optimizer& optimizer,
                const std::vector<torch::Tensor>& model_parameters);
  ~ZeroOptimizer();

  int stage() const { return stage_; }
  // The parameters it shards (the optimizer's trainable ones).
  const std::vector<torch::Tensor>& parameters() const { return parameters_; }

  // Stage 2: the reducer that replaces the model's DDP synchronizer; it
  // reduce-scatters the gradients of parameters(). The model's buffers
  // keep DDP's broadcast_buffers.
  std::unique_ptr<GradientReducer> MakeGradientReducer(
      const std::vector<torch::Tensor>& model_buffers,
      const GradientSyncOptions& options);

  // Points each piece's .grad at this rank's part of the reduced gradient
  // (after the sync; idempotent until the next backward).
  void AttachGradients();
  // After the optimizer stepped: every rank gets every updated share.
  void AllGatherParameters();
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
  Communicator& comm_;
  int stage_;
  torch::optim::Optimizer& optimizer_;
  std::vector<torch::Tensor> parameters_;
  std::vector<std::shared_ptr<ZeroGroup>> groups_;
};

// Accelerator::clip_grad_norm_ when optimizers are sharded: the norm of the
// gradients of `parameters` over every rank's pieces (one allreduce), the
// same on every rank, and each piece scaled as torch's clip_grad_norm_
// scales whole gradients. Parameters that no optimizer here shards count
// once (their gradients are the same on every rank). Returns the norm.
double ClipGradNormAcrossShards(Communicator& comm,
                                const std::vector<ZeroOptimizer*>& sharded,
                                const std::vector<torch::Tensor>& parameters,
                                double max_norm, double norm_type);

// The gradients clip_grad_value_ clips: this rank's pieces of the sharded
// parameters, and the whole gradients of the others.
std::vector<torch::Tensor> GradientsToClip(
    const std::vector<ZeroOptimizer*>& sharded,
    const std::vector<torch::Tensor>& parameters);

}  // namespace accel
