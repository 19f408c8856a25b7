// The launch configuration file, as `accelerate config` writes and
// `accelerate launch` reads: a gflags flag file, one --flag=value per line
// (blank lines and # comments allowed), that the launcher and every accel
// program (InitProgram, also inside its ranks) read before their command
// line; flags given there win.
//
//   $ bazel run //tools:config             # asks, writes the default file
//   $ bazel run //examples:train_demo      # now runs --num_processes=2 ...
//   $ bazel run //examples:train_demo -- --config_file=other.flags
//   $ bazel run //examples:train_demo -- --config_file=   # none at all
//
// Which file: --config_file=PATH when given (empty: none), else
// $ACCEL_CONFIG_FILE when set (empty: none; the launcher sets it for its
// ranks), else DefaultLaunchConfigPath() when that file exists.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace accel {

// "$XDG_CONFIG_HOME/accel/default_config.flags", else
// "$HOME/.config/accel/default_config.flags", else "".
std::string DefaultLaunchConfigPath();

// The flags a configuration file may set: the launch flags and accel's
// program flags (--num_processes, --backend, --mixed_precision, ...).
const std::vector<std::string>& ConfigurableFlags();

// The file to read for this command line (see above), or "" for none.
// UsageError when --config_file names a file that does not exist.
std::string LaunchConfigPath(int argc, char** argv);

// Reads `path` and makes its values the flags' defaults (the command line,
// parsed afterwards, wins). UsageError naming the file and line for a line
// that is not --flag=value, a flag a configuration may not set, or a value
// the flag rejects.
std::vector<std::pair<std::string, std::string>> ReadLaunchConfig(
    const std::string& path);
// Returns the flags it set (none for an empty path).
std::vector<std::pair<std::string, std::string>> ApplyLaunchConfig(
    const std::string& path);

// Writes `flags` (name, value) as a configuration file, creating its folder,
// atomically. UsageError for a flag a configuration may not set.
void WriteLaunchConfig(
    const std::string& path,
    const std::vector<std::pair<std::string, std::string>>& flags);

}  // namespace accel
