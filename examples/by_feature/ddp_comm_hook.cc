// Accelerate's examples/by_feature/ddp_comm_hook.py in C++: the gradients
// are compressed for their allreduce by a DDP communication hook
// (--ddp_comm_hook=fp16, bf16 or power_sgd), given to the Accelerator in
// DistributedDataParallelKwargs.
//
//   bazel run //examples/by_feature:ddp_comm_hook -- --num_processes=2
//       --ddp_comm_hook=power_sgd
//
// Differences: accel has no batched_power_sgd hook and no comm_wrapper
// (compressing PowerSGD's own messages); both are refused.
#include <map>
#include <string>

#include "examples/by_feature/common.h"

DEFINE_string(ddp_comm_hook, "no",
              "The gradients' compression: no, fp16, bf16 or power_sgd.");
DEFINE_int64(start_powersgd_iter, 2,
             "Not in the Python script: the first step PowerSGD compresses "
             "(torch's default, 1000, is past this run's 24 steps).");
DEFINE_string(ddp_comm_wrapper, "no",
              "Python's wrapper of the hook: only no (accel has none).");

namespace {

// Python's DDPCommunicationHookType(args.ddp_comm_hook).
accel::DDPCommunicationHookType HookType(const std::string& name) {
  static const std::map<std::string, accel::DDPCommunicationHookType> kHooks = {
      {"no", accel::DDPCommunicationHookType::kNo},
      {"fp16", accel::DDPCommunicationHookType::kFp16},
      {"bf16", accel::DDPCommunicationHookType::kBf16},
      {"power_sgd", accel::DDPCommunicationHookType::kPowerSgd}};
  const auto found = kHooks.find(name);
  if (found == kHooks.end()) {
    throw accel::UsageError(
        "--ddp_comm_hook must be no, fp16, bf16 or power_sgd, found '" + name +
        "'" +
        (name == "batched_power_sgd" ? " (accel has no batched PowerSGD)"
                                     : ""));
  }
  return found->second;
}

int Main(int, char**) {
  // New code: the hook, in DistributedDataParallelKwargs.
  accel::DistributedDataParallelKwargs ddp_kwargs;
  ddp_kwargs.comm_hook = HookType(FLAGS_ddp_comm_hook);
  // PowerSGD's default (torch's) compresses from step 1000 on; this run has
  // 24 steps, so it compresses from step --start_powersgd_iter.
  ddp_kwargs.comm_state_option.start_powerSGD_iter = FLAGS_start_powersgd_iter;
  if (FLAGS_ddp_comm_wrapper != "no") {
    throw accel::UsageError(
        "--ddp_comm_wrapper: accel has no communication wrappers, found '" +
        FLAGS_ddp_comm_wrapper + "'");
  }
  accel::AcceleratorOptions options = accel::AcceleratorOptions::FromFlags();
  options.kwargs_handlers = {ddp_kwargs};
  accel::Accelerator accelerator(options);
  const by_feature::Config config;
  by_feature::Training training(accelerator, config);
  by_feature::TrainAndEvaluate(accelerator, config, training);
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return by_feature::RunScript(argc, argv, Main);
}
