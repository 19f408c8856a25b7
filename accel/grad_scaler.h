// STUB (lead's local placeholder until the blocks branch lands; not committed)
#pragma once
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <functional>
namespace accel {
struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {})
      : options_(options), scale_(options.init_scale) {}
  void set_agreement(std::function<bool(bool)> any_rank) {
    any_ = std::move(any_rank);
  }
  torch::Tensor scale(const torch::Tensor& loss) const {
    return options_.enabled ? loss * scale_ : loss;
  }
  void unscale_(torch::optim::Optimizer& optimizer) {}
  bool step(torch::optim::Optimizer& optimizer) {
    optimizer.step();
    return true;
  }
  void update() {}
  double get_scale() const { return scale_; }
  bool is_enabled() const { return options_.enabled; }
  int64_t growth_tracker() const { return 0; }
  void save(torch::serialize::OutputArchive&) const {}
  void load(torch::serialize::InputArchive&) {}

 private:
  GradScalerOptions options_;
  double scale_;
  std::function<bool(bool)> any_;
};
}  // namespace accel
