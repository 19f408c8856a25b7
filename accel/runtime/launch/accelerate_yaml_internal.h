// Private to accelerate_yaml*.cc: what the reading of Accelerate's YAML
// (accelerate_yaml.cc), the mapping of its keys onto accel's flags
// (accelerate_yaml_keys.cc), the reading of a DeepSpeed JSON configuration
// (accelerate_yaml_deepspeed.cc) and the writing (accelerate_yaml_write.cc)
// share.
//
//   YamlValueReader values(path);
//   const std::string port = values.Integer("main_process_port", node, 0,
//                                           65535);  // or a UsageError
//                                                    // naming file and line
#pragma once

#include <yaml-cpp/yaml.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "accel/runtime/launch/accelerate_yaml.h"

namespace accel::accelerate_yaml_internal {

// Whether `name` is one of accel's flags that a configuration may set.
bool IsAccelFlag(const std::string& name);

// "a map", "a list", "nothing" or "a value", for messages.
const char* KindOf(const YAML::Node& node);

// Typed reads of one file's YAML values; every UsageError names the file
// (`path`), the line and the key.
class YamlValueReader {
 public:
  explicit YamlValueReader(const std::string& path) : path_(path) {}

  const std::string& path() const { return path_; }
  // "PATH:LINE: ", for the start of a message.
  std::string Where(const YAML::Node& node) const;
  std::string At(int line) const;
  int Line(const YAML::Node& node) const { return node.Mark().line + 1; }

  std::string Key(const YAML::Node& key) const;
  std::string Scalar(const std::string& key, const YAML::Node& value) const;
  // A whole number from `least` to `most`, as written (no leading 0).
  std::string Integer(const std::string& key, const YAML::Node& value,
                      long long least, long long most) const;
  std::string NonNegativeNumber(const std::string& key,
                                const YAML::Node& value) const;
  bool Boolean(const std::string& key, const YAML::Node& value) const;
  // One of `choices`; `why` explains a value that is not (its key "*": any
  // other value).
  std::string OneOf(const std::string& key, const YAML::Node& value,
                    const std::vector<std::string>& choices,
                    const std::map<std::string, std::string>& why = {}) const;

 private:
  const std::string path_;
};

// The settings of Accelerate's configuration `root` (read from `path`), in
// file order, the later of a key given twice; appends its warnings.
std::vector<ConfigSetting> SettingsFromAccelerateKeys(
    const std::string& path, const YAML::Node& root,
    std::vector<std::string>* warnings);

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
    void Add(const std::string& name);
    bool empty() const { return count == 0; }
    size_t size() const { return count; }
    std::string text() const;
  } ignored;

  void Read(const nlohmann::json& json);

  static bool IsAuto(const nlohmann::json& value);
  void ZeroOptimization(const nlohmann::json& section);
  // fp16 / bf16: {"enabled": true | false | "auto", ...}; its other keys
  // (loss scaling's) are DeepSpeed's.
  bool Enabled(const std::string& key, const nlohmann::json& section);
};

}  // namespace accel::accelerate_yaml_internal
