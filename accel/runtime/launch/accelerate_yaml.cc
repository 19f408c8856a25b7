#include "accel/runtime/launch/accelerate_yaml.h"

#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/excerpt.h"
#include "accel/runtime/base/files.h"
#include "accel/runtime/launch/launch_config.h"

namespace accel {
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

// What DeepSpeed's JSON writes for a setting it leaves to Accelerate
// ("auto") or that is off (false, null, "none", {"device": "none"}): no
// warning for those.
bool IsHarmlessJson(const nlohmann::json& value) {
  if (value.is_null()) return true;
  if (value.is_boolean()) return !value.get<bool>();
  if (value.is_string()) {
    const std::string text = value.get<std::string>();
    return text == "auto" || text == "none";
  }
  if (value.is_object()) {
    for (const auto& item : value.items()) {
      if (!IsHarmlessJson(item.value())) return false;
    }
    return true;
  }
  return false;
}

// The settings of a DeepSpeed JSON configuration that map onto accel's
// flags; `where` starts each message.
struct DeepSpeedJsonReader {
  std::string where;
  std::string stage, accumulation, clipping, precision;
  bool stage_auto = false;  // "auto": the YAML's or the command line's.
  // Keys that do not apply, named in one warning (at most ten, then a
  // count).
  struct Names {
    std::vector<std::string> names;
    size_t count = 0;
    void Add(const std::string& name) {
      if (++count <= 10) names.push_back(Shown(name));
    }
    bool empty() const { return count == 0; }
    size_t size() const { return count; }
    std::string text() const {
      std::string joined;
      for (const std::string& name : names) {
        joined += (joined.empty() ? "" : ", ") + name;
      }
      return count <= 10
                 ? joined
                 : joined + " and " + std::to_string(count - 10) + " more";
    }
  } ignored;

  void Read(const nlohmann::json& json) {
    if (!json.is_object()) throw UsageError(where + " is not a JSON object");
    bool fp16 = false, bf16 = false;
    for (const auto& item : json.items()) {
      const std::string& key = item.key();
      const nlohmann::json& value = item.value();
      if (key == "zero_optimization") {
        ZeroOptimization(value);
      } else if (key == "gradient_accumulation_steps") {
        if (value.is_number_integer()) {
          accumulation = std::to_string(value.get<long long>());
        } else if (!IsAuto(value)) {
          throw UsageError(where +
                           ": gradient_accumulation_steps: expected "
                           "a whole number or \"auto\", found " +
                           Excerpt(value.dump()));
        }
      } else if (key == "gradient_clipping") {
        if (value.is_number() && value.get<double>() >= 0 &&
            std::isfinite(value.get<double>())) {
          clipping = value.dump();
        } else if (!IsAuto(value)) {
          throw UsageError(where +
                           ": gradient_clipping: expected a number, 0 or "
                           "above, or \"auto\", found " +
                           Excerpt(value.dump()));
        }
      } else if (key == "fp16") {
        fp16 = Enabled(key, value);
      } else if (key == "bf16" || key == "bfloat16") {
        bf16 = bf16 || Enabled(key, value);
      } else if (!IsHarmlessJson(value)) {
        ignored.Add(key);
      }
    }
    if (stage.empty() && !stage_auto) {
      throw UsageError(where +
                       " has no zero_optimization.stage (0 to 3, or \"auto\" "
                       "with deepspeed_config.zero_stage or --zero_stage)");
    }
    if (fp16 && bf16) {
      throw UsageError(where +
                       " enables both fp16 and bf16: enable one (it sets "
                       "--mixed_precision)");
    }
    if (fp16) precision = "fp16";
    if (bf16) precision = "bf16";
  }

  static bool IsAuto(const nlohmann::json& value) {
    return value.is_string() && value.get<std::string>() == "auto";
  }

  void ZeroOptimization(const nlohmann::json& section) {
    if (!section.is_object()) return;
    for (const auto& item : section.items()) {
      if (item.key() == "stage") {
        const nlohmann::json& value = item.value();
        if (value.is_number_integer() && value.get<long long>() >= 0 &&
            value.get<long long>() <= 3) {
          stage = std::to_string(value.get<long long>());
        } else if (IsAuto(value)) {
          stage_auto = true;  // deepspeed_config.zero_stage, or the flag.
        } else {
          throw UsageError(where +
                           ": zero_optimization.stage: expected 0 to 3 or "
                           "\"auto\", found " +
                           Excerpt(value.dump()));
        }
      } else if (!IsHarmlessJson(item.value())) {
        ignored.Add("zero_optimization." + item.key());
      }
    }
  }

  // fp16 / bf16: {"enabled": true | false | "auto", ...}; its other keys
  // (loss scaling's) are DeepSpeed's.
  bool Enabled(const std::string& key, const nlohmann::json& section) {
    if (!section.is_object()) {
      throw UsageError(where + ": " + key +
                       ": expected an object such as "
                       "{\"enabled\": true}, found " +
                       Excerpt(section.dump()));
    }
    bool enabled = false;
    for (const auto& item : section.items()) {
      const nlohmann::json& value = item.value();
      if (item.key() == "enabled") {
        if (value.is_boolean()) {
          enabled = value.get<bool>();
        } else if (!IsAuto(value)) {
          throw UsageError(where + ": " + key +
                           ".enabled: expected true, false or \"auto\", "
                           "found " +
                           Excerpt(value.dump()));
        }
      } else if (!IsHarmlessJson(value)) {
        ignored.Add(key + "." + item.key());
      }
    }
    return enabled;
  }
};

// Whether anything is at `path` (a file, a folder, a FIFO, ...), so that a
// reader can say what is wrong with it.
bool Exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
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

  std::string Integer(const std::string& key, const YAML::Node& value,
                      long long least, long long most) const {
    const std::string text = Scalar(key, value);
    char* end = nullptr;
    errno = 0;
    const long long number = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno != 0 ||
        !std::isdigit(static_cast<unsigned char>(text[0]))) {
      throw UsageError(Where(value) + key +
                       ": expected a whole number, found " + Excerpt(text));
    }
    if (text.size() > 1 && text[0] == '0') {
      throw UsageError(Where(value) + key + ": " + Excerpt(text) +
                       " has a leading 0, which YAML 1.1 (PyYAML, so "
                       "Accelerate) reads as octal; write it without");
    }
    if (number < least || number > most) {
      throw UsageError(Where(value) + key + ": expected " +
                       std::to_string(least) + " to " + std::to_string(most) +
                       ", found " + text);
    }
    return text;
  }

  std::string NonNegativeNumber(const std::string& key,
                                const YAML::Node& value) const {
    const std::string text = Scalar(key, value);
    char* end = nullptr;
    errno = 0;
    const double number = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || errno != 0 || !(number >= 0) ||
        !std::isfinite(number)) {
      throw UsageError(Where(value) + key +
                       ": expected a number, 0 or above, found " +
                       Excerpt(text));
    }
    return text;
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
                    const std::map<std::string, std::string>& why = {}) const {
    const std::string text = Scalar(key, value);
    std::string listed;
    for (const std::string& choice : choices) {
      if (text == choice) return text;
      listed += (listed.empty() ? "" : ", ") + choice;
    }
    auto reason = why.find(text);  // "*": any other value.
    if (reason == why.end()) reason = why.find("*");
    throw UsageError(Where(value) + key + ": expected one of " + listed +
                     ", found " + Excerpt(text) +
                     (reason != why.end() ? " (" + reason->second + ")" : ""));
  }

  ConfigSetting& Set(const std::string& name, const std::string& value,
                     const YAML::Node& from) {
    settings_.push_back({name, value, from.Mark().line + 1, ""});
    return settings_.back();
  }

  int Line(const YAML::Node& node) const { return node.Mark().line + 1; }

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
    const std::string hybrid =
        "hybrid sharding is not in accel; FULL_SHARD or SHARD_GRAD_OP shard "
        "over every process";
    return OneOf(key, value,
                 {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "1", "2", "3"},
                 {{"HYBRID_SHARD", hybrid},
                  {"HYBRID_SHARD_ZERO2", hybrid},
                  {"4", hybrid},
                  {"5", hybrid}});
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
        Exists(FolderOf(path_) + "/" + file)) {
      file = FolderOf(path_) + "/" + file;
    }
    // A relative path is the working directory's first, as Accelerate's,
    // then the YAML file's folder's.
    if (file.empty() || !Exists(file)) {
      throw UsageError(Where(value) + key + ": " + Excerpt(file) +
                       " does not exist (looked in the working directory and "
                       "beside " +
                       path_ + ")");
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

  std::string At(int line) const {
    return path_ + ":" + std::to_string(line) + ": ";
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
      warnings_->push_back(path_ + ": Accelerate's " + ignored_.text() +
                           (ignored_.size() == 1 ? " does" : " do") +
                           " not apply to accel and " +
                           (ignored_.size() == 1 ? "is" : "are") + " ignored");
    }
    if (!unknown_.empty()) {
      warnings_->push_back(path_ + ": unknown key" +
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

  const std::string path_;
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

// The "# accel: --flag=value" lines of a YAML file.
std::vector<ConfigSetting> AccelCommentLines(const std::string& path,
                                             const std::string& text) {
  std::vector<ConfigSetting> settings;
  std::istringstream lines(text);
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    const size_t hash = line.find_first_not_of(" \t");
    if (hash == std::string::npos || line[hash] != '#') continue;
    const size_t tag = line.find_first_not_of(" \t", hash + 1);
    if (tag == std::string::npos || line.compare(tag, 6, "accel:") != 0) {
      continue;
    }
    const size_t begin = line.find_first_not_of(" \t", tag + 6);
    const size_t last = line.find_last_not_of(" \t\r");
    const std::string flag =
        begin == std::string::npos ? "" : line.substr(begin, last - begin + 1);
    const size_t equals = flag.find('=');
    const std::string name =
        flag.rfind("--", 0) == 0 ? flag.substr(2, equals - 2) : "";
    if (equals == std::string::npos || !IsAccelFlag(name)) {
      const auto& flags = ConfigurableFlags();
      const std::string closest =
          ClosestName(name, std::set<std::string>(flags.begin(), flags.end()));
      throw UsageError(
          path + ":" + std::to_string(number) +
          ": expected \"# accel: --flag=value\" with one of accel's flags, "
          "found " +
          Excerpt(flag) +
          (closest.empty() ? "" : " (did you mean --" + closest + "?)"));
    }
    settings.push_back({name, flag.substr(equals + 1), number, ""});
  }
  return settings;
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
    const std::vector<YAML::Node> documents = YAML::LoadAll(text);
    if (documents.size() > 1) {
      throw UsageError(
          path + ":" +
          std::to_string(std::max(documents[1].Mark().line, 0) + 1) +
          ": a second YAML document; a launch configuration is "
          "one (Accelerate refuses more too)");
    }
    if (!documents.empty()) root = documents[0];
  } catch (const YAML::Exception& e) {
    throw UsageError(path + ":" + std::to_string(e.mark.line + 1) +
                     ": not YAML (" + e.msg +
                     "); a launch configuration is Accelerate's YAML or "
                     "--flag=value lines");
  }
  std::vector<ConfigSetting> settings;
  try {
    settings = YamlReader(path, warnings).Read(root);
  } catch (const YAML::Exception& e) {
    throw UsageError(path + ":" + std::to_string(e.mark.line + 1) + ": " +
                     e.msg);
  }
  // accel's own settings in comment lines (AccelerateYamlFromFlags), after
  // the keys: they win over a key of the same flag.
  for (ConfigSetting& setting : AccelCommentLines(path, text)) {
    settings.erase(std::remove_if(settings.begin(), settings.end(),
                                  [&](const ConfigSetting& other) {
                                    return other.name == setting.name;
                                  }),
                   settings.end());
    settings.push_back(std::move(setting));
  }
  return settings;
}

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
  std::string accel_lines;
  for (const auto& [name, value] : flags) {
    if (!IsAccelFlag(name)) {
      throw UsageError("--" + name + " cannot be set in a configuration file");
    }
    if (name == "cpu" || name == "use_fsdp" || IsAccelDefault(name, value)) {
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
  for (const auto& [section, keys] :
       {std::pair<const char*, const std::map<std::string, std::string>&>{
            "fsdp_config", fsdp_section},
        {"deepspeed_config", deepspeed_section}}) {
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
