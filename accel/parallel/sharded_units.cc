#include "accel/parallel/sharded_units.h"

#include <torch/nn/modules/container/sequential.h>

#include <utility>

namespace accel {

ShardedUnitImpl::ShardedUnitImpl(torch::nn::AnyModule layer, std::string path)
    : layer_(std::move(layer)), module_(layer_.ptr()), path_(std::move(path)) {}

void ShardedUnitImpl::Attach(std::weak_ptr<UnitRunner> runner, size_t index) {
  runner_ = std::move(runner);
  index_ = index;
}

torch::Tensor ShardedUnitImpl::forward(torch::Tensor input) {
  const std::shared_ptr<UnitRunner> runner = runner_.lock();
  if (runner == nullptr) return layer_.forward<torch::Tensor>(input);
  runner->BeforeForward(index_);
  torch::Tensor output;
  try {
    output = layer_.forward<torch::Tensor>(input);
  } catch (...) {
    runner->AfterForward(index_);
    throw;
  }
  // The gradient reaching the output comes just before the layer's own
  // backward, which needs the parameters again.
  if (output.requires_grad()) {
    output.register_hook(
        [weak = runner_, index = index_](const torch::Tensor& /*grad*/) {
          if (auto alive = weak.lock()) alive->BeforeBackward(index);
        });
  }
  runner->AfterForward(index_);
  return output;
}

namespace {

bool HasTrainableParameters(const torch::nn::Module& module) {
  for (const auto& p : module.parameters()) {
    if (p.requires_grad()) return true;
  }
  return false;
}

// "torch::nn::TransformerEncoderLayerImpl" and "TransformerEncoderLayer"
// name the same type.
std::string BareTypeName(std::string name) {
  const size_t colon = name.rfind("::");
  if (colon != std::string::npos) name = name.substr(colon + 2);
  const std::string impl = "Impl";
  if (name.size() > impl.size() &&
      name.compare(name.size() - impl.size(), impl.size(), impl) == 0) {
    name.resize(name.size() - impl.size());
  }
  return name;
}

struct Wrapper {
  const std::string layer_type;  // Bare; empty: outermost Sequentials.
  std::vector<std::shared_ptr<ShardedUnitImpl>> units;

  static std::string Join(const std::string& prefix, const std::string& name) {
    return prefix.empty() ? name : prefix + "." + name;
  }

  // `layer` is a child of a Sequential.
  bool Picks(const torch::nn::Module& layer) const {
    if (!HasTrainableParameters(layer)) return false;
    return layer_type.empty() || BareTypeName(layer.name()) == layer_type;
  }

  void Visit(torch::nn::Module& module, const std::string& path) {
    auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&module);
    if (sequential == nullptr) {
      for (const auto& child : module.named_children()) {
        Visit(*child.value(), Join(path, child.key()));
      }
      return;
    }
    // A Sequential's children are registered in the order it runs them.
    const auto names = module.named_children();
    size_t i = 0;
    for (torch::nn::AnyModule& entry : *sequential) {
      const std::string child_path = Join(path, names[i++].key());
      torch::nn::Module& layer = *entry.ptr();
      if (Picks(layer)) {
        auto unit = std::make_shared<ShardedUnitImpl>(entry, child_path);
        units.push_back(unit);
        entry = torch::nn::AnyModule(unit);
      } else if (!layer_type.empty()) {
        Visit(layer, child_path);
      }
    }
  }
};

}  // namespace

std::vector<std::shared_ptr<ShardedUnitImpl>> WrapUnits(
    torch::nn::Module& model, const std::string& layer_type) {
  Wrapper wrapper{layer_type.empty() ? "" : BareTypeName(layer_type), {}};
  wrapper.Visit(model, "");
  return std::move(wrapper.units);
}

}  // namespace accel
