#include "accel/runtime/base/startup_trace.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace accel {
namespace {

// This process's peak resident memory so far, in kB (0 if unknown).
long PeakResidentKb() {
  FILE* status = std::fopen("/proc/self/status", "r");
  if (status == nullptr) return 0;
  char line[256];
  long kb = 0;
  while (std::fgets(line, sizeof(line), status) != nullptr) {
    if (std::strncmp(line, "VmHWM:", 6) == 0) {
      kb = std::strtol(line + 6, nullptr, 10);
      break;
    }
  }
  std::fclose(status);
  return kb;
}

}  // namespace

void TraceStartup(const char* event) {
  static const char* const path = std::getenv("ACCEL_STARTUP_TRACE");
  if (path == nullptr || *path == '\0') return;
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  const char* rank = std::getenv("RANK");
  char line[160];
  const int n = std::snprintf(
      line, sizeof(line), "%s %s %lld %ld\n", event,
      rank != nullptr && *rank != '\0' ? rank : "-1",
      static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec,
      PeakResidentKb());
  // One write() per line under O_APPEND: the ranks' lines never interleave.
  const int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  if (n > 0) (void)!write(fd, line, static_cast<size_t>(n));
  close(fd);
}

}  // namespace accel
