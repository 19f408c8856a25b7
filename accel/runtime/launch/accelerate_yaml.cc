#include "accel/runtime/launch/accelerate_yaml.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/excerpt.h"
#include "accel/runtime/launch/launch_config.h"

namespace accel {
namespace {

// Keys of Accelerate's configuration that mean nothing to accel; a file
// that sets them still launches, with one warning naming them.
const std::set<std::string>& NotApplying() {
  static const std::set<std::string> keys = {
      "commands",
      "command_file",
      "downcast_bf16",
      "dynamo_config",
      "enable_cpu_affinity",
      "fp8_config",
      "gpu_ids",
      "ipex_config",
      "main_training_function",
      "megatron_lm_config",
      "mpirun_config",
      "parallelism_config",
      "tpu_env",
      "tpu_name",
      "tpu_use_cluster",
      "tpu_use_sudo",
      "tpu_zone",
      "use_cpu_ipex",
  };
  return keys;
}

// What Accelerate's own config writes for the keys above when their
// feature is off (downcast_bf16: 'no', tpu_env: [], gpu_ids: all, ...): no
// warning for those.
bool IsHarmless(const YAML::Node& value) {
  if (value.IsSequence() || value.IsMap()) return value.size() == 0;
  const std::string text = value.IsScalar() ? value.Scalar() : "";
  return text.empty() || text == "no" || text == "false" || text == "main" ||
         text == "all";
}

bool IsAccelFlag(const std::string& name) {
  const auto& names = ConfigurableFlags();
  return std::find(names.begin(), names.end(), name) != names.end();
}

const char* KindOf(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "nothing";
    default:
      return "a value";
  }
}

// Reads one file's settings; every message names the file, line and key.
class YamlReader {
 public:
  YamlReader(const std::string& path, std::vector<std::string>* warnings)
      : path_(path), warnings_(warnings) {}

  std::vector<ConfigSetting> Read(const YAML::Node& root) {
    if (root.IsNull()) return {};
    if (!root.IsMap()) {
      throw UsageError(Where(root) +
                       "expected Accelerate's configuration (a "
                       "map of key: value), found " +
                       KindOf(root));
    }
    for (const auto& entry : root) Top(entry.first, entry.second);
    Finish();
    return Deduplicated();
  }

 private:
  std::string Where(const YAML::Node& node) const {
    return path_ + ":" + std::to_string(node.Mark().line + 1) + ": ";
  }

  std::string Key(const YAML::Node& key) const {
    if (!key.IsScalar()) {
      throw UsageError(Where(key) + "expected a key, found " + KindOf(key));
    }
    return key.Scalar();
  }

  std::string Scalar(const std::string& key, const YAML::Node& value) const {
    if (!value.IsScalar()) {
      throw UsageError(Where(value) + key + ": expected a value, found " +
                       KindOf(value));
    }
    return value.Scalar();
  }

  std::string Integer(const std::string& key, const YAML::Node& value) const {
    const std::string text = Scalar(key, value);
    char* end = nullptr;
    errno = 0;
    const long long number = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno != 0 || number < 0 ||
        number > (1LL << 31) - 1) {
      throw UsageError(Where(value) + key +
                       ": expected a whole number, found " + Excerpt(text));
    }
    return std::to_string(number);
  }

  bool Boolean(const std::string& key, const YAML::Node& value) const {
    std::string text = Scalar(key, value);
    std::transform(text.begin(), text.end(), text.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (text == "true" || text == "yes" || text == "on") return true;
    if (text == "false" || text == "no" || text == "off") return false;
    throw UsageError(Where(value) + key + ": expected true or false, found " +
                     Excerpt(value.Scalar()));
  }

  std::string OneOf(const std::string& key, const YAML::Node& value,
                    const std::vector<std::string>& choices,
                    const std::string& why = "") const {
    const std::string text = Scalar(key, value);
    std::string listed;
    for (const std::string& choice : choices) {
      if (text == choice) return text;
      listed += (listed.empty() ? "" : ", ") + choice;
    }
    throw UsageError(Where(value) + key + ": expected one of " + listed +
                     ", found " + Excerpt(text) + why);
  }

  void Set(const std::string& name, const std::string& value,
           const YAML::Node& from) {
    settings_.push_back({name, value, from.Mark().line + 1});
  }

  void Ignore(const std::string& key, const YAML::Node& at) {
    ignored_ += (ignored_.empty() ? "" : ", ") + key + " (line " +
                std::to_string(at.Mark().line + 1) + ")";
  }

  void Top(const YAML::Node& key_node, const YAML::Node& value) {
    const std::string key = Key(key_node);
    if (value.IsNull()) return;  // Accelerate writes unset keys as null.
    if (key == "distributed_type") {
      DistributedType(value);
    } else if (key == "num_processes") {
      num_processes_ = Integer(key, value);
      Set(key, num_processes_, value);
    } else if (key == "num_machines" || key == "machine_rank" ||
               key == "main_process_port" || key == "max_restarts" ||
               key == "gradient_accumulation_steps") {
      Set(key, Integer(key, value), value);
    } else if (key == "main_process_ip") {
      Set(key, Scalar(key, value), value);
    } else if (key == "mixed_precision") {
      Set(key, OneOf(key, value, {"no", "fp16", "bf16"}, " (accel has no fp8)"),
          value);
    } else if (key == "use_cpu") {
      Set("cpu", Boolean(key, value) ? "true" : "false", value);
    } else if (key == "debug") {
      if (Boolean(key, value)) Set("collective_checks", "true", value);
    } else if (key == "compute_environment") {
      OneOf(key, value, {"LOCAL_MACHINE"},
            " (accel starts its own processes, not SageMaker's)");
    } else if (key == "rdzv_backend") {
      OneOf(key, value, {"static", "c10d"},
            " (both meet at rank 0's store in accel)");
    } else if (key == "same_network") {
      Boolean(key, value);  // accel copies nothing between machines.
    } else if (key == "fsdp_config") {
      Section(key, value, [this](const std::string& k, const YAML::Node& v) {
        Fsdp(k, v);
      });
    } else if (key == "deepspeed_config") {
      Section(key, value, [this](const std::string& k, const YAML::Node& v) {
        DeepSpeed(k, v);
      });
    } else if (IsAccelFlag(key)) {
      Set(key, Scalar(key, value), value);
    } else if (NotApplying().count(key) != 0) {
      if (!IsHarmless(value)) Ignore(key, key_node);
    } else {
      unknown_ += (unknown_.empty() ? "" : ", ") + key + " (line " +
                  std::to_string(key_node.Mark().line + 1) + ")";
    }
  }

  void DistributedType(const YAML::Node& value) {
    distributed_type_ =
        OneOf("distributed_type", value,
              {"NO", "MULTI_CPU", "MULTI_GPU", "FSDP", "DEEPSPEED"},
              " (accel runs on CPUs and NVIDIA GPUs)");
    distributed_type_line_ = value.Mark().line + 1;
    if (distributed_type_ == "MULTI_CPU") Set("cpu", "true", value);
    if (distributed_type_ == "FSDP") Set("use_fsdp", "true", value);
  }

  template <typename Fn>
  void Section(const std::string& name, const YAML::Node& value, Fn&& each) {
    if (!value.IsMap()) {
      throw UsageError(Where(value) + name + ": expected a map, found " +
                       KindOf(value));
    }
    for (const auto& entry : value) {
      const std::string key = Key(entry.first);
      if (entry.second.IsNull()) continue;
      each(key, entry.second);
      if (ignored_key_) Ignore(name + "." + key, entry.first);
      ignored_key_ = false;
    }
  }

  void Fsdp(const std::string& key, const YAML::Node& value) {
    if (key == "fsdp_sharding_strategy") {
      Set(key, Scalar("fsdp_config." + key, value), value);
    } else if (key == "fsdp_transformer_layer_cls_to_wrap") {
      Set(key, Scalar("fsdp_config." + key, value), value);
    } else {
      ignored_key_ = true;
    }
  }

  void DeepSpeed(const std::string& key, const YAML::Node& value) {
    if (key == "zero_stage") {
      zero_stage_ =
          OneOf("deepspeed_config.zero_stage", value, {"0", "1", "2", "3"});
      Set("zero_stage", zero_stage_, value);
    } else if (key == "gradient_accumulation_steps") {
      Set(key, Integer("deepspeed_config." + key, value), value);
    } else {
      ignored_key_ = true;
    }
  }

  void Finish() {
    const std::string where =
        path_ + ":" + std::to_string(distributed_type_line_) + ": ";
    if (distributed_type_ == "NO") {
      if (!num_processes_.empty() && num_processes_ != "1") {
        throw UsageError(where +
                         "distributed_type NO runs one process, but "
                         "num_processes is " +
                         num_processes_ +
                         ": give MULTI_CPU or MULTI_GPU to run several");
      }
      if (num_processes_.empty()) {
        settings_.push_back({"num_processes", "1", distributed_type_line_});
      }
    }
    if (distributed_type_ == "DEEPSPEED" && zero_stage_.empty()) {
      throw UsageError(where +
                       "distributed_type DEEPSPEED needs "
                       "deepspeed_config.zero_stage (accel shards the "
                       "training state itself and reads no DeepSpeed JSON)");
    }
    if (!ignored_.empty()) {
      warnings_->push_back(path_ + ": Accelerate's " + ignored_ +
                           " do not apply to accel and are ignored");
    }
    if (!unknown_.empty()) {
      warnings_->push_back(path_ + ": unknown key(s) " + unknown_ +
                           " ignored (a misspelling?)");
    }
  }

  // Where a flag is set twice (MULTI_CPU, then use_cpu), the later wins.
  std::vector<ConfigSetting> Deduplicated() const {
    std::vector<ConfigSetting> kept;
    for (size_t i = 0; i < settings_.size(); ++i) {
      bool later = false;
      for (size_t j = i + 1; j < settings_.size(); ++j) {
        later |= settings_[j].name == settings_[i].name;
      }
      if (!later) kept.push_back(settings_[i]);
    }
    return kept;
  }

  const std::string path_;
  std::vector<std::string>* warnings_;
  std::vector<ConfigSetting> settings_;
  std::string ignored_, unknown_;
  bool ignored_key_ = false;
  std::string distributed_type_, num_processes_, zero_stage_;
  int distributed_type_line_ = 0;
};

bool IsPlain(const std::string& value) {
  if (value == "true" || value == "false") return true;
  return !value.empty() && value.size() < 10 &&
         std::all_of(value.begin(), value.end(),
                     [](unsigned char c) { return std::isdigit(c); });
}

std::string Lookup(
    const std::vector<std::pair<std::string, std::string>>& flags,
    const std::string& name, const std::string& fallback) {
  for (const auto& [flag, value] : flags) {
    if (flag == name) return value;
  }
  return fallback;
}

}  // namespace

bool IsFlagFileText(const std::string& text) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t begin = line.find_first_not_of(" \t\r");
    if (begin == std::string::npos || line[begin] == '#') continue;
    // "---" opens a YAML document.
    return line.compare(begin, 2, "--") == 0 &&
           line.compare(begin, 3, "---") != 0;
  }
  return true;
}

std::vector<ConfigSetting> SettingsFromAccelerateYaml(
    const std::string& path, const std::string& text,
    std::vector<std::string>* warnings) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw UsageError(path + ":" + std::to_string(e.mark.line + 1) +
                     ": not YAML (" + e.msg +
                     "); a launch configuration is Accelerate's YAML or "
                     "--flag=value lines");
  }
  try {
    return YamlReader(path, warnings).Read(root);
  } catch (const YAML::Exception& e) {
    throw UsageError(path + ":" + std::to_string(e.mark.line + 1) + ": " +
                     e.msg);
  }
}

std::string AccelerateYamlFromFlags(
    const std::vector<std::pair<std::string, std::string>>& flags) {
  const bool fsdp = Lookup(flags, "use_fsdp", "false") == "true";
  const bool cpu = Lookup(flags, "cpu", "false") == "true";
  const std::string backend = Lookup(flags, "backend", "auto");
  const bool one_process = Lookup(flags, "num_processes", "1") == "1" &&
                           Lookup(flags, "num_machines", "1") == "1";
  // MULTI_CPU means --cpu; use_cpu below says whether it was asked for.
  const std::string type = fsdp          ? "FSDP"
                           : one_process ? "NO"
                           : (cpu || backend == "gloo" || backend == "mpi")
                               ? "MULTI_CPU"
                               : "MULTI_GPU";
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "compute_environment" << YAML::Value << "LOCAL_MACHINE";
  out << YAML::Key << "distributed_type" << YAML::Value << type;
  out << YAML::Key << "use_cpu" << YAML::Value << (cpu ? "true" : "false");
  std::map<std::string, std::string> fsdp_section;
  for (const auto& [name, value] : flags) {
    if (!IsAccelFlag(name)) {
      throw UsageError("--" + name + " cannot be set in a configuration file");
    }
    if (name == "cpu" || name == "use_fsdp") continue;
    if (fsdp && (name == "fsdp_sharding_strategy" ||
                 name == "fsdp_transformer_layer_cls_to_wrap")) {
      fsdp_section[name] = value;
      continue;
    }
    out << YAML::Key << name << YAML::Value;
    if (IsPlain(value)) {
      out << value;
    } else {
      out << YAML::SingleQuoted << value;
    }
  }
  if (fsdp) {
    out << YAML::Key << "fsdp_config" << YAML::Value << YAML::BeginMap;
    for (const auto& [name, value] : fsdp_section) {
      out << YAML::Key << name << YAML::Value << YAML::SingleQuoted << value;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace accel
