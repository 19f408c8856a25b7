// How tensor parallelism cuts a parameter into shares, one per rank of its
// group, and how the shares join back: what ParallelLinear keeps of its
// weights, and what checkpoints, get_state_dict and merge-weights need to
// make the whole tensor again or a share at another tensor-parallel size.
//
//   accel::TensorSplit rows{.dim = 0, .fused = 3, .size = 2};  // q|k|v
//   torch::Tensor mine = accel::ShareOf(whole, rows, /*rank=*/1);
//   torch::Tensor again = accel::JoinShares({share0, mine}, rows);
//
// A share is, along `dim`, the rank's equal part of each of `fused` equal
// blocks (one block but for a fused q|k|v projection, whose q, k and v are
// each split), concatenated: Megatron's column- (dim 0) and row-parallel
// (dim 1) layouts.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace accel {

struct TensorSplit {
  int64_t dim = 0;    // The dimension cut.
  int64_t fused = 1;  // Equal blocks along it, each cut alike.
  int size = 1;       // Ranks sharing the tensor.

  bool operator==(const TensorSplit& other) const {
    return dim == other.dim && fused == other.fused && size == other.size;
  }
  bool operator!=(const TensorSplit& other) const { return !(*this == other); }
  // "dim 1, 2 shares" / "dim 0 in 3 blocks, 2 shares", for messages.
  std::string ToString() const;
};

// Rank `rank`'s share of `whole` (contiguous). UsageError when the dimension
// does not split into fused x size equal parts.
torch::Tensor ShareOf(const torch::Tensor& whole, const TensorSplit& split,
                      int rank);

// The whole tensor from every rank's share, in rank order (split.size of
// them, of one shape). UsageError when the count or shapes disagree.
torch::Tensor JoinShares(const std::vector<torch::Tensor>& shares,
                         const TensorSplit& split);

// The whole tensor's shape from a share's.
std::vector<int64_t> WholeShape(std::vector<int64_t> share_shape,
                                const TensorSplit& split);

}  // namespace accel
