// STUB (lead's local placeholder until the blocks branch lands; not committed)
#pragma once
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <functional>
#include <memory>
namespace accel {
class LRScheduler {
 public:
  explicit LRScheduler(torch::optim::Optimizer& optimizer)
      : optimizer_(optimizer) {}
  virtual ~LRScheduler() = default;
  void step() { ++last_epoch_; }
  std::vector<double> get_last_lr() const { return {}; }
  int64_t last_epoch() const { return last_epoch_; }
  torch::optim::Optimizer& optimizer() { return optimizer_; }
  virtual void save(torch::serialize::OutputArchive& archive) const {}
  virtual void load(torch::serialize::InputArchive& archive) {}

 private:
  torch::optim::Optimizer& optimizer_;
  int64_t last_epoch_ = 0;
};
inline std::unique_ptr<LRScheduler> get_linear_schedule_with_warmup(
    torch::optim::Optimizer& o, int64_t, int64_t) {
  return std::make_unique<LRScheduler>(o);
}
}  // namespace accel
