// Accelerate's configuration keys mapped onto accel's flags: which apply
// (distributed_type, num_processes, fsdp_config, deepspeed_config, ...),
// which are warnings, and the checks that need two keys
// (accelerate_yaml_internal.h).
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/excerpt.h"
#include "accel/runtime/base/files.h"
#include "accel/runtime/launch/accelerate_yaml_internal.h"
#include "accel/runtime/launch/launch_config.h"

namespace accel::accelerate_yaml_internal {
namespace {

constexpr uint64_t kMaxDeepSpeedJsonBytes = 1 << 20;

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
      "tpu_env",
      "tpu_name",
      "tpu_use_cluster",
      "tpu_use_sudo",
      "tpu_zone",
      "use_cpu_ipex",
  };
  return keys;
}

// parallelism_config's keys of Accelerate's own that accel has no
// counterpart for (its context- and sequence-parallel backends).
const std::set<std::string>& AccelerateParallelismKeys() {
  static const std::set<std::string> keys = {
      "parallelism_config_cp_backend",
      "parallelism_config_cp_comm_strategy",
      "parallelism_config_sp_size",
      "parallelism_config_sp_backend",
      "parallelism_config_sp_seq_length",
      "parallelism_config_sp_seq_length_is_variable",
      "parallelism_config_sp_attn_implementation",
  };
  return keys;
}

// Values IsHarmless looks at in one file, at most. Aliases let 942 bytes of
// YAML name 10^10 values (10 levels of 10 keys, each an alias of the level
// below): walking them all hung every accel program before it started.
constexpr size_t kMaxValuesInspected = 10000;

// What Accelerate's own config writes for the keys above when their
// feature is off (downcast_bf16: 'no', tpu_env: [], gpu_ids: all, ...): no
// warning for those. `budget`: values left to look at; once it is spent,
// what is left counts as not harmless (the key is then named as ignored).
bool IsHarmless(const YAML::Node& value, size_t* budget) {
  if (*budget == 0) return false;
  --*budget;
  if (value.IsSequence()) return value.size() == 0;
  if (value.IsMap()) {
    // ipex_config: {ipex: false}: a section whose settings are all off.
    for (const auto& entry : value) {
      if (!IsHarmless(entry.second, budget)) return false;
    }
    return true;
  }
  if (!value.IsScalar()) return true;  // null
  std::string text = value.Scalar();
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return text.empty() || text == "no" || text == "false" || text == "none" ||
         text == "main" || text == "all";
}

// Keys named in a warning, the first ten of them (a file of thousands of
// unknown keys is one short line).
class KeyList {
 public:
  void Add(const std::string& key, const YAML::Node& at) {
    if (++count_ > 10) return;
    text_ += (text_.empty() ? "" : ", ") + Shown(key) + " (line " +
             std::to_string(at.Mark().line + 1) + ")";
  }
  bool empty() const { return count_ == 0; }
  size_t size() const { return count_; }
  std::string text() const {
    return count_ <= 10
               ? text_
               : text_ + " and " + std::to_string(count_ - 10) + " more";
  }

 private:
  std::string text_;
  size_t count_ = 0;
};

// Whether anything is at `path` (a file, a folder, a FIFO, ...), so that a
// reader can say what is wrong with it.
bool Exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

// Reads one file's settings; every message names the file, line and key.
class YamlReader : private YamlValueReader {
 public:
  YamlReader(const std::string& path, std::vector<std::string>* warnings)
      : YamlValueReader(path), warnings_(warnings) {}

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
  ConfigSetting& Set(const std::string& name, const std::string& value,
                     const YAML::Node& from) {
    settings_.push_back({name, value, from.Mark().line + 1, ""});
    return settings_.back();
  }

  void Top(const YAML::Node& key_node, const YAML::Node& value) {
    const std::string key = Key(key_node);
    if (value.IsNull()) return;  // Accelerate writes unset keys as null.
    if (key == "<<") {
      throw UsageError(Where(key_node) +
                       "a YAML merge key (<<); accel's YAML library "
                       "(yaml-cpp) does not merge, so write the keys out");
    }
    if (key == "distributed_type") {
      DistributedType(value);
    } else if (key == "num_processes") {
      num_processes_ = Integer(key, value, 1, kMaxLaunchProcesses);
      num_processes_line_ = Line(value);
      Set(key, num_processes_, value);
    } else if (key == "num_machines") {
      num_machines_ = Integer(key, value, 1, kMaxLaunchProcesses);
      num_machines_line_ = Line(value);
      Set(key, num_machines_, value);
    } else if (key == "machine_rank") {
      machine_rank_ = Integer(key, value, 0, kMaxLaunchProcesses - 1);
      machine_rank_line_ = Line(value);
      Set(key, machine_rank_, value);
    } else if (key == "main_process_port") {
      Set(key, Integer(key, value, 0, 65535), value);
    } else if (key == "max_restarts") {
      Set(key, Integer(key, value, 0, 1000000), value);
    } else if (key == "gradient_accumulation_steps") {
      AccumulationSteps(key, value);
    } else if (key == "main_process_ip") {
      const std::string address = Scalar(key, value);
      if (address.empty() || address.size() > 253) {
        throw UsageError(Where(value) + key +
                         ": expected a host name or address (1 to 253 "
                         "characters), found " +
                         Excerpt(address));
      }
      Set(key, address, value);
    } else if (key == "mixed_precision") {
      precision_ = OneOf(key, value, {"no", "fp16", "bf16"},
                         {{"fp8", "accel has no fp8"}});
      precision_line_ = Line(value);
      Set(key, precision_, value);
    } else if (key == "use_cpu") {
      use_cpu_ = Boolean(key, value);
      use_cpu_line_ = Line(value);
    } else if (key == "fault_tolerance") {
      // accel's own key (Accelerate has none): as --fault_tolerance.
      if (Boolean(key, value)) Set(key, "true", value);
    } else if (key == "debug") {
      // debug: false (what accelerate config writes) leaves accel's
      // checks on, as they are by default.
      if (Boolean(key, value)) Set("collective_checks", "true", value);
    } else if (key == "compute_environment") {
      OneOf(key, value, {"LOCAL_MACHINE"},
            {{"AMAZON_SAGEMAKER",
              "accel starts its own processes, not SageMaker's"}});
    } else if (key == "rdzv_backend") {
      OneOf(key, value, {"static", "c10d"},
            {{"etcd", "accel's ranks meet at rank 0's store"},
             {"etcd-v2", "accel's ranks meet at rank 0's store"}});
    } else if (key == "backend") {
      Set(key, OneOf(key, value, {"auto", "gloo", "nccl", "mpi"}), value);
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
    } else if (key == "parallelism_config") {
      Section(key, value, [this](const std::string& k, const YAML::Node& v) {
        Parallelism(k, v);
      });
    } else if (key == "fsdp_sharding_strategy") {
      Set(key, ShardingStrategy(key, value), value);
    } else if (IsAccelFlag(key)) {
      Set(key, Scalar(key, value), value);
    } else if (NotApplying().count(key) != 0) {
      if (!IsHarmless(value, &budget_)) ignored_.Add(key, key_node);
    } else {
      unknown_.Add(key, key_node);
    }
  }

  std::string ShardingStrategy(const std::string& key,
                               const YAML::Node& value) const {
    return OneOf(key, value,
                 {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                  "HYBRID_SHARD_ZERO2", "1", "2", "3", "4", "5"});
  }

  // Top-level or deepspeed_config's: both must agree when both are given.
  void AccumulationSteps(const std::string& key, const YAML::Node& value) {
    AccumulationStepsFrom(key, Integer(key, value, 1, 1 << 30), Line(value));
  }

  ConfigSetting& AccumulationStepsFrom(const std::string& what,
                                       const std::string& steps, int line) {
    if (std::stoll(steps) < 1) {
      throw UsageError(At(line) + what + " must be at least 1, found " + steps);
    }
    if (!accumulation_steps_.empty() && accumulation_steps_ != steps) {
      throw UsageError(At(line) + what + " is " + steps + ", but line " +
                       std::to_string(accumulation_steps_line_) + " says " +
                       accumulation_steps_ + ": give one");
    }
    accumulation_steps_ = steps;
    accumulation_steps_line_ = line;
    settings_.push_back({"gradient_accumulation_steps", steps, line, ""});
    return settings_.back();
  }

  void DistributedType(const YAML::Node& value) {
    distributed_type_ =
        OneOf("distributed_type", value,
              {"NO", "MULTI_CPU", "MULTI_GPU", "FSDP", "DEEPSPEED"},
              {{"*", "accel runs on CPUs and NVIDIA GPUs"}});
    distributed_type_line_ = value.Mark().line + 1;
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
      if (ignored_key_ && !IsHarmless(entry.second, &budget_)) {
        ignored_.Add(name + "." + key, entry.first);
      }
      ignored_key_ = false;
    }
  }

  void Fsdp(const std::string& key, const YAML::Node& value) {
    if (key == "fsdp_sharding_strategy") {
      Set(key, ShardingStrategy("fsdp_config." + key, value), value);
    } else if (key == "fsdp_transformer_layer_cls_to_wrap") {
      Set(key, Scalar("fsdp_config." + key, value), value);
    } else {
      ignored_key_ = true;
    }
  }

  // Accelerate's parallelism_config section (as `accelerate config` writes
  // it): the four sizes are accel's --parallelism_config_*_size flags, and
  // the section itself --use_parallelism_config, as Accelerate's launcher
  // reads it. Its CP and SP backend choices are Accelerate's own.
  void Parallelism(const std::string& key, const YAML::Node& value) {
    if (key == "parallelism_config_dp_replicate_size" ||
        key == "parallelism_config_dp_shard_size" ||
        key == "parallelism_config_tp_size" ||
        key == "parallelism_config_cp_size") {
      Set(key,
          Integer("parallelism_config." + key, value, 1, kMaxLaunchProcesses),
          value);
      Set("use_parallelism_config", "true", value);
    } else if (AccelerateParallelismKeys().count(key) != 0) {
      ignored_key_ = true;
    } else {
      unknown_.Add("parallelism_config." + key, value);
    }
  }

  void DeepSpeed(const std::string& key, const YAML::Node& value) {
    if (key == "zero_stage") {
      zero_stage_ =
          OneOf("deepspeed_config.zero_stage", value, {"0", "1", "2", "3"});
      Set("zero_stage", zero_stage_, value);
    } else if (key == "gradient_accumulation_steps") {
      AccumulationSteps("deepspeed_config." + key, value);
    } else if (key == "deepspeed_config_file") {
      DeepSpeedJson(value);
    } else if (key == "gradient_clipping") {
      Set(key, NonNegativeNumber("deepspeed_config." + key, value), value);
    } else {
      ignored_key_ = true;
    }
  }

  // Accelerate's deepspeed_config_file: what of DeepSpeed's JSON maps onto
  // accel (the ZeRO stage, accumulation, precision, clipping) decides over
  // the command line; the rest is DeepSpeed's own, and one warning names
  // it. A relative path is the working directory's, as for Accelerate,
  // else the YAML file's folder's.
  void DeepSpeedJson(const YAML::Node& value) {
    const std::string key = "deepspeed_config.deepspeed_config_file";
    std::string file = Scalar(key, value);
    if (!file.empty() && file[0] != '/' && !Exists(file) &&
        Exists(FolderOf(path()) + "/" + file)) {
      file = FolderOf(path()) + "/" + file;
    }
    // A relative path is the working directory's first, as Accelerate's,
    // then the YAML file's folder's.
    if (file.empty() || !Exists(file)) {
      throw UsageError(Where(value) + key + ": " + Excerpt(file) +
                       " does not exist (looked in the working directory and "
                       "beside " +
                       path() + ")");
    }
    const std::string why = WhyNotARegularFile(file);
    if (!why.empty()) {
      throw UsageError(Where(value) + key + ": " + Excerpt(file) +
                       " is not a regular file (" + why + ")");
    }
    // The size is checked before a byte is read: a 1.5 GB file cost 9.7 s
    // and 3.2 GB of memory before it was refused.
    std::string text;
    try {
      text = ReadSmallFile(file, kMaxDeepSpeedJsonBytes, "DeepSpeed config");
    } catch (const CheckpointError& e) {
      throw UsageError(Where(value) + key + ": " + e.what() +
                       " (a DeepSpeed configuration is at most 1 MiB)");
    }
    nlohmann::json json;
    try {
      json = nlohmann::json::parse(text, nullptr, true, true);
    } catch (const nlohmann::json::exception& e) {
      throw UsageError(Where(value) + key + ": " + file + " is not JSON (" +
                       e.what() + ")");
    }
    DeepSpeedJsonReader reader;
    reader.where = Where(value) + key + ": " + file;
    reader.Read(json);
    if (!reader.stage.empty()) {
      zero_stage_ = reader.stage;
      Set("zero_stage", zero_stage_, value).decided_by = file;
    } else {
      json_stage_auto_ = true;
    }
    if (!reader.accumulation.empty()) {
      AccumulationStepsFrom(file + "'s gradient_accumulation_steps",
                            reader.accumulation, Line(value))
          .decided_by = file;
    }
    if (!reader.clipping.empty()) {
      Set("gradient_clipping", reader.clipping, value).decided_by = file;
    }
    if (!reader.precision.empty()) {
      json_precision_ = reader.precision;
      json_precision_file_ = file;
      json_precision_line_ = Line(value);
    }
    if (!reader.ignored.empty()) {
      warnings_->push_back(file + ": DeepSpeed's " + reader.ignored.text() +
                           (reader.ignored.size() == 1 ? " does" : " do") +
                           " not apply to accel and " +
                           (reader.ignored.size() == 1 ? "is" : "are") +
                           " ignored (accel's loop makes its own optimizer, "
                           "scheduler and batches)");
    }
  }

  // YAML's mixed_precision and the JSON's agree; the JSON's decides.
  void SettleJsonPrecision() {
    if (json_precision_.empty()) return;
    if (!precision_.empty() && precision_ != "no" &&
        precision_ != json_precision_) {
      throw UsageError(At(precision_line_) + "mixed_precision is " +
                       precision_ + ", but " + json_precision_file_ +
                       " enables " + json_precision_ + ": give one");
    }
    settings_.push_back({"mixed_precision", json_precision_,
                         json_precision_line_, json_precision_file_});
  }

  // The checks that need two keys, each named with its line.
  void CheckMachines() const {
    const long long processes =
        num_processes_.empty() ? 1 : std::stoll(num_processes_);
    const long long machines =
        num_machines_.empty() ? 1 : std::stoll(num_machines_);
    if (!num_machines_.empty() && !num_processes_.empty() &&
        processes % machines != 0) {
      throw UsageError(At(num_processes_line_) + "num_processes (" +
                       num_processes_ + ") must be a multiple of " +
                       "num_machines (" + num_machines_ + ", line " +
                       std::to_string(num_machines_line_) + ")");
    }
    if (!machine_rank_.empty() && std::stoll(machine_rank_) >= machines) {
      throw UsageError(At(machine_rank_line_) + "machine_rank (" +
                       machine_rank_ + ") must be below num_machines (" +
                       std::to_string(machines) + ")");
    }
  }

  void Finish() {
    CheckMachines();
    SettleJsonPrecision();
    const std::string where = At(distributed_type_line_);
    // MULTI_CPU runs on CPUs whatever use_cpu says (Accelerate writes
    // use_cpu: false beside it too); use_cpu: true alone means the CPU.
    if (distributed_type_ == "MULTI_CPU") {
      settings_.push_back({"cpu", "true", distributed_type_line_});
    } else if (use_cpu_line_ > 0) {
      settings_.push_back({"cpu", use_cpu_ ? "true" : "false", use_cpu_line_});
    }
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
    if (json_stage_auto_ && zero_stage_.empty()) {
      // As Accelerate's DeepSpeed plugin fills in "auto" (its default
      // zero_stage); --zero_stage on the command line wins.
      settings_.push_back({"zero_stage", "2", distributed_type_line_, ""});
      zero_stage_ = "2";
    }
    if (distributed_type_ == "DEEPSPEED" && zero_stage_.empty()) {
      throw UsageError(where +
                       "distributed_type DEEPSPEED needs "
                       "deepspeed_config.zero_stage, or a "
                       "deepspeed_config_file whose JSON has "
                       "zero_optimization.stage (accel shards the training "
                       "state itself)");
    }
    if (!ignored_.empty()) {
      warnings_->push_back(path() + ": Accelerate's " + ignored_.text() +
                           (ignored_.size() == 1 ? " does" : " do") +
                           " not apply to accel and " +
                           (ignored_.size() == 1 ? "is" : "are") + " ignored");
    }
    if (!unknown_.empty()) {
      warnings_->push_back(path() + ": unknown key" +
                           (unknown_.size() == 1 ? " " : "s ") +
                           unknown_.text() + " ignored (a misspelling?)");
    }
  }

  // Where a key is given twice, the later wins (as in PyYAML).
  std::vector<ConfigSetting> Deduplicated() const {
    std::map<std::string, size_t> last;
    for (size_t i = 0; i < settings_.size(); ++i) {
      last[settings_[i].name] = i;
    }
    std::vector<ConfigSetting> kept;
    for (size_t i = 0; i < settings_.size(); ++i) {
      if (last[settings_[i].name] == i) kept.push_back(settings_[i]);
    }
    return kept;
  }

  std::vector<std::string>* warnings_;
  std::vector<ConfigSetting> settings_;
  KeyList ignored_, unknown_;
  bool ignored_key_ = false;
  size_t budget_ = kMaxValuesInspected;  // For IsHarmless.
  std::string distributed_type_, zero_stage_;
  std::string num_processes_, num_machines_, machine_rank_;
  std::string accumulation_steps_;
  int distributed_type_line_ = 0, num_processes_line_ = 0;
  int num_machines_line_ = 0, machine_rank_line_ = 0;
  int accumulation_steps_line_ = 0;
  bool use_cpu_ = false;
  int use_cpu_line_ = 0;   // 0: the file has no use_cpu.
  std::string precision_;  // The YAML's mixed_precision.
  int precision_line_ = 0;
  std::string json_precision_, json_precision_file_;  // Its JSON's.
  bool json_stage_auto_ = false;  // Its JSON's stage is "auto".
  int json_precision_line_ = 0;
};

}  // namespace

std::vector<ConfigSetting> SettingsFromAccelerateKeys(
    const std::string& path, const YAML::Node& root,
    std::vector<std::string>* warnings) {
  return YamlReader(path, warnings).Read(root);
}

}  // namespace accel::accelerate_yaml_internal
