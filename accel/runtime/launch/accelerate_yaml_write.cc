// accel's launch flags written as Accelerate's YAML
// (AccelerateYamlFromFlags, accelerate_yaml.h): Accelerate's keys at the
// top, the FSDP and DeepSpeed sections, accel's own flags as
// "# accel: --flag=value" lines.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/launch/accelerate_yaml.h"
#include "accel/runtime/launch/accelerate_yaml_internal.h"

namespace accel {
namespace {

using accelerate_yaml_internal::IsAccelFlag;

// Written without quotes: booleans and numbers (a quoted 1.5 is a string
// to PyYAML, where Accelerate's own config writes a float).
bool IsPlain(const std::string& value) {
  if (value == "true" || value == "false") return true;
  if (value.empty() || value.size() >= 20) return false;
  char* end = nullptr;
  std::strtod(value.c_str(), &end);
  return *end == '\0' &&
         std::all_of(value.begin(), value.end(), [](unsigned char c) {
           return std::isdigit(c) || c == '.' || c == '-' || c == 'e';
         });
}

std::string Lookup(
    const std::vector<std::pair<std::string, std::string>>& flags,
    const std::string& name, const std::string& fallback) {
  for (const auto& [flag, value] : flags) {
    if (flag == name) return value;
  }
  return fallback;
}

// The flags that are top-level keys of Accelerate's own configuration
// (its ClusterConfig): accel writes no other key at the top.
bool IsAccelerateKey(const std::string& name) {
  static const std::set<std::string> keys = {
      "num_processes",   "num_machines",      "machine_rank",
      "main_process_ip", "main_process_port", "mixed_precision",
  };
  return keys.count(name) != 0;
}

// accel's own keys at their defaults are left out, so that a file written
// with them is one that Accelerate reads too (it refuses unknown keys).
bool IsAccelDefault(const std::string& name, const std::string& value) {
  return (name == "backend" && value == "auto") ||
         (name == "zero_stage" && value == "0") ||
         (name == "num_cpu_threads_per_process" && value == "1");
}

}  // namespace

std::string AccelerateYamlFromFlags(
    const std::vector<std::pair<std::string, std::string>>& flags) {
  const bool fsdp = Lookup(flags, "use_fsdp", "false") == "true";
  const bool cpu = Lookup(flags, "cpu", "false") == "true";
  const bool zero = !fsdp && Lookup(flags, "zero_stage", "0") != "0";
  const bool one_process = Lookup(flags, "num_processes", "1") == "1" &&
                           Lookup(flags, "num_machines", "1") == "1";
  // MULTI_CPU means --cpu (as Accelerate's does); gloo or MPI without
  // --cpu is MULTI_GPU with that backend. A ZeRO stage is DeepSpeed's.
  const std::string type = fsdp          ? "FSDP"
                           : zero        ? "DEEPSPEED"
                           : one_process ? "NO"
                           : cpu         ? "MULTI_CPU"
                                         : "MULTI_GPU";
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "compute_environment" << YAML::Value << "LOCAL_MACHINE";
  // Quoted as Accelerate writes it: a bare NO is false to YAML 1.1.
  out << YAML::Key << "distributed_type" << YAML::Value;
  if (type == "NO") out << YAML::SingleQuoted;
  out << type;
  out << YAML::Key << "use_cpu" << YAML::Value << (cpu ? "true" : "false");
  const auto value_of = [&](const std::string& value) {
    if (IsPlain(value)) {
      out << value;
    } else {
      out << YAML::SingleQuoted << value;
    }
  };
  // Accelerate's loader refuses any other top-level key (ValueError:
  // unknown keys): accel's own flags go in its sections, or else in
  // "# accel: --flag=value" lines, which Accelerate reads as comments.
  std::map<std::string, std::string> fsdp_section, deepspeed_section;
  std::optional<std::map<std::string, std::string>> parallelism_section;
  std::string accel_lines;
  for (const auto& [name, value] : flags) {
    if (!IsAccelFlag(name)) {
      throw UsageError("--" + name + " cannot be set in a configuration file");
    }
    if (name == "cpu" || name == "use_fsdp" || IsAccelDefault(name, value)) {
      continue;
    }
    if (name == "use_parallelism_config") {
      // Accelerate reads the section's presence as this switch.
      if (value == "true" && !parallelism_section) {
        parallelism_section.emplace();
      }
      continue;
    }
    if (name.rfind("parallelism_config_", 0) == 0) {
      if (!parallelism_section) parallelism_section.emplace();
      (*parallelism_section)[name] = value;
      continue;
    }
    if (name == "fsdp_sharding_strategy" ||
        name == "fsdp_transformer_layer_cls_to_wrap") {
      fsdp_section[name] = value;
    } else if ((name == "zero_stage" && zero) ||
               (zero && (name == "gradient_accumulation_steps" ||
                         name == "gradient_clipping"))) {
      // Accelerate reads deepspeed_config under DEEPSPEED alone; elsewhere
      // these are accel's own.
      deepspeed_section[name] = value;
    } else if (name == "collective_checks" && value == "true") {
      out << YAML::Key << "debug" << YAML::Value << "true";
    } else if (IsAccelerateKey(name)) {
      out << YAML::Key << name << YAML::Value;
      value_of(value);
    } else {
      accel_lines += "# accel: --" + name + "=" + value + "\n";
    }
  }
  if (parallelism_section && parallelism_section->empty()) {
    // --use_parallelism_config alone: the section with Accelerate's sizes.
    (*parallelism_section)["parallelism_config_dp_replicate_size"] = "1";
  }
  const std::map<std::string, std::string> no_section;
  for (const auto& [section, keys] :
       {std::pair<const char*, const std::map<std::string, std::string>&>{
            "fsdp_config", fsdp_section},
        {"deepspeed_config", deepspeed_section},
        {"parallelism_config",
         parallelism_section ? *parallelism_section : no_section}}) {
    if (keys.empty()) continue;
    out << YAML::Key << section << YAML::Value << YAML::BeginMap;
    for (const auto& [name, value] : keys) {
      out << YAML::Key << name << YAML::Value;
      value_of(value);
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  std::string text = std::string(out.c_str()) + "\n";
  if (!accel_lines.empty()) {
    text +=
        "# accel's own settings, which Accelerate has no keys for (it reads "
        "these\n# lines as comments):\n" +
        accel_lines;
  }
  return text;
}

}  // namespace accel
