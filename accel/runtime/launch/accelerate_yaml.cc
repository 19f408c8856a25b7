#include "accel/runtime/launch/accelerate_yaml.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/excerpt.h"
#include "accel/runtime/launch/accelerate_yaml_internal.h"
#include "accel/runtime/launch/launch_config.h"

namespace accel {
namespace accelerate_yaml_internal {

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

std::string YamlValueReader::Where(const YAML::Node& node) const {
  return path_ + ":" + std::to_string(node.Mark().line + 1) + ": ";
}

std::string YamlValueReader::Key(const YAML::Node& key) const {
  if (!key.IsScalar()) {
    throw UsageError(Where(key) + "expected a key, found " + KindOf(key));
  }
  return key.Scalar();
}

std::string YamlValueReader::Scalar(const std::string& key,
                                    const YAML::Node& value) const {
  if (!value.IsScalar()) {
    throw UsageError(Where(value) + key + ": expected a value, found " +
                     KindOf(value));
  }
  return value.Scalar();
}

std::string YamlValueReader::Integer(const std::string& key,
                                     const YAML::Node& value, long long least,
                                     long long most) const {
  const std::string text = Scalar(key, value);
  char* end = nullptr;
  errno = 0;
  const long long number = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 ||
      !std::isdigit(static_cast<unsigned char>(text[0]))) {
    throw UsageError(Where(value) + key + ": expected a whole number, found " +
                     Excerpt(text));
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

std::string YamlValueReader::NonNegativeNumber(const std::string& key,
                                               const YAML::Node& value) const {
  const std::string text = Scalar(key, value);
  char* end = nullptr;
  errno = 0;
  const double number = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !(number >= 0) ||
      !std::isfinite(number)) {
    throw UsageError(Where(value) + key +
                     ": expected a number, 0 or above, found " + Excerpt(text));
  }
  return text;
}

bool YamlValueReader::Boolean(const std::string& key,
                              const YAML::Node& value) const {
  std::string text = Scalar(key, value);
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (text == "true" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "no" || text == "off") return false;
  throw UsageError(Where(value) + key + ": expected true or false, found " +
                   Excerpt(value.Scalar()));
}

std::string YamlValueReader::OneOf(
    const std::string& key, const YAML::Node& value,
    const std::vector<std::string>& choices,
    const std::map<std::string, std::string>& why) const {
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

std::string YamlValueReader::At(int line) const {
  return path_ + ":" + std::to_string(line) + ": ";
}

}  // namespace accelerate_yaml_internal

namespace {

using accelerate_yaml_internal::IsAccelFlag;

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
    settings = accelerate_yaml_internal::SettingsFromAccelerateKeys(path, root,
                                                                    warnings);
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

}  // namespace accel
