#include "accel/core/tensor_split.h"

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

void RequireSplittable(const std::vector<int64_t>& shape,
                       const TensorSplit& split, const char* api) {
  const int64_t parts = split.fused * split.size;
  if (split.dim < 0 || split.dim >= static_cast<int64_t>(shape.size()) ||
      split.fused < 1 || split.size < 1 || shape[split.dim] % parts != 0) {
    throw UsageError(std::string(api) + ": a tensor of shape " +
                     c10::str(c10::IntArrayRef(shape)) + " does not split as " +
                     split.ToString());
  }
}

}  // namespace

std::string TensorSplit::ToString() const {
  return "dim " + std::to_string(dim) +
         (fused > 1 ? " in " + std::to_string(fused) + " blocks" : "") + ", " +
         std::to_string(size) + " shares";
}

torch::Tensor ShareOf(const torch::Tensor& whole, const TensorSplit& split,
                      int rank) {
  RequireSplittable(whole.sizes().vec(), split, "ShareOf");
  if (rank < 0 || rank >= split.size) {
    throw UsageError("ShareOf: rank " + std::to_string(rank) + " of " +
                     std::to_string(split.size));
  }
  const int64_t block = whole.size(split.dim) / split.fused;
  const int64_t part = block / split.size;
  std::vector<torch::Tensor> pieces;
  for (int64_t b = 0; b < split.fused; ++b) {
    pieces.push_back(whole.narrow(split.dim, b * block + rank * part, part));
  }
  return torch::cat(pieces, split.dim).contiguous();
}

torch::Tensor JoinShares(const std::vector<torch::Tensor>& shares,
                         const TensorSplit& split) {
  if (static_cast<int>(shares.size()) != split.size || shares.empty()) {
    throw UsageError("JoinShares: " + std::to_string(shares.size()) +
                     " shares for " + split.ToString());
  }
  const std::vector<int64_t> shape = shares[0].sizes().vec();
  for (const torch::Tensor& share : shares) {
    if (share.sizes().vec() != shape) {
      throw UsageError("JoinShares: shares of shapes " +
                       c10::str(shares[0].sizes()) + " and " +
                       c10::str(share.sizes()));
    }
  }
  TensorSplit blocks = split;
  blocks.size = 1;
  RequireSplittable(shape, blocks, "JoinShares");
  // Block b of the whole is every rank's block b, in rank order.
  std::vector<torch::Tensor> pieces;
  for (int64_t b = 0; b < split.fused; ++b) {
    for (const torch::Tensor& share : shares) {
      pieces.push_back(share.chunk(split.fused, split.dim)[b]);
    }
  }
  return torch::cat(pieces, split.dim).contiguous();
}

std::vector<int64_t> WholeShape(std::vector<int64_t> share_shape,
                                const TensorSplit& split) {
  if (split.dim < 0 || split.dim >= static_cast<int64_t>(share_shape.size())) {
    throw UsageError("WholeShape: a share of shape " +
                     c10::str(c10::IntArrayRef(share_shape)) + " has no dim " +
                     std::to_string(split.dim));
  }
  share_shape[split.dim] *= split.size;
  return share_shape;
}

}  // namespace accel
