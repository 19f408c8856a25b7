#include "accel/optim/fused_optimizers.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "accel/core/libtorch_compat.h"

namespace accel {
namespace fused_internal {

bool UsesFma() {
  // ATen's rule (DispatchStub.cpp, compute_cpu_capability): its AVX2
  // kernels when the CPU has AVX2 and FMA3, unless ATEN_CPU_CAPABILITY
  // names "default". AVX512 kernels use FMA too.
  static const bool uses = [] {
    const char* capability = std::getenv("ATEN_CPU_CAPABILITY");
    if (capability != nullptr && std::strcmp(capability, "default") == 0) {
      return false;
    }
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
  }();
  return uses;
}

namespace {

std::atomic<int64_t> fused_steps{0};
std::atomic<int64_t> unfused_steps{0};

}  // namespace

StepCounts CountedSteps() { return {fused_steps, unfused_steps}; }

}  // namespace fused_internal

namespace {

using fused_internal::UsesFma;

// Elements per chunk of at::parallel_for: ATen's own grain
// (at::internal::GRAIN_SIZE), so that a parameter is split over threads
// as LibTorch's elementwise ops split it.
constexpr int64_t kGrain = 32768;

#define ACCEL_FUSED_INLINE inline __attribute__((always_inline))

// a * b + c as ATen computes it: one rounding (vec::fmadd in its AVX2 and
// AVX512 kernels) or two (its default kernels). This file is compiled with
// -ffp-contract=off, so that GCC fuses nothing else.
template <bool kFma, typename T>
ACCEL_FUSED_INLINE T MulAdd(T a, T b, T c) {
  if constexpr (kFma) {
    return std::fma(a, b, c);
  } else {
    return a * b + c;
  }
}

// How a group's weight decay enters: not at all, AdamW's decoupled
// p *= 1 - lr * wd, or Adam's and SGD's L2 term grad + wd * p.
enum class Decay { kNone, kDecoupled, kL2 };

template <typename T>
struct AdamTensors {
  T* param;
  const T* grad;
  T* exp_avg;
  T* exp_avg_sq;
};

// The step's scalars, each cast to T as ATen casts a Scalar argument.
template <typename T>
struct AdamScalars {
  T decay;         // kDecoupled: 1 - lr * weight_decay.
  T weight_decay;  // kL2.
  T beta1;
  T one_minus_beta1;
  T beta2;
  T one_minus_beta2;
  T sqrt_bias_correction2;
  T eps;
  T neg_step_size;  // -lr / bias_correction1.
};

// LibTorch's Adam/AdamW step (adam.cpp, adamw.cpp) on elements
// [begin, end), one ATen op per line, each rounded where ATen rounds.
template <bool kFma, Decay kDecay, typename T>
ACCEL_FUSED_INLINE void AdamRange(const AdamTensors<T>& tensors,
                                  const AdamScalars<T>& s, int64_t begin,
                                  int64_t end) {
  T* __restrict param = tensors.param;
  const T* __restrict grad = tensors.grad;
  T* __restrict exp_avg = tensors.exp_avg;
  T* __restrict exp_avg_sq = tensors.exp_avg_sq;
  const AdamScalars<T> c = s;  // Locals, kept in registers.
  for (int64_t i = begin; i < end; ++i) {
    T p = param[i];
    T g = grad[i];
    if constexpr (kDecay == Decay::kDecoupled) p = p * c.decay;  // p.mul_
    if constexpr (kDecay == Decay::kL2) {
      g = MulAdd<kFma>(p, c.weight_decay, g);  // grad.add(p, wd)
    }
    // exp_avg.mul_(beta1).add_(grad, 1 - beta1): ATen's add is
    // fmadd(other, alpha, self).
    const T m = MulAdd<kFma>(g, c.one_minus_beta1, exp_avg[i] * c.beta1);
    // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2): ATen's
    // self + value * t1 * t2, whose last multiply-add GCC fuses.
    const T v = MulAdd<kFma>(c.one_minus_beta2 * g, g, exp_avg_sq[i] * c.beta2);
    // (exp_avg_sq.sqrt() / sqrt(bias_correction2)).add_(eps)
    const T denom = std::sqrt(v) / c.sqrt_bias_correction2 + c.eps;
    // p.addcdiv_(exp_avg, denom, -step_size): self + value * t1 / t2.
    param[i] = p + c.neg_step_size * m / denom;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  }
}

template <typename T>
struct SgdTensors {
  T* param;
  const T* grad;
  T* momentum_buffer;  // Null without momentum.
};

template <typename T>
struct SgdScalars {
  T weight_decay;
  T momentum;
  T one_minus_dampening;
  T neg_lr;  // -1 * lr
};

// How a parameter's momentum enters: none, a buffer made on this step
// (LibTorch's first step clones the gradient), or the buffer's update.
enum class Momentum { kNone, kFirst, kUpdate };

// LibTorch's SGD step (sgd.cpp) on elements [begin, end).
template <bool kFma, Decay kDecay, Momentum kMomentum, bool kNesterov,
          typename T>
ACCEL_FUSED_INLINE void SgdRange(const SgdTensors<T>& tensors,
                                 const SgdScalars<T>& s, int64_t begin,
                                 int64_t end) {
  T* __restrict param = tensors.param;
  const T* __restrict grad = tensors.grad;
  T* __restrict buffer = tensors.momentum_buffer;
  const SgdScalars<T> c = s;
  for (int64_t i = begin; i < end; ++i) {
    const T p = param[i];
    T d = grad[i];
    if constexpr (kDecay == Decay::kL2) {
      d = MulAdd<kFma>(p, c.weight_decay, d);  // d_p.add(p, wd)
    }
    if constexpr (kMomentum != Momentum::kNone) {
      T b = d;  // kFirst: torch::clone(d_p)
      if constexpr (kMomentum == Momentum::kUpdate) {
        // buf.mul_(momentum).add_(d_p, 1 - dampening)
        b = MulAdd<kFma>(d, c.one_minus_dampening, buffer[i] * c.momentum);
      }
      buffer[i] = b;
      if constexpr (kNesterov) {
        d = MulAdd<kFma>(b, c.momentum, d);  // d_p.add(buf, momentum)
      } else {
        d = b;
      }
    }
    param[i] = MulAdd<kFma>(d, c.neg_lr, p);  // p.add_(d_p, -1 * lr)
  }
}

// Each range function compiled twice: for AVX2 with FMA (GCC vectorizes
// it 8 floats wide) and for the baseline x86-64 the library is built for,
// so that the library runs on any x86-64 CPU.
#if defined(__x86_64__) || defined(__i386__)
#define ACCEL_FUSED_FMA_TARGET __attribute__((target("avx2,fma")))
#else
#define ACCEL_FUSED_FMA_TARGET
#endif

template <Decay kDecay, typename T>
ACCEL_FUSED_FMA_TARGET void AdamRangeFma(const AdamTensors<T>& tensors,
                                         const AdamScalars<T>& s, int64_t begin,
                                         int64_t end) {
  AdamRange<true, kDecay>(tensors, s, begin, end);
}

template <Decay kDecay, typename T>
void AdamRangePlain(const AdamTensors<T>& tensors, const AdamScalars<T>& s,
                    int64_t begin, int64_t end) {
  AdamRange<false, kDecay>(tensors, s, begin, end);
}

template <Decay kDecay, Momentum kMomentum, bool kNesterov, typename T>
ACCEL_FUSED_FMA_TARGET void SgdRangeFma(const SgdTensors<T>& tensors,
                                        const SgdScalars<T>& s, int64_t begin,
                                        int64_t end) {
  SgdRange<true, kDecay, kMomentum, kNesterov>(tensors, s, begin, end);
}

template <Decay kDecay, Momentum kMomentum, bool kNesterov, typename T>
void SgdRangePlain(const SgdTensors<T>& tensors, const SgdScalars<T>& s,
                   int64_t begin, int64_t end) {
  SgdRange<false, kDecay, kMomentum, kNesterov>(tensors, s, begin, end);
}

template <typename T>
using AdamRangeFn = void (*)(const AdamTensors<T>&, const AdamScalars<T>&,
                             int64_t, int64_t);

template <Decay kDecay, typename T>
AdamRangeFn<T> PickAdam() {
  return UsesFma() ? &AdamRangeFma<kDecay, T> : &AdamRangePlain<kDecay, T>;
}

template <typename T>
AdamRangeFn<T> PickAdam(Decay decay) {
  switch (decay) {
    case Decay::kNone:
      return PickAdam<Decay::kNone, T>();
    case Decay::kDecoupled:
      return PickAdam<Decay::kDecoupled, T>();
    case Decay::kL2:
      return PickAdam<Decay::kL2, T>();
  }
  return nullptr;
}

template <typename T>
using SgdRangeFn = void (*)(const SgdTensors<T>&, const SgdScalars<T>&, int64_t,
                            int64_t);

template <Decay kDecay, Momentum kMomentum, bool kNesterov, typename T>
SgdRangeFn<T> PickSgd() {
  return UsesFma() ? &SgdRangeFma<kDecay, kMomentum, kNesterov, T>
                   : &SgdRangePlain<kDecay, kMomentum, kNesterov, T>;
}

template <Decay kDecay, Momentum kMomentum, typename T>
SgdRangeFn<T> PickSgd(bool nesterov) {
  return nesterov ? PickSgd<kDecay, kMomentum, true, T>()
                  : PickSgd<kDecay, kMomentum, false, T>();
}

template <Decay kDecay, typename T>
SgdRangeFn<T> PickSgd(Momentum momentum, bool nesterov) {
  switch (momentum) {
    case Momentum::kNone:
      return PickSgd<kDecay, Momentum::kNone, false, T>();
    case Momentum::kFirst:
      return PickSgd<kDecay, Momentum::kFirst, T>(nesterov);
    case Momentum::kUpdate:
      return PickSgd<kDecay, Momentum::kUpdate, T>(nesterov);
  }
  return nullptr;
}

template <typename T>
SgdRangeFn<T> PickSgd(Decay decay, Momentum momentum, bool nesterov) {
  return decay == Decay::kL2 ? PickSgd<Decay::kL2, T>(momentum, nesterov)
                             : PickSgd<Decay::kNone, T>(momentum, nesterov);
}

// Runs `range` over [0, numel) on LibTorch's intra-op threads.
template <typename Range>
void ParallelRange(int64_t numel, const Range& range) {
  at::parallel_for(0, numel, kGrain,
                   [&](int64_t begin, int64_t end) { range(begin, end); });
}

bool FusableDtype(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat32 ||
         t.scalar_type() == torch::kFloat64;
}

// Whether `t` is one of the parameter's companions the loop can walk
// beside it: a dense contiguous CPU tensor of its dtype and size.
bool Companion(const torch::Tensor& t, const torch::Tensor& param) {
  return t.defined() && t.layout() == torch::kStrided && t.is_cpu() &&
         t.scalar_type() == param.scalar_type() && t.numel() == param.numel() &&
         t.is_contiguous();
}

// Whether the loop can step `param` (with a defined grad) and its state
// tensors (undefined ones will be made).
bool Fusable(const torch::Tensor& param,
             std::initializer_list<torch::Tensor> state) {
  if (param.layout() != torch::kStrided || !param.is_cpu() ||
      !FusableDtype(param) || !param.is_contiguous() ||
      !Companion(param.grad(), param)) {
    return false;
  }
  for (const torch::Tensor& t : state) {
    if (t.defined() && !Companion(t, param)) return false;
  }
  return true;
}

// What an in-place op on `param` would have done to autograd's record.
void MarkModified(const torch::Tensor& param) {
  if (!param.is_inference()) param.unsafeGetTensorImpl()->bump_version();
}

// The gradients of the fused parameters, hidden while LibTorch's step()
// steps the rest (it skips a parameter without one), and given back on the
// way out, also by an exception.
class HiddenGrads {
 public:
  explicit HiddenGrads(const std::vector<torch::Tensor>& params) {
    for (const torch::Tensor& param : params) {
      hidden_.emplace_back(param, std::exchange(param.mutable_grad(), {}));
    }
  }
  HiddenGrads(const HiddenGrads&) = delete;
  HiddenGrads& operator=(const HiddenGrads&) = delete;
  ~HiddenGrads() {
    for (auto& [param, grad] : hidden_) param.mutable_grad() = std::move(grad);
  }

 private:
  std::vector<std::pair<torch::Tensor, torch::Tensor>> hidden_;
};

torch::Tensor RunClosure(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

// The state of `param` in `state`, or null.
template <typename ParamState, typename StateMap>
ParamState* FindState(StateMap& state, const torch::Tensor& param) {
  const auto found = state.find(compat::StateKey(param));
  if (found == state.end()) return nullptr;
  return static_cast<ParamState*>(found->second.get());
}

// Makes Adam's or AdamW's state for `param` as LibTorch's step does.
template <typename ParamState, typename StateMap>
ParamState& MakeAdamState(StateMap& state, const torch::Tensor& param) {
  auto made = std::make_unique<ParamState>();
  made->step(0);
  made->exp_avg(torch::zeros_like(param, torch::MemoryFormat::Preserve));
  made->exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Preserve));
  ParamState& result = *made;
  state[compat::StateKey(param)] = std::move(made);
  return result;
}

template <typename T>
AdamScalars<T> MakeAdamScalars(double lr, std::tuple<double, double> betas,
                               double eps, double weight_decay, Decay decay,
                               int64_t step) {
  const auto [beta1, beta2] = betas;
  // As adam.cpp / adamw.cpp compute them, in double.
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  const double step_size = lr / bias_correction1;
  AdamScalars<T> s{};
  s.decay =
      static_cast<T>(decay == Decay::kDecoupled ? 1 - lr * weight_decay : 1);
  s.weight_decay = static_cast<T>(weight_decay);
  s.beta1 = static_cast<T>(beta1);
  s.one_minus_beta1 = static_cast<T>(1 - beta1);
  s.beta2 = static_cast<T>(beta2);
  s.one_minus_beta2 = static_cast<T>(1 - beta2);
  s.sqrt_bias_correction2 = static_cast<T>(std::sqrt(bias_correction2));
  s.eps = static_cast<T>(eps);
  s.neg_step_size = static_cast<T>(-step_size);
  return s;
}

template <typename T, typename ParamState>
void AdamStep(const torch::Tensor& param, ParamState& state, double lr,
              std::tuple<double, double> betas, double eps, double weight_decay,
              Decay decay) {
  const AdamScalars<T> scalars =
      MakeAdamScalars<T>(lr, betas, eps, weight_decay, decay, state.step());
  const AdamTensors<T> tensors{param.data_ptr<T>(), param.grad().data_ptr<T>(),
                               state.exp_avg().template data_ptr<T>(),
                               state.exp_avg_sq().template data_ptr<T>()};
  const AdamRangeFn<T> range = PickAdam<T>(decay);
  ParallelRange(param.numel(), [&](int64_t begin, int64_t end) {
    range(tensors, scalars, begin, end);
  });
  MarkModified(param);
}

// Steps `param` of an Adam-like optimizer whose state map is `state`
// (LibTorch's order: state made, step counted, then the update).
template <typename ParamState, typename StateMap>
void FusedAdamParam(StateMap& state_map, const torch::Tensor& param, double lr,
                    std::tuple<double, double> betas, double eps,
                    double weight_decay, Decay decay) {
  ParamState* state = FindState<ParamState>(state_map, param);
  if (state == nullptr) state = &MakeAdamState<ParamState>(state_map, param);
  state->step(state->step() + 1);
  if (param.scalar_type() == torch::kFloat32) {
    AdamStep<float>(param, *state, lr, betas, eps, weight_decay, decay);
  } else {
    AdamStep<double>(param, *state, lr, betas, eps, weight_decay, decay);
  }
}

// Whether the fused loop steps `param` of an Adam-like optimizer.
template <typename ParamState, typename StateMap>
bool AdamFusable(StateMap& state_map, const torch::Tensor& param,
                 bool amsgrad) {
  if (amsgrad) return false;
  const ParamState* state = FindState<ParamState>(state_map, param);
  if (state == nullptr) return Fusable(param, {});
  return state->exp_avg().defined() && state->exp_avg_sq().defined() &&
         Fusable(param, {state->exp_avg(), state->exp_avg_sq()});
}

template <typename T>
void SgdStep(const torch::Tensor& param, const torch::Tensor& buffer,
             const torch::optim::SGDOptions& options, Momentum momentum) {
  SgdScalars<T> scalars{};
  scalars.weight_decay = static_cast<T>(options.weight_decay());
  scalars.momentum = static_cast<T>(options.momentum());
  scalars.one_minus_dampening = static_cast<T>(1 - options.dampening());
  scalars.neg_lr = static_cast<T>(-1 * options.lr());
  const SgdTensors<T> tensors{
      param.data_ptr<T>(), param.grad().data_ptr<T>(),
      buffer.defined() ? buffer.data_ptr<T>() : nullptr};
  const Decay decay = options.weight_decay() != 0 ? Decay::kL2 : Decay::kNone;
  const SgdRangeFn<T> range = PickSgd<T>(
      decay, momentum, momentum != Momentum::kNone && options.nesterov());
  ParallelRange(param.numel(), [&](int64_t begin, int64_t end) {
    range(tensors, scalars, begin, end);
  });
  MarkModified(param);
}

// Steps `param` of an SGD whose state map is `state_map`, as sgd.cpp does
// (the momentum buffer made on the first step with momentum), or returns
// false.
template <typename StateMap>
bool FusedSgdParam(StateMap& state_map, const torch::optim::SGDOptions& options,
                   const torch::Tensor& param) {
  using torch::optim::SGDParamState;
  const bool with_momentum = options.momentum() != 0;
  SGDParamState* state =
      with_momentum ? FindState<SGDParamState>(state_map, param) : nullptr;
  torch::Tensor buffer =
      state != nullptr ? state->momentum_buffer() : torch::Tensor();
  if ((state != nullptr && !buffer.defined()) || !Fusable(param, {buffer})) {
    return false;
  }
  Momentum momentum = Momentum::kNone;
  if (with_momentum) {
    momentum = state != nullptr ? Momentum::kUpdate : Momentum::kFirst;
  }
  if (momentum == Momentum::kFirst) {
    buffer = torch::empty_like(param, torch::MemoryFormat::Preserve);
    auto made = std::make_unique<SGDParamState>();
    made->momentum_buffer(buffer);
    state_map[compat::StateKey(param)] = std::move(made);
  }
  if (param.scalar_type() == torch::kFloat32) {
    SgdStep<float>(param, buffer, options, momentum);
  } else {
    SgdStep<double>(param, buffer, options, momentum);
  }
  return true;
}

// The three step()s: the closure, then each parameter with a gradient
// either stepped by `fuse(options, param)` (which returns whether it
// could) or left to LibTorch's step(), run once at the end with the fused
// parameters' gradients hidden.
template <typename Options, typename Fuse, typename BaseStep>
torch::Tensor StepGroups(std::vector<torch::optim::OptimizerParamGroup>& groups,
                         const torch::optim::Optimizer::LossClosure& closure,
                         const Fuse& fuse, const BaseStep& base_step) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = RunClosure(closure);
  std::vector<torch::Tensor> fused;
  int64_t unfused = 0;
  for (auto& group : groups) {
    auto& options = static_cast<Options&>(group.options());
    for (const torch::Tensor& param : group.params()) {
      if (!param.grad().defined()) continue;
      if (fuse(options, param)) {
        fused.push_back(param);
      } else {
        ++unfused;
      }
    }
  }
  fused_internal::fused_steps += static_cast<int64_t>(fused.size());
  fused_internal::unfused_steps += unfused;
  if (unfused > 0) {
    HiddenGrads hidden(fused);
    base_step();
  }
  return loss;
}

}  // namespace

torch::Tensor FusedAdamW::step(LossClosure closure) {
  using torch::optim::AdamWOptions;
  using torch::optim::AdamWParamState;
  return StepGroups<AdamWOptions>(
      param_groups_, closure,
      [&](const AdamWOptions& options, const torch::Tensor& param) {
        if (!AdamFusable<AdamWParamState>(state_, param, options.amsgrad())) {
          return false;
        }
        FusedAdamParam<AdamWParamState>(
            state_, param, options.lr(), options.betas(), options.eps(),
            options.weight_decay(),
            options.weight_decay() != 0 ? Decay::kDecoupled : Decay::kNone);
        return true;
      },
      [&] { torch::optim::AdamW::step(); });
}

torch::Tensor FusedAdam::step(LossClosure closure) {
  using torch::optim::AdamOptions;
  using torch::optim::AdamParamState;
  return StepGroups<AdamOptions>(
      param_groups_, closure,
      [&](const AdamOptions& options, const torch::Tensor& param) {
        if (!AdamFusable<AdamParamState>(state_, param, options.amsgrad())) {
          return false;
        }
        FusedAdamParam<AdamParamState>(
            state_, param, options.lr(), options.betas(), options.eps(),
            options.weight_decay(),
            options.weight_decay() != 0 ? Decay::kL2 : Decay::kNone);
        return true;
      },
      [&] { torch::optim::Adam::step(); });
}

torch::Tensor FusedSGD::step(LossClosure closure) {
  using torch::optim::SGDOptions;
  return StepGroups<SGDOptions>(
      param_groups_, closure,
      [&](const SGDOptions& options, const torch::Tensor& param) {
        return FusedSgdParam(state_, options, param);
      },
      [&] { torch::optim::SGD::step(); });
}

}  // namespace accel
