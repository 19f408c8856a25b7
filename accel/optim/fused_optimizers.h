// LibTorch's AdamW, Adam and SGD with fused CPU steps (Apex's FusedAdam,
// torch's `fused=True`, DeepSpeed's CPU Adam): one pass over each parameter
// that reads the parameter, its gradient and its state once and writes the
// parameter and its state once, vectorized (AVX2 and FMA where the CPU has
// them, chosen at run time) and split over LibTorch's intra-op threads.
// LibTorch's step makes a pass per tensor operation (AdamW: nine, and two
// temporaries as large as the parameter): on a 25M-parameter MLP its AdamW
// step takes about 4x the floor of moving a float32 parameter's 28 bytes
// once at the memory bandwidth the machine achieves, the fused one about
// 1.1x (tools/bench/optimizer.cc; docs/benchmarks.md#optimizer-steps).
//
//   accel::FusedAdamW adamw(net->parameters(),
//                           torch::optim::AdamWOptions(3e-4));
//   auto [model, optimizer] = accelerator.prepare(net, adamw);
//   ... accelerator.backward(loss); optimizer.step(); ...
//
// Porting is renaming the type: each is a subclass of its LibTorch optimizer
// with the same constructors, options (torch::optim::AdamWOptions, ...),
// param groups and per-parameter state (torch::optim::AdamWParamState, ...)
// under the same keys, and overrides step() only. So everything that
// handles LibTorch's optimizers handles these: schedulers, ZeRO (which
// points the param groups at flat shard pieces), sharded checkpoints
// (param_state_codec.h), save_state, torch::save (a FusedAdamW's archive
// loads into a torch::optim::AdamW and back).
//
// The results are LibTorch's, bit for bit on x86-64: the loop does LibTorch's
// operations in its order with its roundings (scalars cast to the tensor's
// dtype as ATen casts them, bias corrections in double), and uses FMA
// exactly where ATen's kernels do: add_ with alpha (vec::fmadd) and
// addcmul_ (whose multiply-add the compiler of Debian's LibTorch fused) in
// its AVX2/AVX512 kernels, nothing in its default ones. So the loop takes
// the FMA form when ATen runs its AVX2 kernels (the CPU has AVX2 and FMA,
// and ATEN_CPU_CAPABILITY does not say "default"), and the other form
// otherwise. //accel/optim:fused_optimizers_test checks 0 ulp of
// difference over 25 steps in both cases, against Debian's LibTorch 1.13;
// a LibTorch compiled otherwise could round addcmul_ once more, 1 ulp.
//
// What the loop does not fuse goes to LibTorch's own step() for that
// parameter, rather than being refused: amsgrad, sparse gradients, tensors
// that are not float32/float64 or not on the CPU, non-contiguous tensors,
// a gradient or state of another dtype than the parameter. A model on the
// GPU or in bf16 thus trains exactly as with LibTorch's optimizer, only
// unfused, and a model mixing such tensors with plain float32 ones still
// gets the fused step for those. (LibTorch's step is run with the fused
// parameters' gradients hidden, so it steps only the rest.)
//
// Differences from LibTorch: none in results or state; the parameter's
// version counter is bumped once per step, as an in-place op would.
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <cstdint>

namespace accel {

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

class FusedAdam : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

class FusedSGD : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

namespace fused_internal {

// Whether the fused loops use FMA where ATen's kernels do (see above):
// ATen's choice of its AVX2 kernels, which the results follow.
bool UsesFma();

// Parameter steps this process's fused optimizers made in their loops and
// left to LibTorch's step(), so far: tests check that a run was fused.
struct StepCounts {
  int64_t fused = 0;
  int64_t unfused = 0;
};
StepCounts CountedSteps();

}  // namespace fused_internal

}  // namespace accel
