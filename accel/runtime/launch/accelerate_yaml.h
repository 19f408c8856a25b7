// Accelerate's launch configuration (`accelerate config`'s
// default_config.yaml) read as accel's launch flags, and accel's flags
// written in that format, so that one file serves both tools.
//
//   std::vector<std::string> warnings;
//   for (const ConfigSetting& s :
//        SettingsFromAccelerateYaml(path, text, &warnings)) {
//     // s.name = "num_processes", s.value = "8", s.line = 9
//   }
//   const std::string yaml = AccelerateYamlFromFlags({{"num_processes", "2"}});
//
// The keys that apply: distributed_type (NO: one process; MULTI_CPU: the
// CPU, --cpu; MULTI_GPU: --backend=auto; FSDP: --use_fsdp; DEEPSPEED:
// --zero_stage from deepspeed_config.zero_stage, or from the
// zero_optimization.stage of its deepspeed_config_file's JSON), num_processes
// (over all machines, as accel's), num_machines, machine_rank, main_process_ip,
// main_process_port, mixed_precision, gradient_accumulation_steps, use_cpu,
// debug (true: --collective_checks), max_restarts, rdzv_backend (static or
// c10d: accel's store serves both), same_network (no effect: accel copies no
// files), fsdp_config's fsdp_sharding_strategy and
// fsdp_transformer_layer_cls_to_wrap, deepspeed_config's zero_stage,
// gradient_accumulation_steps and gradient_clipping; also every accel flag
// a configuration may set, under its own name (backend,
// num_cpu_threads_per_process, ...). From a deepspeed_config_file's JSON:
// zero_optimization.stage, gradient_accumulation_steps, fp16.enabled and
// bf16.enabled (--mixed_precision) and gradient_clipping, which decide over
// the command line (a warning says so, as Accelerate's); "auto" leaves a
// value to the other sources; its other keys (optimizer, scheduler, ...)
// are one warning naming them.
// Accelerate's keys that do not apply (TPU, IPEX, Megatron-LM, the FSDP and
// DeepSpeed settings accel has no counterpart for) and unknown keys are
// warnings naming them; a value of the wrong type or outside its choices is
// a UsageError naming file, line and key. A null value (`key: null`, as
// Accelerate writes for unset ones) is left out.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace accel {

// One flag a launch configuration sets, with the line it came from.
struct ConfigSetting {
  std::string name;   // A flag name, without dashes.
  std::string value;  // As on the command line.
  int line = 0;       // 1 for the file's first line.
  // Set for what a DeepSpeed JSON configuration decides (its path): that
  // wins over the command line, with a warning, as in Accelerate.
  std::string decided_by;
};

// True when `text` is accel's older flag-file format: its first line that is
// neither blank nor a # comment starts with "--" but not YAML's "---" (or
// it has no such line).
bool IsFlagFileText(const std::string& text);

// The flags that the YAML `text` (from `path`, named in messages) sets, in
// file order. Appends one line per warning to `warnings`.
std::vector<ConfigSetting> SettingsFromAccelerateYaml(
    const std::string& path, const std::string& text,
    std::vector<std::string>* warnings);

// `flags` (name, value) as Accelerate's YAML, in a layout Accelerate's own
// loader accepts (it refuses unknown top-level keys): Accelerate's keys at
// the top, a ZeRO stage as distributed_type DEEPSPEED with
// deepspeed_config.zero_stage, gradient accumulation and clipping under
// deepspeed_config, the FSDP settings under fsdp_config, and accel's own
// flags (backend, num_cpu_threads_per_process, timeouts, ...) as
// "# accel: --flag=value" lines after the YAML, which Accelerate reads as
// comments. SettingsFromAccelerateYaml of the result gives them back (it
// reads those lines too; they win over a key of the same flag).
std::string AccelerateYamlFromFlags(
    const std::vector<std::pair<std::string, std::string>>& flags);

}  // namespace accel
