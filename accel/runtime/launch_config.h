// Where `accel config` keeps the default launch configuration: a gflags flag
// file (one --flag=value per line) that the launcher and self-launching
// programs read before their command line, as `accelerate launch` reads
// `accelerate config`'s file.
//
//   accel::DefaultLaunchConfigPath()
//       // "$XDG_CONFIG_HOME/accel/default_config.flags", else
//       // "$HOME/.config/accel/default_config.flags", else "".
#pragma once

#include <string>

namespace accel {

std::string DefaultLaunchConfigPath();

}  // namespace accel
