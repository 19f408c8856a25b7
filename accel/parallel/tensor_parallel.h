// Tensor parallelism's communication (Megatron-LM's mappings, torch's
// ColwiseParallel / RowwiseParallel / SequenceParallel): autograd functions
// whose forward and backward are conjugate collectives over a tensor-parallel
// group, and the layers built on them.
//
//   accel::Communicator& tp = accelerator.torch_device_mesh()->group("tp");
//   // A column-parallel layer computes its share of the outputs from the
//   // whole input; the input's gradient is the sum of every rank's part:
//   torch::Tensor h = torch::nn::functional::linear(
//       accel::tp::CopyToRegion(x, tp), w_rows_of_this_rank);
//   // A row-parallel layer computes a partial sum from its share of the
//   // inputs:
//   torch::Tensor y = accel::tp::ReduceFromRegion(
//       torch::nn::functional::linear(h, w_columns_of_this_rank), tp);
//
// Every rank of the group calls the same functions in the same order, in
// forward and (through autograd) in backward. The tensors' dtypes must be
// ones the communicator carries (accel/runtime/base/dtype.h). With a group
// of one rank each function is the identity (no collective).
#pragma once

#include <torch/types.h>

#include "accel/runtime/comm/communicator.h"

namespace accel::tp {

// Megatron's f: the identity forward; backward all-reduces (sums) the
// gradient over the group. Before a column-parallel layer.
torch::Tensor CopyToRegion(const torch::Tensor& x, Communicator& group);

// Megatron's g: forward all-reduces (sums) over the group; backward is the
// identity. After a row-parallel layer.
torch::Tensor ReduceFromRegion(const torch::Tensor& x, Communicator& group);

// Forward concatenates every rank's `x` along `dim`, in rank order (each
// rank's of the same shape); backward keeps this rank's slice of the
// gradient. A column-parallel layer's gather_output.
torch::Tensor GatherFromRegion(const torch::Tensor& x, Communicator& group,
                               int64_t dim = -1);

// Forward keeps this rank's slice of `x` along `dim` (its size a multiple of
// the group's); backward concatenates every rank's gradient. Before a
// row-parallel layer whose input is whole.
torch::Tensor ScatterToRegion(const torch::Tensor& x, Communicator& group,
                              int64_t dim = -1);

// Sequence parallelism (Megatron's SP, torch's SequenceParallel): forward
// all-gathers along `dim` (the sequence), backward reduce-scatters the
// gradient back to this rank's slice (summing every rank's contribution).
// Before a column-parallel layer whose input is split along the sequence.
torch::Tensor GatherSequence(const torch::Tensor& x, Communicator& group,
                             int64_t dim);

// Forward sums over the group and keeps this rank's slice along `dim`
// (reduce-scatter); backward all-gathers the gradient. After a row-parallel
// layer, in place of ReduceFromRegion, to stay split along the sequence.
torch::Tensor ReduceScatterSequence(const torch::Tensor& x, Communicator& group,
                                    int64_t dim);

// Megatron's VocabParallelEmbedding lookup: `weight` holds this rank's rows
// of the embedding table, rows [rank * weight.size(0), (rank + 1) *
// weight.size(0)) of the vocabulary; each rank looks up the tokens it holds
// (zeros for the others) and the group sums (g). Equal to embedding() of
// the whole table; the gradient reaches only the rows each rank holds.
torch::Tensor VocabParallelEmbedding(const torch::Tensor& tokens,
                                     const torch::Tensor& weight,
                                     Communicator& group);

// Megatron's vocab-parallel cross entropy (torch's loss_parallel): the mean
// cross entropy of `logits` [N, V / size] split along the vocabulary (this
// rank holds columns [rank * V / size, ...)) against `targets` [N] (whole
// vocabulary indices, every rank the same), equal to cross_entropy of the
// whole logits, without gathering them: three all-reduces of N values (max,
// sum of exponentials, the target's logit). Backward gives each rank its
// columns' gradient. A target outside [0, V) is a UsageError.
torch::Tensor VocabParallelCrossEntropy(const torch::Tensor& logits,
                                        const torch::Tensor& targets,
                                        Communicator& group);

}  // namespace accel::tp
