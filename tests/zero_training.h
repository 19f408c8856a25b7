// What the ZeRO tests (zero_test.cc, zero_stage3_test.cc) and
// fused_optimizers_test.cc share: a small model trained for a few AdamW
// steps on the shared Accelerator's ranks, under DDP (stage 0) or a ZeRO
// stage, and what the run left: its parameters, norms and optimizer state.
//
//   const Result ddp = Train({});
//   const Result zero = Train({.stage = 2, .clip = 0.5});
//   EXPECT_LE(MaxDifference(zero.parameters, ddp.parameters), 1e-6);
#pragma once

#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "accel/accelerator.h"

namespace accel::testing {

inline constexpr int kSteps = 50;

// The same 12-40-40-3 MLP wherever it is built; `freeze_first`: its first
// layer does not train.
torch::nn::Sequential MakeModel(bool freeze_first = false);

// This rank's batch of a step: the same on every run.
std::pair<torch::Tensor, torch::Tensor> Batch(int step, int rank);

struct Run {
  int stage = 0;
  bool freeze_first = false;
  double clip = 0;  // clip_grad_norm_'s max_norm; 0: none.
  int accumulation = 1;
  int steps = kSteps;
  int first_step = 0;
  std::string save_to = "";        // save_state here after the steps.
  std::string load_from = "";      // load_state from here before them.
  std::string save_model_to = "";  // save_model here after the steps.
  std::string precision = "no";    // mixed_precision (under autocast).
  bool schedule = false;           // A prepared linear warm-up schedule.
  // Backwards per step outside accumulate(), each syncing, before one step
  // (their gradients add up).
  int backwards = 1;
  bool optimizer_first = false;  // prepare(optimizer, model).
  // Before the real prepare: prepare(model, an optimizer that holds a
  // parameter twice), which prepares the model, then throws.
  bool failed_prepare_first = false;
  // AcceleratorOptions::gradient_clipping: the prepared optimizer clips
  // (rather than clip_grad_norm_ with `clip`).
  double auto_clip = 0;
  // AcceleratorOptions::mixed_precision_policy's.
  std::optional<c10::ScalarType> param_dtype = std::nullopt;
  std::optional<c10::ScalarType> reduce_dtype = std::nullopt;
  bool cast_forward_inputs = true;
  bool fused = false;  // accel::FusedAdamW rather than torch::optim::AdamW.
  // AcceleratorOptions::parallelism_config (a device mesh); batches are
  // then those of the run's data-parallel rank.
  std::optional<ParallelismConfig> parallelism = std::nullopt;
};

struct Result {
  torch::Tensor parameters;  // Flattened, in order.
  // Parameters that still held a gradient after the last synced backward.
  int parameters_with_grad = 0;
  std::vector<double> norms;   // clip_grad_norm_'s, per step.
  int64_t state_elements = 0;  // exp_avg elements this rank's AdamW holds.
  // After the run: the model's parameters' dtypes, what the optimizer
  // steps (its params) and its exp_avg, and get_state_dict's values.
  std::set<c10::ScalarType> parameter_dtypes;
  std::set<c10::ScalarType> stepped_dtypes;
  std::set<c10::ScalarType> state_dtypes;
  std::set<c10::ScalarType> state_dict_dtypes;
  double last_loss = 0;  // The mean of the last step's losses, this rank.
};

// The shared Accelerator's options with `run`'s stage, precision,
// accumulation and clipping, and small gradient buckets.
AcceleratorOptions Options(const Run& run);

// Trains MakeModel() as `run` says, on an Accelerator of its own.
Result Train(const Run& run);

// Under stage 3 only the main process has the gathered parameters: the
// others compare nothing.
double MaxDifference(const torch::Tensor& a, const torch::Tensor& b);

// A folder under the test's temporary directory, one per process count.
std::string Folder(const std::string& name);

}  // namespace accel::testing
