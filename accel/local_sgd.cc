#include "accel/local_sgd.h"

#include <torch/torch.h>

#include <exception>
#include <map>
#include <string>
#include <utility>

#include "accel/runtime/base/errors.h"

namespace accel {

LocalSGD::LocalSGD(Accelerator& accelerator,
                   std::vector<torch::Tensor> parameters, int local_sgd_steps,
                   bool enabled)
    : accelerator_(accelerator),
      parameters_(std::move(parameters)),
      local_sgd_steps_(local_sgd_steps),
      enabled_(enabled),
      exceptions_(std::uncaught_exceptions()) {
  if (local_sgd_steps < 1) {
    throw UsageError("LocalSGD: local_sgd_steps must be at least 1, got " +
                     std::to_string(local_sgd_steps));
  }
  if (enabled && accelerator.zero_stage() > 0) {
    throw UsageError(
        "LocalSGD: not available under ZeRO (zero_stage " +
        std::to_string(accelerator.zero_stage()) +
        "): each rank steps only its share of the parameters, with gradients "
        "reduced every step; use zero_stage 0 (DDP) with LocalSGD");
  }
}

LocalSGD::~LocalSGD() noexcept(false) {
  if (active() && std::uncaught_exceptions() == exceptions_) {
    AverageParameters();
  }
}

void LocalSGD::step() {
  ++steps_;
  if (active() && steps_ % local_sgd_steps_ == 0) AverageParameters();
}

// One flat buffer per dtype: a model of hundreds of small tensors costs one
// collective, where Accelerate reduces each parameter alone.
void LocalSGD::AverageParameters() {
  std::map<torch::ScalarType, std::vector<torch::Tensor>> by_dtype;
  for (const torch::Tensor& p : parameters_) {
    by_dtype[p.scalar_type()].push_back(p);
  }
  torch::NoGradGuard no_grad;
  for (auto& [dtype, group] : by_dtype) {
    std::vector<torch::Tensor> flat_views;
    flat_views.reserve(group.size());
    for (const torch::Tensor& p : group) flat_views.push_back(p.reshape(-1));
    const torch::Tensor mean =
        accelerator_.reduce(torch::cat(flat_views), "mean");
    int64_t offset = 0;
    for (torch::Tensor& p : group) {
      p.copy_(mean.narrow(0, offset, p.numel()).view_as(p));
      offset += p.numel();
    }
  }
  ++averages_;
}

}  // namespace accel
