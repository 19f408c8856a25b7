#include "accel/runtime/launch/launch_config.h"

#include <gflags/gflags.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/excerpt.h"
#include "accel/runtime/base/files.h"
#include "accel/runtime/launch/accelerate_yaml.h"

namespace accel {
namespace {

constexpr size_t kMaxConfigBytes = 1 << 20;

bool IsConfigurable(const std::string& name) {
  const auto& names = ConfigurableFlags();
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string Listed() {
  std::string text;
  for (const std::string& name : ConfigurableFlags()) {
    text += (text.empty() ? "--" : ", --") + name;
  }
  return text;
}

std::string Trimmed(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t\r") - begin + 1);
}

}  // namespace

namespace {

// $XDG_CONFIG_HOME/accel/NAME, else $HOME/.config/accel/NAME, else "".
std::string ConfigFolderFile(const std::string& name) {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  if (xdg != nullptr && xdg[0] == '/') {
    return std::string(xdg) + "/accel/" + name;
  }
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') {
    return std::string(home) + "/.config/accel/" + name;
  }
  return "";
}

bool EndsWith(const std::string& text, const std::string& end) {
  return text.size() >= end.size() &&
         text.compare(text.size() - end.size(), end.size(), end) == 0;
}

}  // namespace

std::string DefaultLaunchConfigPath() {
  return ConfigFolderFile("default_config.yaml");
}

std::string LegacyLaunchConfigPath() {
  return ConfigFolderFile("default_config.flags");
}

const std::vector<std::string>& ConfigurableFlags() {
  static const std::vector<std::string> names = {
      "num_processes",
      "num_machines",
      "machine_rank",
      "main_process_ip",
      "main_process_port",
      "backend",
      "num_cpu_threads_per_process",
      "max_restarts",
      "signal_grace_s",
      "mixed_precision",
      "gradient_accumulation_steps",
      "gradient_clipping",
      "timeout_s",
      "rendezvous_timeout_s",
      "network_timeout_s",
      "collective_checks",
      "report_to",
      "logging_dir",
      "reuse_host_memory",
      "cpu",
      "zero_stage",
      "invariant_micro_batches",
      "fsdp_transformer_layer_cls_to_wrap",
      "use_fsdp",
      "fsdp_sharding_strategy",
      "use_parallelism_config",
      "fault_tolerance",
      "parallelism_config_dp_replicate_size",
      "parallelism_config_dp_shard_size",
      "parallelism_config_tp_size",
      "parallelism_config_cp_size",
  };
  return names;
}

namespace {

// UsageError unless `path` is a regular file, naming why not.
void RequireConfigFile(const std::string& shown, const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    throw UsageError(shown + ": " + std::strerror(errno) +
                     (errno == ENOENT ? " (write one with accel config, or "
                                        "leave the flag out)"
                                      : ""));
  }
  const std::string why = WhyNotARegularFile(path);
  if (!why.empty()) {
    throw UsageError(shown + ": not a regular file (" + why +
                     "); give a launch configuration file");
  }
}

}  // namespace

std::string LaunchConfigPath(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;  // What follows is another program's.
    for (const char* prefix : {"--config_file=", "-config_file="}) {
      if (arg.rfind(prefix, 0) == 0) {
        const std::string path = arg.substr(std::string(prefix).size());
        if (!path.empty()) RequireConfigFile("--config_file=" + path, path);
        return path;
      }
    }
    if ((arg == "--config_file" || arg == "-config_file") && i + 1 < argc) {
      const std::string path = argv[i + 1];
      RequireConfigFile("--config_file " + path, path);
      return path;
    }
  }
  if (const char* from_env = std::getenv("ACCEL_CONFIG_FILE")) {
    // The launcher's choice, or "" for none.
    if (from_env[0] != '\0') {
      RequireConfigFile(std::string("ACCEL_CONFIG_FILE=") + from_env, from_env);
    }
    return from_env;
  }
  for (const std::string& path :
       {DefaultLaunchConfigPath(), LegacyLaunchConfigPath()}) {
    if (!path.empty() && IsFile(path)) return path;
  }
  return "";
}

namespace {

struct ConfigLine {
  std::string name;
  std::string value;
  int number;              // 1 for the file's first line.
  std::string decided_by;  // See ConfigSetting.
};

// What a DeepSpeed JSON configuration decides, for ApplyDecidingSettings.
std::vector<ConfigLine>& Decided() {
  static std::vector<ConfigLine> decided;
  return decided;
}

std::string ReadConfigText(const std::string& path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) throw UsageError("cannot read the configuration file " + path);
  // A configuration is a few lines; anything this big is another file.
  const std::streamoff size = file.tellg();
  if (size > static_cast<std::streamoff>(kMaxConfigBytes)) {
    throw UsageError(
        "the configuration file " + path + " is " + std::to_string(size) +
        " bytes; a launch configuration "
        "(a few lines of YAML or --flag=value) has at most " +
        std::to_string(kMaxConfigBytes) + ": is it the right file?");
  }
  file.seekg(0);
  std::string text(static_cast<size_t>(size), '\0');
  file.read(text.data(), size);
  return text;
}

// UsageError naming the line of the first control byte (a NUL would end a
// value where gflags or YAML reads it, silently; others garble a terminal)
// or of the first bytes that are not UTF-8.
void RequireText(const std::string& path, const std::string& text) {
  std::istringstream lines(text);
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    for (const char c : line) {
      const auto byte = static_cast<unsigned char>(c);
      if ((byte < 0x20 && c != '\t' && c != '\r') || byte == 0x7f) {
        throw UsageError(path + ":" + std::to_string(number) +
                         ": a control byte in " + Excerpt(Trimmed(line)) +
                         "; a configuration holds lines of text");
      }
    }
    if (!IsUtf8(line)) {
      throw UsageError(path + ":" + std::to_string(number) +
                       ": bytes that are not UTF-8 in " +
                       Excerpt(Trimmed(line)) +
                       "; a configuration holds lines of text");
    }
  }
}

// A value as it is after decoding: no control byte (tabs neither), UTF-8.
void RequirePrintable(const std::string& path, int line,
                      const std::string& name, const std::string& value) {
  const bool control = std::any_of(value.begin(), value.end(), [](char c) {
    const auto byte = static_cast<unsigned char>(c);
    return byte < 0x20 || byte == 0x7f;
  });
  if (!control && IsUtf8(value)) return;
  throw UsageError(path + ":" + std::to_string(line) + ": " + name + ": " +
                   Excerpt(value) +
                   (control ? " holds a control character"
                            : " holds bytes that are not UTF-8") +
                   " (after YAML's escapes); a setting is one line of text");
}

std::vector<ConfigLine> ParseFlagLines(const std::string& path,
                                       const std::string& text) {
  std::istringstream lines(text);
  std::vector<ConfigLine> flags;
  int number = 0;
  for (std::string raw; std::getline(lines, raw);) {
    ++number;
    const std::string line = Trimmed(raw);
    if (line.empty() || line[0] == '#') continue;
    const std::string where = path + ":" + std::to_string(number) + ": ";
    const size_t equals = line.find('=');
    // A boolean flag alone is true, as on the command line (--use_fsdp).
    gflags::CommandLineFlagInfo info;
    const bool bare_boolean =
        line.rfind("--", 0) == 0 && equals == std::string::npos &&
        gflags::GetCommandLineFlagInfo(line.substr(2).c_str(), &info) &&
        info.type == "bool";
    if (line.rfind("--", 0) != 0 ||
        (equals == std::string::npos && !bare_boolean)) {
      throw UsageError(where + "expected --flag=value, found " + Excerpt(line));
    }
    const std::string name =
        bare_boolean ? line.substr(2) : line.substr(2, equals - 2);
    const std::string value = bare_boolean ? "true" : line.substr(equals + 1);
    if (!IsConfigurable(name)) {
      throw UsageError(where + Shown("--" + name) +
                       " cannot be set in a configuration file; it takes " +
                       Listed());
    }
    flags.push_back({name, value, number});
  }
  return flags;
}

// The file's flags, whichever of the two formats it is in.
std::vector<ConfigLine> ReadNumberedLines(const std::string& path,
                                          std::vector<std::string>* warnings) {
  const std::string text = ReadConfigText(path);
  RequireText(path, text);
  if (IsFlagFileText(text)) return ParseFlagLines(path, text);
  std::vector<ConfigLine> flags;
  for (ConfigSetting& setting :
       SettingsFromAccelerateYaml(path, text, warnings)) {
    // YAML's escapes ("\e[31m", "\n") decode to bytes the raw text check
    // cannot see: a value that reaches a message must not forge lines or
    // colour the terminal.
    RequirePrintable(path, setting.line, setting.name, setting.value);
    flags.push_back(
        {setting.name, setting.value, setting.line, setting.decided_by});
  }
  return flags;
}

// Warnings once per job: by the launcher or a program started alone, or by
// rank 0 of a job that another launcher (torchrun, srun) started.
void PrintWarningsOnce(const std::string& path,
                       const std::vector<std::string>& warnings) {
  const char* warned = std::getenv("ACCEL_CONFIG_WARNED");
  const char* rank = std::getenv("RANK");
  const bool printed = warned != nullptr && path == warned;
  if (!printed && (rank == nullptr || std::string(rank) == "0")) {
    for (const std::string& warning : warnings) {
      std::fprintf(stderr, "accel: warning: %s\n", warning.c_str());
    }
  }
  setenv("ACCEL_CONFIG_WARNED", path.c_str(), /*overwrite=*/1);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> ReadLaunchConfig(
    const std::string& path, std::vector<std::string>* warnings) {
  std::vector<std::string> ignored;
  std::vector<std::pair<std::string, std::string>> flags;
  for (const ConfigLine& line :
       ReadNumberedLines(path, warnings != nullptr ? warnings : &ignored)) {
    flags.emplace_back(line.name, line.value);
  }
  return flags;
}

std::vector<std::pair<std::string, std::string>> ApplyLaunchConfig(
    const std::string& path) {
  std::vector<std::pair<std::string, std::string>> applied;
  if (path.empty()) return applied;
  std::vector<std::string> warnings;
  const std::vector<ConfigLine> lines = ReadNumberedLines(path, &warnings);
  PrintWarningsOnce(path, warnings);
  for (const auto& [name, value, number, decided_by] : lines) {
    if (!decided_by.empty())
      Decided().push_back({name, value, number, decided_by});
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
      continue;  // A program that does not link that part of accel.
    }
    if (gflags::SetCommandLineOptionWithMode(name.c_str(), value.c_str(),
                                             gflags::SET_FLAGS_DEFAULT)
            .empty()) {
      throw UsageError(path + ":" + std::to_string(number) + ": " +
                       Shown("--" + name + "=" + value) + ": not a valid " +
                       info.type + " value");
    }
    applied.emplace_back(name, value);
  }
  return applied;
}

namespace {

bool SameValue(const std::string& a, const std::string& b) {
  if (a == b) return true;
  char* end_a = nullptr;
  char* end_b = nullptr;
  const double x = std::strtod(a.c_str(), &end_a);
  const double y = std::strtod(b.c_str(), &end_b);
  return !a.empty() && !b.empty() && *end_a == '\0' && *end_b == '\0' && x == y;
}

// "--zero_stage=2 --gradient_accumulation_steps=4 from ds.json": what the
// DeepSpeed JSON set, whatever the command line said.
std::string DecidedSettingsNote() {
  std::string note;
  for (const ConfigLine& decided : Decided()) {
    note += "--" + decided.name + "=" + decided.value + " ";
  }
  if (note.empty()) return note;
  return note + "from " + DeepSpeedJsonApplied();
}

}  // namespace

std::string DeepSpeedJsonApplied() {
  return Decided().empty() ? "" : Decided().front().decided_by;
}

void ApplyDecidingSettings() {
  std::vector<std::string> warnings;
  for (const ConfigLine& decided : Decided()) {
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(decided.name.c_str(), &info) ||
        info.is_default || SameValue(info.current_value, decided.value)) {
      continue;
    }
    if (decided.name == "mixed_precision") {
      // Accelerate refuses this pair too ("--mixed_precision arg cannot be
      // set to bf16 when fp16 is set in the DeepSpeed config file").
      throw UsageError("--mixed_precision=" + Shown(info.current_value) +
                       " (the command line) disagrees with " +
                       decided.decided_by + ", which enables " + decided.value +
                       ": give one");
    }
    warnings.push_back("--" + decided.name + "=" + Shown(info.current_value) +
                       " (the command line) gives way to " + decided.value +
                       " from " + decided.decided_by +
                       ": DeepSpeed's configuration decides it");
    gflags::SetCommandLineOption(decided.name.c_str(), decided.value.c_str());
  }
  const std::string note = DecidedSettingsNote();
  if (note.empty()) return;
  // Once per job: the process that starts the ranks, or a rank 0 that
  // another launcher started; the ranks it starts inherit the mark.
  const char* rank = std::getenv("RANK");
  if (std::getenv("ACCEL_DECIDED_WARNED") == nullptr &&
      (rank == nullptr || std::string(rank) == "0")) {
    std::fprintf(stderr, "accel: note: %s\n", note.c_str());
    for (const std::string& warning : warnings) {
      std::fprintf(stderr, "accel: warning: %s\n", warning.c_str());
    }
  }
  setenv("ACCEL_DECIDED_WARNED", "1", /*overwrite=*/1);
}

void WriteLaunchConfig(
    const std::string& path,
    const std::vector<std::pair<std::string, std::string>>& flags) {
  const bool flag_file = EndsWith(path, ".flags");
  std::string text =
      flag_file
          ? "# accel launch configuration (written by accel config). Read by "
            "the\n# launcher and every accel program before its command line, "
            "whose\n# flags win. One --flag=value per line.\n"
          : "# accel launch configuration (written by accel config) in "
            "Accelerate's\n# format. Read by the launcher and every accel "
            "program before its\n# command line, whose flags win.\n";
  for (const auto& [name, value] : flags) {
    if (!IsConfigurable(name)) {
      throw UsageError("--" + name +
                       " cannot be set in a configuration file; it takes " +
                       Listed());
    }
    if (value.find('\n') != std::string::npos) {
      throw UsageError("--" + name + ": a value cannot span lines");
    }
    if (flag_file) text += "--" + name + "=" + value + "\n";
  }
  if (!flag_file) text += AccelerateYamlFromFlags(flags);
  try {
    MakeDirectories(FolderOf(path));
    WriteFileAtomically(path, text);
  } catch (const CheckpointError& e) {
    throw UsageError(std::string("cannot write the configuration: ") +
                     e.what());
  }
}

}  // namespace accel
