// An empty program, linked with LibTorch or not (see BUILD.bazel), for
// //tools/bench:startup: its run time and peak memory are what starting a
// process and loading the library cost before any accel code runs.
#include <cstdio>
#include <cstring>

int main() {
  FILE* status = std::fopen("/proc/self/status", "r");
  char line[256];
  while (status != nullptr && std::fgets(line, sizeof(line), status)) {
    if (std::strncmp(line, "VmHWM:", 6) == 0) std::fputs(line, stdout);
  }
  return 0;
}
