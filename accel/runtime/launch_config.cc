#include "accel/runtime/launch_config.h"

#include <cstdlib>

namespace accel {

std::string DefaultLaunchConfigPath() {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  if (xdg != nullptr && xdg[0] == '/') {
    return std::string(xdg) + "/accel/default_config.flags";
  }
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') {
    return std::string(home) + "/.config/accel/default_config.flags";
  }
  return "";
}

}  // namespace accel
