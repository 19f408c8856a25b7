#include "accel/memory/activation_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>

#include "accel/core/libtorch_compat.h"

namespace accel {
namespace activation_checkpoint_internal {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

thread_local int recompute_depth = 0;

// InActivationRecompute() for as long as it lives, also when fn throws.
class RecomputeScope {
 public:
  RecomputeScope() { ++recompute_depth; }
  ~RecomputeScope() { --recompute_depth; }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;
};

// The generators forward's RNG state is saved from: the CPU's, and that of
// each CUDA device an input is on (through the global context, which
// reaches CUDA's hooks without CUDA headers).
std::vector<at::Generator> Generators(
    const std::vector<torch::Tensor>& inputs) {
  std::vector<at::Generator> generators = {
      at::detail::getDefaultCPUGenerator()};
  std::vector<c10::Device> devices;
  for (const torch::Tensor& input : inputs) {
    if (!input.defined() || !input.is_cuda()) continue;
    if (std::find(devices.begin(), devices.end(), input.device()) !=
        devices.end()) {
      continue;
    }
    devices.push_back(input.device());
    generators.push_back(at::globalContext().defaultGenerator(input.device()));
  }
  return generators;
}

std::vector<torch::Tensor> States(std::vector<at::Generator>& generators) {
  std::vector<torch::Tensor> states;
  for (at::Generator& generator : generators) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    states.push_back(generator.get_state());
  }
  return states;
}

void SetStates(std::vector<at::Generator>& generators,
               const std::vector<torch::Tensor>& states) {
  for (size_t i = 0; i < generators.size(); ++i) {
    std::lock_guard<std::mutex> lock(generators[i].mutex());
    generators[i].set_state(states[i]);
  }
}

// torch.random.fork_rng: the saved states while it lives, the current ones
// again afterwards, so that the recompute's draws neither differ from
// forward's nor shift what the program draws after backward.
class RngFork {
 public:
  RngFork(std::vector<at::Generator>& generators,
          const std::vector<torch::Tensor>& saved)
      : generators_(generators), current_(States(generators)) {
    SetStates(generators_, saved);
  }
  ~RngFork() { SetStates(generators_, current_); }
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  std::vector<at::Generator>& generators_;
  std::vector<torch::Tensor> current_;
};

// Autocast as forward saw it, per device type (LibTorch keeps it per
// thread, and backward may run outside the autocast region or on another
// thread).
struct AutocastSettings {
  bool cpu = false;
  c10::ScalarType cpu_dtype = c10::kBFloat16;
  bool cuda = false;
  c10::ScalarType cuda_dtype = c10::kHalf;
  bool cache = true;

  static AutocastSettings Current() {
    AutocastSettings settings;
    settings.cpu = compat::AutocastEnabled(c10::DeviceType::CPU);
    settings.cpu_dtype = compat::AutocastDtype(c10::DeviceType::CPU);
    settings.cuda = compat::AutocastEnabled(c10::DeviceType::CUDA);
    settings.cuda_dtype = compat::AutocastDtype(c10::DeviceType::CUDA);
    settings.cache = at::autocast::is_autocast_cache_enabled();
    return settings;
  }

  // Sets only what differs: 1.13 refuses a CPU dtype other than bfloat16
  // even when it is the one already set.
  void Apply() const {
    const AutocastSettings now = Current();
    if (now.cpu_dtype != cpu_dtype) {
      compat::SetAutocastDtype(c10::DeviceType::CPU, cpu_dtype);
    }
    if (now.cpu != cpu) compat::SetAutocastEnabled(c10::DeviceType::CPU, cpu);
    if (now.cuda_dtype != cuda_dtype) {
      compat::SetAutocastDtype(c10::DeviceType::CUDA, cuda_dtype);
    }
    if (now.cuda != cuda) {
      compat::SetAutocastEnabled(c10::DeviceType::CUDA, cuda);
    }
    if (now.cache != cache) at::autocast::set_autocast_cache_enabled(cache);
  }
};

// The recompute under forward's autocast, as torch.autocast would open it:
// while it is enabled, casts of weights may be cached, and the cache goes
// when the outermost autocast region ends (here, unless the program's own
// region is still open), so that no cast outlives the optimizer's update
// of its weight.
class AutocastAs {
 public:
  explicit AutocastAs(const AutocastSettings& settings)
      : previous_(AutocastSettings::Current()),
        nests_(settings.cpu || settings.cuda) {
    settings.Apply();
    if (nests_) at::autocast::increment_nesting();
  }
  ~AutocastAs() {
    if (nests_ && at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();
    }
    previous_.Apply();
  }
  AutocastAs(const AutocastAs&) = delete;
  AutocastAs& operator=(const AutocastAs&) = delete;

 private:
  AutocastSettings previous_;
  bool nests_;
};

// Autocast's cache off while it lives. The forward run is without grad, and
// LibTorch caches a weight's cast whatever the grad mode: a cast cached there
// would carry no grad_fn, and the recompute (or a later layer in the same
// autocast region) would reuse it, so that the weight got no gradient.
class NoAutocastCache {
 public:
  NoAutocastCache() : previous_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~NoAutocastCache() { at::autocast::set_autocast_cache_enabled(previous_); }
  NoAutocastCache(const NoAutocastCache&) = delete;
  NoAutocastCache& operator=(const NoAutocastCache&) = delete;

 private:
  bool previous_;
};

// What backward needs besides the inputs (which autograd keeps, so that a
// freed graph frees them): a custom Function's context holds IValues only,
// hence the capsule.
struct CheckpointState : torch::CustomClassHolder {
  Recompute recompute;
  bool preserve_rng_state = true;
  std::vector<at::Generator> generators;
  std::vector<torch::Tensor> rng_states;
  AutocastSettings autocast;
  size_t num_outputs = 0;
};

constexpr const char* kState = "accel_checkpoint_state";

struct CheckpointFunction
    : public torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx,
                               c10::intrusive_ptr<CheckpointState> state,
                               at::TensorList inputs) {
    // Outputs nothing flows into arrive as undefined gradients rather than
    // zeros, and are left out of the recompute's backward.
    ctx->set_materialize_grads(false);
    std::vector<torch::Tensor> arguments = inputs.vec();
    state->autocast = AutocastSettings::Current();
    if (state->preserve_rng_state) {
      state->generators = Generators(arguments);
      state->rng_states = States(state->generators);
    }
    std::vector<torch::Tensor> outputs;
    {
      NoAutocastCache no_cache;
      outputs = state->recompute(arguments);
    }
    std::vector<torch::Tensor> integral;
    for (const torch::Tensor& output : outputs) {
      TORCH_CHECK(output.defined(),
                  "accel::checkpoint: fn returned an undefined tensor");
      if (!c10::isFloatingType(output.scalar_type()) &&
          !c10::isComplexType(output.scalar_type())) {
        integral.push_back(output);
      }
    }
    ctx->mark_non_differentiable(integral);
    state->num_outputs = outputs.size();
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data[kState] = c10::IValue::make_capsule(std::move(state));
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx,
                                variable_list grad_outputs) {
    // A graph task with inputs to stop at (torch::autograd::grad, backward's
    // `inputs`) would not run the nested backward below to the parameters.
    TORCH_CHECK(
        torch::autograd::Engine::get_default_engine().is_checkpoint_valid(),
        "accel::checkpoint does not work with torch::autograd::grad() or "
        "backward's `inputs` argument; call .backward() without `inputs`");
    variable_list saved;
    try {
      saved = ctx->get_saved_variables();
    } catch (const c10::Error& error) {
      TORCH_CHECK(false,
                  "accel::checkpoint: backward ran a second time through a "
                  "checkpointed call whose saved inputs the first backward "
                  "freed; pass retain_graph = true to the first backward. (",
                  error.what_without_backtrace(), ")");
    }
    const c10::intrusive_ptr<torch::CustomClassHolder> holder =
        ctx->saved_data.at(kState).toCapsule();
    auto* state = static_cast<CheckpointState*>(holder.get());

    std::vector<torch::Tensor> detached;
    detached.reserve(saved.size());
    for (const torch::Tensor& input : saved) {
      if (!input.defined()) {
        detached.emplace_back();
        continue;
      }
      detached.push_back(input.detach());
      detached.back().requires_grad_(input.requires_grad());
    }

    std::vector<torch::Tensor> outputs;
    {
      RecomputeScope recomputing;
      std::optional<RngFork> fork;
      if (state->preserve_rng_state) {
        fork.emplace(state->generators, state->rng_states);
      }
      AutocastAs autocast(state->autocast);
      torch::AutoGradMode grad_mode(true);
      outputs = state->recompute(detached);
    }
    TORCH_CHECK(outputs.size() == state->num_outputs,
                "accel::checkpoint: fn returned ", outputs.size(),
                " tensors when recomputed in backward but ", state->num_outputs,
                " in forward");

    variable_list roots;
    variable_list grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (grad_outputs[i].defined() && outputs[i].requires_grad()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, grads);

    variable_list input_grads = {torch::Tensor()};  // The state's.
    for (const torch::Tensor& input : detached) {
      input_grads.push_back(input.defined() && input.requires_grad()
                                ? input.grad()
                                : torch::Tensor());
    }
    return input_grads;
  }
};

}  // namespace

std::vector<torch::Tensor> Run(const ActivationCheckpointOptions& options,
                               Recompute recompute,
                               std::vector<torch::Tensor> inputs) {
  // Nothing would be kept for backward anyway.
  if (!torch::GradMode::is_enabled()) return recompute(inputs);
  const bool any_requires_grad = std::any_of(
      inputs.begin(), inputs.end(),
      [](const torch::Tensor& t) { return t.defined() && t.requires_grad(); });
  if (!any_requires_grad) {
    // The checkpoint's node would not enter the graph, and the parameters
    // inside fn would get no gradient: run fn as it is instead.
    std::vector<torch::Tensor> outputs = recompute(inputs);
    if (std::any_of(outputs.begin(), outputs.end(), [](const torch::Tensor& t) {
          return t.defined() && t.requires_grad();
        })) {
      TORCH_WARN_ONCE(
          "accel::checkpoint: no tensor argument requires grad, so fn ran "
          "without checkpointing (its activations are kept) for the "
          "parameters inside it to get their gradients; checkpoint from the "
          "first block whose input requires grad");
    }
    return outputs;
  }
  auto state = c10::make_intrusive<CheckpointState>();
  state->recompute = std::move(recompute);
  state->preserve_rng_state = options.preserve_rng_state;
  return CheckpointFunction::apply(std::move(state), at::TensorList(inputs));
}

}  // namespace activation_checkpoint_internal

bool InActivationRecompute() {
  return activation_checkpoint_internal::recompute_depth > 0;
}

}  // namespace accel
