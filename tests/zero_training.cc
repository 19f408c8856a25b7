// What the ZeRO tests share (zero_training.h): the model, its batches and
// a run of AdamW steps under DDP or a ZeRO stage.
#include "tests/zero_training.h"

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <tuple>

#include "accel/optim/fused_optimizers.h"
#include "tests/multiprocess_main.h"

namespace accel::testing {

torch::nn::Sequential MakeModel(bool freeze_first) {
  torch::manual_seed(11);
  torch::nn::Sequential model(torch::nn::Linear(12, 40), torch::nn::Tanh(),
                              torch::nn::Linear(40, 40), torch::nn::Tanh(),
                              torch::nn::Linear(40, 3));
  if (freeze_first) {
    for (auto& p : model[0]->parameters()) p.requires_grad_(false);
  }
  return model;
}

std::pair<torch::Tensor, torch::Tensor> Batch(int step, int rank) {
  auto generator =
      at::make_generator<at::CPUGeneratorImpl>(1000 * step + rank + 1);
  return {torch::randn({8, 12}, generator),
          torch::randint(0, 3, {8}, generator, torch::kLong)};
}

AcceleratorOptions Options(const Run& run) {
  AcceleratorOptions options = TestAcceleratorOptions();
  options.zero_stage = run.stage;
  options.mixed_precision = run.precision;
  options.gradient_accumulation_steps = run.accumulation;
  options.gradient_clipping = run.auto_clip;
  options.mixed_precision_policy.param_dtype = run.param_dtype;
  options.mixed_precision_policy.reduce_dtype = run.reduce_dtype;
  options.mixed_precision_policy.cast_forward_inputs = run.cast_forward_inputs;
  options.parallelism_config = run.parallelism;
  // Several buckets, so that stage 2 reduce-scatters during backward.
  options.gradient_sync.first_bucket_bytes = 512;
  options.gradient_sync.bucket_cap_bytes = 2048;
  return options;
}

Result Train(const Run& run) {
  Accelerator accelerator(Options(run));
  torch::nn::Sequential net = MakeModel(run.freeze_first);
  const auto adamw_options = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  std::unique_ptr<torch::optim::AdamW> owned =
      run.fused ? std::make_unique<FusedAdamW>(net->parameters(), adamw_options)
                : std::make_unique<torch::optim::AdamW>(net->parameters(),
                                                        adamw_options);
  torch::optim::AdamW& adamw = *owned;
  if (run.failed_prepare_first) {
    const torch::Tensor first = net->parameters()[0];
    torch::optim::AdamW twice(std::vector<torch::Tensor>{first, first},
                              adamw_options);
    try {
      accelerator.prepare(net, twice);
      ADD_FAILURE() << "an optimizer holding a parameter twice was prepared";
    } catch (const UsageError&) {
    }
  }
  auto [model, optimizer] = [&] {
    if (!run.optimizer_first) return accelerator.prepare(net, adamw);
    auto [o, m] = accelerator.prepare(adamw, net);
    return std::make_tuple(m, o);
  }();
  std::optional<AcceleratedScheduler> scheduler;
  if (run.schedule) {
    scheduler = accelerator.prepare(
        get_linear_schedule_with_warmup(adamw, 5, run.steps));
  }
  if (!run.load_from.empty()) accelerator.load_state(run.load_from);
  Result result;
  // Without a mesh, the process index.
  const int rank = accelerator.data_parallel_index();
  for (int step = run.first_step; step < run.first_step + run.steps; ++step) {
    for (int micro = 0; micro < run.accumulation; ++micro) {
      auto scope = accelerator.accumulate(model);
      for (int b = 0; b < run.backwards; ++b) {
        auto [x, y] =
            Batch((step * run.accumulation + micro) * run.backwards + b, rank);
        torch::Tensor loss;
        {
          auto autocast = accelerator.autocast();
          loss = torch::nn::functional::cross_entropy(model->forward(x), y);
        }
        result.last_loss = loss.item<double>();
        accelerator.backward(loss);
      }
      if (accelerator.sync_gradients()) {
        result.parameters_with_grad = 0;
        for (const auto& p : model->parameters()) {
          result.parameters_with_grad += p.grad().defined() ? 1 : 0;
        }
      }
      if (run.clip > 0 && accelerator.sync_gradients()) {
        result.norms.push_back(
            accelerator.clip_grad_norm_(model->parameters(), run.clip));
      }
      optimizer.step();
      if (scheduler) scheduler->step();
      optimizer.zero_grad();
    }
  }
  if (!run.save_model_to.empty()) {
    accelerator.save_model(model, run.save_model_to);
  }
  if (!run.save_to.empty()) {
    accelerator.save_state(run.save_to);
    accelerator.wait_for_everyone();  // Rank 0's file is written last.
  }
  // By name, from get_state_dict: under stage 3 the units are gathered one
  // at a time onto the main process, and the others get nothing.
  std::vector<torch::Tensor> flat;
  for (const auto& [name, tensor] : accelerator.get_state_dict(model)) {
    flat.push_back(tensor.reshape({-1}).to(torch::kFloat32));
    result.state_dict_dtypes.insert(tensor.scalar_type());
  }
  for (const auto& p : model->parameters()) {
    result.parameter_dtypes.insert(p.scalar_type());
  }
  for (const auto& group : adamw.param_groups()) {
    for (const auto& p : group.params()) {
      result.stepped_dtypes.insert(p.scalar_type());
    }
  }
  if (!flat.empty()) result.parameters = torch::cat(flat).clone();
  for (const auto& [key, state] : adamw.state()) {
    const auto& adamw_state =
        static_cast<torch::optim::AdamWParamState&>(*state);
    result.state_elements += adamw_state.exp_avg().numel();
    result.state_dtypes.insert(adamw_state.exp_avg().scalar_type());
  }
  return result;
}

double MaxDifference(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() || !b.defined()) {
    EXPECT_FALSE(SharedAccelerator().is_main_process())
        << "the main process got no parameters";
    return 0;
  }
  return (a - b).abs().max().item<double>();
}

std::string Folder(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/" + name + "_" +
         std::to_string(SharedAccelerator().num_processes());
}

}  // namespace accel::testing
