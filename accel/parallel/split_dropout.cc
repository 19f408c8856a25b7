#include "accel/parallel/split_dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <limits>
#include <mutex>
#include <string>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

// `p` as given: "1.000000001", not std::to_string's "1.000000".
std::string Shown(double p) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", p);
  return text;
}

// The share with its dim counted from the front; UsageError naming what is
// wrong with it.
DropoutShare Checked(const torch::Tensor& x, const DropoutShare& share) {
  const std::string which = "SplitDropout: a share {dim " +
                            std::to_string(share.dim) + ", index " +
                            std::to_string(share.index) + ", count " +
                            std::to_string(share.count) + "}";
  DropoutShare checked = share;
  if (checked.dim < 0) checked.dim += x.dim();
  if (checked.dim < 0 || checked.dim >= x.dim()) {
    throw UsageError(which + " of a tensor of shape " + c10::str(x.sizes()) +
                     ", which has no such dimension (dims run from -" +
                     std::to_string(x.dim()) + " to " +
                     std::to_string(x.dim() - 1) + ")");
  }
  if (share.count < 1) {
    throw UsageError(which + ": the count of shares must be at least 1");
  }
  if (share.index < 0 || share.index >= share.count) {
    throw UsageError(which + ": the index must lie in [0, count)");
  }
  return checked;
}

}  // namespace

torch::Tensor SplitDropout(const torch::Tensor& x, double p, bool training,
                           const std::vector<DropoutShare>& shares) {
  if (!(p >= 0 && p <= 1)) {
    throw UsageError("SplitDropout: a probability of " + Shown(p) +
                     "; it must lie in [0, 1]");
  }
  std::vector<DropoutShare> checked;
  for (const DropoutShare& share : shares) checked.push_back(Checked(x, share));
  if (checked.empty()) return torch::dropout(x, p, training);
  // torch::dropout's own shortcuts, which draw nothing.
  if (!training || p == 0 || x.numel() == 0) return x;
  if (p == 1) return x * torch::zeros({}, x.options());
  std::vector<int64_t> whole = x.sizes().vec();
  int64_t elements = x.numel();
  for (const DropoutShare& share : checked) {
    if (__builtin_mul_overflow(whole[share.dim], share.count,
                               &whole[share.dim]) ||
        __builtin_mul_overflow(elements, share.count, &elements)) {
      throw UsageError("SplitDropout: shares of a tensor of shape " +
                       c10::str(x.sizes()) +
                       " make a whole tensor too large to draw (counts " +
                       "multiply past 2^63)");
    }
  }
  // As torch::dropout draws it on the CPU: empty_like of a contiguous input
  // (what the layers here give it), bernoulli_(1 - p), then / (1 - p).
  torch::Tensor noise = torch::empty(whole, x.options()).bernoulli_(1 - p);
  noise.div_(1 - p);
  for (const DropoutShare& share : checked) {
    const int64_t part = noise.size(share.dim) / share.count;
    noise = noise.narrow(share.dim, share.index * part, part);
  }
  return x * noise;
}

void AlignGenerators(Communicator& group, const char* api) {
  if (group.size() == 1) return;
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  torch::Tensor state;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state().contiguous();
  }
  CollectiveOptions options;
  options.api = api;
  group.broadcast(state.data_ptr(), static_cast<size_t>(state.numel()),
                  DType::kUInt8, 0, options);
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

void AlignModelParallelGenerators(DeviceMesh& mesh, const char* api) {
  for (const char* dimension : {"tp", "cp"}) {
    if (mesh.size(dimension) > 1) AlignGenerators(mesh.group(dimension), api);
  }
}

}  // namespace accel
