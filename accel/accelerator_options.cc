#include "accel/accelerator_options.h"

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <variant>

#include "accel/parallel/invariant_reduction.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/excerpt.h"
#include "accel/runtime/base/logging.h"
#include "accel/runtime/env/env_value.h"
#include "accel/runtime/launch/program_flags.h"
#include "accel/tracking/tracker.h"

namespace accel {

MixedPrecision ParseMixedPrecision(const std::string& text) {
  if (text == "no") return MixedPrecision::kNo;
  if (text == "bf16") return MixedPrecision::kBf16;
  if (text == "fp16") return MixedPrecision::kFp16;
  throw UsageError(
      "mixed precision (--mixed_precision) must be \"no\", \"bf16\" or "
      "\"fp16\", found " +
      Excerpt(text));
}

int ParseShardingStrategy(const std::string& text) {
  if (text == "FULL_SHARD" || text == "1") return 3;
  if (text == "SHARD_GRAD_OP" || text == "2") return 2;
  if (text == "NO_SHARD" || text == "3") return 0;
  if (text == "HYBRID_SHARD" || text == "4") return 3;
  if (text == "HYBRID_SHARD_ZERO2" || text == "5") return 2;
  throw UsageError(
      "--fsdp_sharding_strategy must be FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
      "HYBRID_SHARD or HYBRID_SHARD_ZERO2 (or Accelerate's numbers 1-5 for "
      "them), found " +
      Excerpt(text) + " (" + flags::fsdp_sharding_strategy.source() + ")");
}

bool IsHybridShardingStrategy(const std::string& text) {
  return text == "HYBRID_SHARD" || text == "HYBRID_SHARD_ZERO2" ||
         text == "4" || text == "5";
}

ParallelismConfig HybridShardingConfig(int num_processes,
                                       int processes_per_machine) {
  if (processes_per_machine < 1 || num_processes % processes_per_machine != 0) {
    throw UsageError(
        "hybrid sharding (--fsdp_sharding_strategy=HYBRID_SHARD) shards "
        "within each machine, but the " +
        std::to_string(num_processes) +
        " processes do not split evenly into "
        "machines of " +
        std::to_string(processes_per_machine) +
        "; give a parallelism_config (--parallelism_config_dp_shard_size) "
        "instead");
  }
  ParallelismConfig config;
  config.dp_shard_size = processes_per_machine;
  config.dp_replicate_size = num_processes / processes_per_machine;
  return config;
}

int ZeroStageFromFlags() {
  const int stage = flags::zero_stage.value();
  if (stage < 0 || stage > 3) {
    throw UsageError(
        "--zero_stage (" + flags::zero_stage.source() +
        ") must be 0 (DDP), 1 (optimizer state sharded), 2 (optimizer state "
        "and gradients sharded) or 3 (also the parameters), found " +
        std::to_string(stage));
  }
  if (!flags::use_fsdp.value()) {
    if (flags::fsdp_sharding_strategy.given()) {
      throw UsageError(
          "--fsdp_sharding_strategy (" +
          flags::fsdp_sharding_strategy.source() +
          ") is read with --use_fsdp, as accelerate launch reads it: add "
          "--use_fsdp, or give --zero_stage alone");
    }
    return stage;
  }
  const int fsdp_stage =
      ParseShardingStrategy(flags::fsdp_sharding_strategy.value());
  if (flags::zero_stage.given() && stage != fsdp_stage) {
    // The command line wins over the launch configuration, as for every
    // flag: --zero_stage typed there overrides the file's FSDP strategy.
    if (flags::zero_stage.from_command_line() &&
        !flags::use_fsdp.from_command_line() &&
        !flags::fsdp_sharding_strategy.from_command_line()) {
      return stage;
    }
    throw UsageError("--use_fsdp (" + flags::use_fsdp.source() +
                     ") with --fsdp_sharding_strategy=" +
                     flags::fsdp_sharding_strategy.value() + " (" +
                     flags::fsdp_sharding_strategy.source() +
                     ") is zero_stage " + std::to_string(fsdp_stage) +
                     ", but --zero_stage=" + std::to_string(stage) +
                     " was also given (" + flags::zero_stage.source() +
                     "): give one of them");
  }
  return fsdp_stage;
}

std::optional<ParallelismConfig> ParallelismConfigFromFlags() {
  const ProgramFlag<int32_t>* sizes[] = {
      &flags::parallelism_config_dp_replicate_size,
      &flags::parallelism_config_dp_shard_size,
      &flags::parallelism_config_tp_size, &flags::parallelism_config_cp_size};
  bool wanted = flags::use_parallelism_config.value();
  for (const ProgramFlag<int32_t>* size : sizes) wanted |= size->given();
  // Strictly, as accel reads its own switches: "maybe" is a UsageError.
  wanted |= EnvSwitch("ACCELERATE_USE_PARALLELISM_CONFIG").value_or(false);
  for (const char* variable :
       {"PARALLELISM_CONFIG_DP_REPLICATE_SIZE",
        "PARALLELISM_CONFIG_DP_SHARD_SIZE", "PARALLELISM_CONFIG_TP_SIZE",
        "PARALLELISM_CONFIG_CP_SIZE"}) {
    const char* value = std::getenv(variable);
    wanted |= value != nullptr && *value != '\0';
  }
  if (!wanted) return std::nullopt;
  ParallelismConfig config = ParallelismConfig::FromEnvironment();
  int* fields[] = {&config.dp_replicate_size, &config.dp_shard_size,
                   &config.tp_size, &config.cp_size};
  for (size_t i = 0; i < 4; ++i) {
    if (sizes[i]->given()) *fields[i] = sizes[i]->value();
  }
  return config;
}

AcceleratorOptions AcceleratorOptions::FromFlags() {
  // Checked here too (a program without InitProgram), so that the
  // message names the flag.
  CheckProgramFlagValues();
  AcceleratorOptions options;
  options.backend = flags::backend.value();
  options.mixed_precision = flags::mixed_precision.value();
  options.gradient_accumulation_steps =
      flags::gradient_accumulation_steps.value();
  options.gradient_clipping = flags::gradient_clipping.value();
  options.timeout = std::chrono::seconds(flags::timeout_s.value());
  options.rendezvous_timeout =
      std::chrono::seconds(flags::rendezvous_timeout_s.value());
  options.network_timeout =
      std::chrono::seconds(flags::network_timeout_s.value());
  options.check_collectives = flags::collective_checks.value();
  options.log_with = ParseTrackerNames(flags::report_to.value());
  options.logging_dir = flags::logging_dir.value();
  options.reuse_host_memory = flags::reuse_host_memory.value();
  options.cpu = flags::cpu.value();
  options.zero_stage = ZeroStageFromFlags();
  options.use_fsdp = flags::use_fsdp.value();
  options.hybrid_shard =
      options.use_fsdp &&
      IsHybridShardingStrategy(flags::fsdp_sharding_strategy.value());
  options.fsdp_layer_to_wrap =
      flags::fsdp_transformer_layer_cls_to_wrap.value();
  options.invariant_micro_batches = flags::invariant_micro_batches.value();
  options.parallelism_config = ParallelismConfigFromFlags();
  return options;
}

namespace {

// Applies one handler to `options`; `name` gets the handler's Python name.
struct HandlerApplier {
  AcceleratorOptions& options;
  const char*& name;

  void operator()(const DistributedDataParallelKwargs& ddp) {
    name = "DistributedDataParallelKwargs";
    if (ddp.bucket_cap_mb <= 0) {
      throw UsageError(
          "DistributedDataParallelKwargs: bucket_cap_mb must be positive, "
          "found " +
          std::to_string(ddp.bucket_cap_mb));
    }
    GradientSyncOptions& sync = options.gradient_sync;
    sync.bucket_cap_bytes = static_cast<size_t>(ddp.bucket_cap_mb) << 20;
    sync.broadcast_buffers = ddp.broadcast_buffers;
    sync.find_unused_parameters = ddp.find_unused_parameters;
    sync.gradient_as_bucket_view = ddp.gradient_as_bucket_view;
    sync.static_graph = ddp.static_graph;
    sync.comm_hook = ddp.comm_hook;
    sync.powersgd = ddp.comm_state_option;
  }
  void operator()(const InitProcessGroupKwargs& process_group) {
    name = "InitProcessGroupKwargs";
    if (!process_group.backend.empty()) {
      options.backend = process_group.backend;
    }
    if (process_group.timeout) options.timeout = *process_group.timeout;
  }
  void operator()(const GradScalerKwargs& scaler) {
    name = "GradScalerKwargs";
    options.scaler = scaler;
  }
  void operator()(const AutocastKwargs& autocast) {
    name = "AutocastKwargs";
    options.autocast = autocast;
  }
  void operator()(const ProfileKwargs& profile) {
    name = "ProfileKwargs";
    options.profile = profile;
  }
};

}  // namespace

void AcceleratorOptions::ApplyKwargsHandlers() {
  std::vector<bool> seen(std::variant_size_v<KwargsHandler>, false);
  for (const KwargsHandler& handler : kwargs_handlers) {
    const char* name = "";
    std::visit(HandlerApplier{*this, name}, handler);
    if (seen[handler.index()]) {
      throw UsageError(std::string("kwargs_handlers: two ") + name +
                       "; pass at most one of each kind (as Accelerate)");
    }
    seen[handler.index()] = true;
  }
}

namespace {

void CheckPolicy(const MixedPrecisionPolicy& policy) {
  const auto check = [](const std::optional<c10::ScalarType>& dtype,
                        const char* member) {
    if (dtype && !c10::isFloatingType(*dtype)) {
      throw UsageError(std::string("mixed_precision_policy.") + member +
                       " must be a floating-point dtype, found " +
                       c10::toString(*dtype));
    }
  };
  check(policy.param_dtype, "param_dtype");
  check(policy.reduce_dtype, "reduce_dtype");
  check(policy.buffer_dtype, "buffer_dtype");
}

// What a parallelism config needs of the other options; the process count
// is checked where it is known (the Accelerator, ParallelismConfig::
// Resolved).
void ValidateParallelism(const AcceleratorOptions& options) {
  const ParallelismConfig& config = *options.parallelism_config;
  // Resolved's checks that need no process count (sizes, combinations).
  config.Resolved(config.total_size());
  if (config.dp_shard_size > 1 && options.zero_stage == 0) {
    throw UsageError(
        "parallelism config: dp_shard_size " +
        std::to_string(config.dp_shard_size) +
        " shards the training state over its ranks, but zero_stage is 0 "
        "(DDP, nothing sharded); give --zero_stage 1-3 (or --use_fsdp), or "
        "make those ranks replicas (dp_replicate_size)");
  }
  if (options.invariant_micro_batches != 0) {
    throw UsageError(
        "invariant_micro_batches does not combine with a parallelism config "
        "(" +
        config.ToString() + "): its tree reduction runs over every process");
  }
}

}  // namespace

void AcceleratorOptions::Validate() const {
  const AcceleratorOptions& options = *this;
  ParseMixedPrecision(options.mixed_precision);
  CheckPolicy(options.mixed_precision_policy);
  if (options.gradient_accumulation_steps < 1) {
    throw UsageError("gradient_accumulation_steps must be at least 1, found " +
                     std::to_string(options.gradient_accumulation_steps));
  }
  if (options.timeout.count() <= 0) {
    throw UsageError("the collective timeout must be positive, found " +
                     std::to_string(options.timeout.count()) + " ms");
  }
  if (options.rendezvous_timeout.count() <= 0) {
    throw UsageError("the rendezvous timeout must be positive, found " +
                     std::to_string(options.rendezvous_timeout.count()) +
                     " ms");
  }
  if (!(options.gradient_clipping >= 0) ||
      !std::isfinite(options.gradient_clipping)) {
    throw UsageError(
        "gradient_clipping (--gradient_clipping) must be a finite number, 0 "
        "(off) or above, found " +
        std::to_string(options.gradient_clipping));
  }
  if (options.zero_stage < 0 || options.zero_stage > 3) {
    throw UsageError(
        "zero_stage (--zero_stage) must be 0 (DDP), 1 (optimizer state "
        "sharded), 2 (optimizer state and gradients sharded) or 3 (also "
        "the parameters), found " +
        std::to_string(options.zero_stage));
  }
  if (options.cpu && options.backend == "nccl") {
    throw UsageError(
        "cpu (--cpu) asks to train on the CPU, but backend (--backend) is "
        "nccl, which runs on GPUs; use --backend=gloo (or auto) with --cpu");
  }
  if (!options.dataloader_config.use_seedable_sampler ||
      !options.dataloader_config.use_stateful_dataloader) {
    throw UsageError(
        "dataloader_config: use_seedable_sampler and use_stateful_dataloader "
        "cannot be false: accel's data loaders always shuffle from their "
        "seed and always record their position for save_state");
  }
  // The process count is checked where it is known (the Accelerator).
  CheckInvariantMicroBatches(options.invariant_micro_batches, 1);
  if (options.invariant_micro_batches != 0) {
    const std::string mode = "invariant_micro_batches=" +
                             std::to_string(options.invariant_micro_batches);
    if (options.zero_stage != 0) {
      throw UsageError(mode + " does not combine with ZeRO (zero_stage " +
                       std::to_string(options.zero_stage) +
                       "), whose reduction sums into each rank's shard; "
                       "use one or the other");
    }
    if (options.gradient_accumulation_steps != 1) {
      throw UsageError(
          mode + " does not combine with gradient_accumulation_steps " +
          std::to_string(options.gradient_accumulation_steps) +
          ": its micro-batches are the accumulation; raise the global batch "
          "and invariant_micro_batches instead");
    }
    if (options.gradient_sync.comm_hook != DDPCommunicationHookType::kNo ||
        options.mixed_precision_policy.reduce_dtype) {
      throw UsageError(mode +
                       " does not combine with a DDP comm hook or a "
                       "reduce_dtype: they would round the sums this mode "
                       "keeps exact");
    }
  }
  if (options.parallelism_config) ValidateParallelism(options);
  if (options.hybrid_shard && options.zero_stage == 0) {
    throw UsageError(
        "hybrid_shard (--fsdp_sharding_strategy=HYBRID_SHARD) shards within "
        "each machine, but zero_stage is 0 (nothing sharded); give "
        "zero_stage 2 or 3");
  }
  if (options.total_limit < 0) {
    throw UsageError("total_limit must not be negative, found " +
                     std::to_string(options.total_limit));
  }
}

namespace {

std::string Describe(const std::string& value) { return "\"" + value + "\""; }
std::string Describe(int value) { return std::to_string(value); }
std::string Describe(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}
std::string Describe(bool value) { return value ? "true" : "false"; }
std::string Describe(std::chrono::milliseconds value) {
  return std::to_string(value.count()) + " ms";
}
std::string Describe(const std::vector<std::string>& value) {
  std::string text;
  for (const std::string& item : value)
    text += (text.empty() ? "" : ",") + item;
  return "{" + text + "}";
}

// Accelerate's Accelerator() reads what `accelerate launch` set; here a
// flag the user gave (command line or launch configuration) takes effect
// when the program left the option at AcceleratorOptions' default, and is
// listed in `overridden` when the program set something else.
template <typename T, typename Field, typename Convert>
void AdoptFlag(const ProgramFlag<T>& flag, Field& field, const Field& builtin,
               const char* option, Convert convert,
               std::vector<std::string>* overridden) {
  if (!flag.given()) return;
  const Field wanted = convert(flag.value());
  if (field == wanted) return;
  if (field == builtin) {
    field = wanted;
    return;
  }
  overridden->push_back("--" + std::string(flag.name()) + "=" +
                        Describe(flag.value()) + " (" + flag.source() +
                        ") by " + option + " = " + Describe(field));
}

}  // namespace

void AcceleratorOptions::AdoptGivenFlags(bool is_main_process) {
  AcceleratorOptions& options = *this;
  const AcceleratorOptions builtin;
  std::vector<std::string> overridden;
  const auto same = [](const auto& value) { return value; };
  const auto seconds = [](int value) {
    return std::chrono::milliseconds(std::chrono::seconds(value));
  };
  AdoptFlag(flags::backend, options.backend, builtin.backend, "backend", same,
            &overridden);
  AdoptFlag(flags::mixed_precision, options.mixed_precision,
            builtin.mixed_precision, "mixed_precision", same, &overridden);
  AdoptFlag(flags::gradient_accumulation_steps,
            options.gradient_accumulation_steps,
            builtin.gradient_accumulation_steps, "gradient_accumulation_steps",
            same, &overridden);
  AdoptFlag(flags::gradient_clipping, options.gradient_clipping,
            builtin.gradient_clipping, "gradient_clipping", same, &overridden);
  AdoptFlag(flags::timeout_s, options.timeout, builtin.timeout, "timeout",
            seconds, &overridden);
  AdoptFlag(flags::rendezvous_timeout_s, options.rendezvous_timeout,
            builtin.rendezvous_timeout, "rendezvous_timeout", seconds,
            &overridden);
  AdoptFlag(flags::network_timeout_s, options.network_timeout,
            builtin.network_timeout, "network_timeout", seconds, &overridden);
  AdoptFlag(flags::collective_checks, options.check_collectives,
            builtin.check_collectives, "check_collectives", same, &overridden);
  AdoptFlag(flags::report_to, options.log_with, builtin.log_with, "log_with",
            ParseTrackerNames, &overridden);
  AdoptFlag(flags::logging_dir, options.logging_dir, builtin.logging_dir,
            "logging_dir", same, &overridden);
  AdoptFlag(flags::reuse_host_memory, options.reuse_host_memory,
            builtin.reuse_host_memory, "reuse_host_memory", same, &overridden);
  AdoptFlag(flags::cpu, options.cpu, builtin.cpu, "cpu", same, &overridden);
  // --use_fsdp and its strategy name a stage too; ZeroStageFromFlags checks
  // that they agree with --zero_stage.
  const int stage_given = ZeroStageFromFlags();
  const auto given_stage = [&](auto) { return stage_given; };
  AdoptFlag(flags::zero_stage, options.zero_stage, builtin.zero_stage,
            "zero_stage", given_stage, &overridden);
  AdoptFlag(flags::use_fsdp, options.zero_stage, builtin.zero_stage,
            "zero_stage", given_stage, &overridden);
  AdoptFlag(flags::use_fsdp, options.use_fsdp, builtin.use_fsdp, "use_fsdp",
            same, &overridden);
  if (flags::use_fsdp.value()) {
    AdoptFlag(flags::fsdp_sharding_strategy, options.hybrid_shard,
              builtin.hybrid_shard, "hybrid_shard", IsHybridShardingStrategy,
              &overridden);
  }
  AdoptFlag(flags::fsdp_transformer_layer_cls_to_wrap,
            options.fsdp_layer_to_wrap, builtin.fsdp_layer_to_wrap,
            "fsdp_layer_to_wrap", same, &overridden);
  AdoptFlag(flags::invariant_micro_batches, options.invariant_micro_batches,
            builtin.invariant_micro_batches, "invariant_micro_batches", same,
            &overridden);
  // The sizes go together: a program's parallelism_config wins whole.
  const std::optional<ParallelismConfig> given = ParallelismConfigFromFlags();
  if (given && !options.parallelism_config) {
    options.parallelism_config = given;
  } else if (given && *options.parallelism_config != *given) {
    overridden.push_back(
        "--parallelism_config_* (" + given->ToString() +
        ") by parallelism_config = " + options.parallelism_config->ToString());
  }
  if (overridden.empty() || !is_main_process) return;
  std::string listed;
  for (const std::string& item : overridden) {
    listed += (listed.empty() ? "" : "; ") + item;
  }
  ACCEL_LOG(WARNING) << "the program's AcceleratorOptions override what was "
                        "given: "
                     << listed
                     << ". To let the command line decide, start from "
                        "AcceleratorOptions::FromFlags()";
}

}  // namespace accel
