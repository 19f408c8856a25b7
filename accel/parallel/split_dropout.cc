#include "accel/parallel/split_dropout.h"

#include <string>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

void CheckShare(const torch::Tensor& x, const DropoutShare& share) {
  const std::string which = "SplitDropout: a share {dim " +
                            std::to_string(share.dim) + ", index " +
                            std::to_string(share.index) + ", count " +
                            std::to_string(share.count) + "}";
  if (share.dim < 0 || share.dim >= x.dim()) {
    throw UsageError(which + " of a tensor of shape " + c10::str(x.sizes()) +
                     ", which has no such dimension");
  }
  if (share.count < 1 || share.index < 0 || share.index >= share.count) {
    throw UsageError(which + ": the index must lie in [0, count)");
  }
}

}  // namespace

torch::Tensor SplitDropout(const torch::Tensor& x, double p, bool training,
                           const std::vector<DropoutShare>& shares) {
  if (!(p >= 0 && p <= 1)) {
    throw UsageError("SplitDropout: a probability of " + std::to_string(p) +
                     "; it must lie in [0, 1]");
  }
  for (const DropoutShare& share : shares) CheckShare(x, share);
  if (shares.empty()) return torch::dropout(x, p, training);
  // torch::dropout's own shortcuts, which draw nothing.
  if (!training || p == 0 || x.numel() == 0) return x;
  if (p == 1) return x * torch::zeros({}, x.options());
  std::vector<int64_t> whole = x.sizes().vec();
  for (const DropoutShare& share : shares) whole[share.dim] *= share.count;
  // As torch::dropout draws it on the CPU: empty_like of a contiguous input
  // (what the layers here give it), bernoulli_(1 - p), then / (1 - p).
  torch::Tensor noise = torch::empty(whole, x.options()).bernoulli_(1 - p);
  noise.div_(1 - p);
  for (const DropoutShare& share : shares) {
    const int64_t part = noise.size(share.dim) / share.count;
    noise = noise.narrow(share.dim, share.index * part, part);
  }
  return x * noise;
}

}  // namespace accel
