// Context parallelism as DeepSpeed-Ulysses does it: each rank of a `cp`
// group holds a contiguous part of every sequence; around attention an
// all-to-all trades it for every position of a share of the heads, so that
// each rank attends over the whole sequence with its heads, and a second
// all-to-all trades back. Everything else in a transformer (projections,
// MLPs, norms, the loss) works on each position alone and runs on the
// rank's part as it is.
//
//   accel::Communicator& cp = accelerator.torch_device_mesh()->group("cp");
//   // x: [B, T / cp, C], this rank's part of the sequence.
//   torch::Tensor q = ...;  // [B, T / cp, heads, head_dim]
//   q = accel::cp::SequenceToHeads(q, cp, /*sequence_dim=*/1, /*head_dim=*/2);
//   // q: [B, T, heads / cp, head_dim]; attend over T, then:
//   y = accel::cp::HeadsToSequence(y, cp, /*sequence_dim=*/1, /*head_dim=*/2);
//
// Ulysses rather than ring attention: two all-to-alls of the activations
// per attention (each rank sends (cp - 1) / cp of them), attention itself
// unchanged (any mask, any kernel), no load-balancing of causal chunks
// needed; the heads (after tensor parallelism's split) must divide over cp.
// Every rank of the group calls the same functions in the same order; in
// backward each exchange runs reversed. With a group of one rank each is
// the identity.
#pragma once

#include <torch/types.h>

#include <cstdint>

#include "accel/runtime/comm/communicator.h"

namespace accel::cp {

// [.., T / cp (sequence_dim), .., H (head_dim), ..] -> [.., T, .., H / cp,
// ..]: this rank keeps heads [rank * H / cp, (rank + 1) * H / cp) of every
// position, the group's parts of the sequence concatenated in rank order.
// UsageError when H does not divide over the group.
torch::Tensor SequenceToHeads(const torch::Tensor& x, Communicator& group,
                              int64_t sequence_dim, int64_t head_dim);

// The inverse: [.., T, .., H / cp, ..] -> [.., T / cp, .., H, ..].
torch::Tensor HeadsToSequence(const torch::Tensor& x, Communicator& group,
                              int64_t sequence_dim, int64_t head_dim);

// This rank's contiguous part of `x` along `dim` (no autograd: for inputs
// such as token ids, targets and positions). UsageError when the dimension
// does not divide over the group.
torch::Tensor ShardSequence(const torch::Tensor& x, const Communicator& group,
                            int64_t dim);

}  // namespace accel::cp
