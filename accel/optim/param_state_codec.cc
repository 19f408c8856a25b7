#include "accel/optim/param_state_codec.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "accel/optim/schedule_free.h"
#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

void Put(ParamStateValues& values, const char* key,
         const torch::Tensor& tensor) {
  if (tensor.defined()) values.tensors[key] = tensor;
}

// The value a state needs, or a CheckpointError naming it.
const torch::Tensor& Need(const ParamStateValues& values, const char* key,
                          const std::string& parameter) {
  const auto found = values.tensors.find(key);
  if (found == values.tensors.end()) {
    throw CheckpointError("the optimizer state of '" + parameter +
                          "' has no '" + key + "'");
  }
  return found->second;
}

torch::Tensor Maybe(const ParamStateValues& values, const char* key) {
  const auto found = values.tensors.find(key);
  return found == values.tensors.end() ? torch::Tensor() : found->second;
}

int64_t Count(const ParamStateValues& values, const char* key) {
  const auto found = values.counts.find(key);
  return found == values.counts.end() ? 0 : found->second;
}

template <typename State>
void ReadAdamLike(const State& state, ParamStateValues& values) {
  values.counts["step"] = state.step();
  Put(values, "exp_avg", state.exp_avg());
  Put(values, "exp_avg_sq", state.exp_avg_sq());
  Put(values, "max_exp_avg_sq", state.max_exp_avg_sq());
}

template <typename State>
std::unique_ptr<State> MakeAdamLike(const ParamStateValues& values,
                                    const std::string& parameter) {
  auto state = std::make_unique<State>();
  state->step(Count(values, "step"));
  state->exp_avg(Need(values, "exp_avg", parameter));
  state->exp_avg_sq(Need(values, "exp_avg_sq", parameter));
  state->max_exp_avg_sq(Maybe(values, "max_exp_avg_sq"));
  return state;
}

}  // namespace

bool KnowsParamState(const torch::optim::Optimizer& optimizer) {
  return dynamic_cast<const torch::optim::Adam*>(&optimizer) != nullptr ||
         dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr ||
         dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr ||
         dynamic_cast<const torch::optim::Adagrad*>(&optimizer) != nullptr ||
         dynamic_cast<const torch::optim::RMSprop*>(&optimizer) != nullptr ||
         dynamic_cast<const AdamWScheduleFree*>(&optimizer) != nullptr;
}

std::optional<ParamStateValues> ReadParamState(
    const torch::optim::OptimizerParamState& state) {
  ParamStateValues values;
  if (const auto* adam =
          dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    ReadAdamLike(*adam, values);
  } else if (const auto* adamw =
                 dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    ReadAdamLike(*adamw, values);
  } else if (const auto* sgd =
                 dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    Put(values, "momentum_buffer", sgd->momentum_buffer());
  } else if (const auto* adagrad =
                 dynamic_cast<const torch::optim::AdagradParamState*>(&state)) {
    values.counts["step"] = adagrad->step();
    Put(values, "sum", adagrad->sum());
  } else if (const auto* rmsprop =
                 dynamic_cast<const torch::optim::RMSpropParamState*>(&state)) {
    values.counts["step"] = rmsprop->step();
    Put(values, "square_avg", rmsprop->square_avg());
    Put(values, "momentum_buffer", rmsprop->momentum_buffer());
    Put(values, "grad_avg", rmsprop->grad_avg());
  } else if (const auto* free =
                 dynamic_cast<const AdamWScheduleFreeParamState*>(&state)) {
    Put(values, "z", free->z());
    Put(values, "exp_avg_sq", free->exp_avg_sq());
  } else {
    return std::nullopt;
  }
  return values;
}

std::unique_ptr<torch::optim::OptimizerParamState> MakeParamState(
    const torch::optim::Optimizer& optimizer, const ParamStateValues& values,
    const std::string& parameter) {
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer) != nullptr) {
    return MakeAdamLike<torch::optim::AdamParamState>(values, parameter);
  }
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr) {
    return MakeAdamLike<torch::optim::AdamWParamState>(values, parameter);
  }
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr) {
    auto state = std::make_unique<torch::optim::SGDParamState>();
    state->momentum_buffer(Maybe(values, "momentum_buffer"));
    return state;
  }
  if (dynamic_cast<const torch::optim::Adagrad*>(&optimizer) != nullptr) {
    auto state = std::make_unique<torch::optim::AdagradParamState>();
    state->step(Count(values, "step"));
    state->sum(Need(values, "sum", parameter));
    return state;
  }
  if (dynamic_cast<const torch::optim::RMSprop*>(&optimizer) != nullptr) {
    auto state = std::make_unique<torch::optim::RMSpropParamState>();
    state->step(Count(values, "step"));
    state->square_avg(Need(values, "square_avg", parameter));
    state->momentum_buffer(Maybe(values, "momentum_buffer"));
    state->grad_avg(Maybe(values, "grad_avg"));
    return state;
  }
  if (dynamic_cast<const AdamWScheduleFree*>(&optimizer) != nullptr) {
    auto state = std::make_unique<AdamWScheduleFreeParamState>();
    state->z(Need(values, "z", parameter));
    state->exp_avg_sq(Need(values, "exp_avg_sq", parameter));
    return state;
  }
  throw UsageError(
      "sharded checkpoints know the state of Adam, AdamW, SGD, Adagrad, "
      "RMSprop and AdamWScheduleFree, not this optimizer's");
}

}  // namespace accel
