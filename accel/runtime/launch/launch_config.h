// The launch configuration file, as `accelerate config` writes and
// `accelerate launch` reads, that the launcher and every accel program
// (InitProgram, also inside its ranks) read before their command line;
// flags given there win. Two formats, told apart by their first line:
// Accelerate's YAML (default_config.yaml; see accelerate_yaml.h for the
// keys), or accel's older flag file, one --flag=value per line (blank
// lines and # comments allowed).
//
//   $ bazel run //tools:config             # asks, writes the default file
//   $ bazel run //examples:train_demo      # now runs --num_processes=2 ...
//   $ bazel run //examples:train_demo -- --config_file=multi_node.yaml
//   $ bazel run //examples:train_demo -- --config_file=   # none at all
//
// Which file: --config_file=PATH when given (empty: none), else
// $ACCEL_CONFIG_FILE when set (empty: none; the launcher sets it for its
// ranks), else DefaultLaunchConfigPath() when that file exists, else
// LegacyLaunchConfigPath() when that one does.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace accel {

// Processes and machines a configuration may ask for (the launcher allows
// fewer per machine): 1,048,576.
inline constexpr long long kMaxLaunchProcesses = 1 << 20;

// "$XDG_CONFIG_HOME/accel/default_config.yaml", else
// "$HOME/.config/accel/default_config.yaml", else "".
std::string DefaultLaunchConfigPath();

// Where accel config wrote before it wrote YAML: the same folder's
// default_config.flags (still read when there is no default_config.yaml).
std::string LegacyLaunchConfigPath();

// The flags a configuration file may set: the launch flags and accel's
// program flags (--num_processes, --backend, --mixed_precision, ...).
const std::vector<std::string>& ConfigurableFlags();

// The file to read for this command line (see above), or "" for none.
// UsageError when --config_file names a file that does not exist.
std::string LaunchConfigPath(int argc, char** argv);

// Reads `path` and makes its values the flags' defaults (the command line,
// parsed afterwards, wins). UsageError naming the file and line for a line
// that is not --flag=value, a flag a configuration may not set, a YAML key
// of the wrong type, or a value the flag rejects. ReadLaunchConfig appends
// the file's warnings (keys that do not apply, unknown keys) to `warnings`;
// ApplyLaunchConfig prints them once per job (see PrintWarningsOnce).
std::vector<std::pair<std::string, std::string>> ReadLaunchConfig(
    const std::string& path, std::vector<std::string>* warnings = nullptr);
// Returns the flags it set (none for an empty path).
std::vector<std::pair<std::string, std::string>> ApplyLaunchConfig(
    const std::string& path);

// After the command line is parsed: what a DeepSpeed JSON configuration
// read by ApplyLaunchConfig decides (the ZeRO stage, accumulation steps,
// clipping) replaces another value given on the command line, with one
// warning per job naming both, as Accelerate's launcher does for the
// accumulation steps; another --mixed_precision than the JSON's is a
// UsageError, as in Accelerate.
void ApplyDecidingSettings();

// The DeepSpeed JSON whose settings ApplyLaunchConfig applied, "" for none.
std::string DeepSpeedJsonApplied();

// Writes `flags` (name, value) as a configuration file, creating its folder,
// atomically: Accelerate's YAML, or the flag file for a path that ends in
// ".flags". UsageError for a flag a configuration may not set.
void WriteLaunchConfig(
    const std::string& path,
    const std::vector<std::pair<std::string, std::string>>& flags);

}  // namespace accel
