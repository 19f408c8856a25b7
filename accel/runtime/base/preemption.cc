#include "accel/runtime/base/preemption.h"

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <mutex>

namespace accel {
namespace {

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2};

std::atomic<bool> g_handling{false};
std::atomic<int> g_pending{0};

// Dies of the signal as if no handler had been there. The signal is blocked
// while the handler runs, so it arrives as the handler returns.
void DieOf(int signal_number) {
  signal(signal_number, SIG_DFL);
  raise(signal_number);
}

void OnStopSignal(int signal_number) {
  if (!g_handling.load()) {
    DieOf(signal_number);
    return;
  }
  int none = 0;
  if (!g_pending.compare_exchange_strong(none, signal_number)) {
    DieOf(signal_number);
  }
}

}  // namespace

void InstallPreemptionHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int signal_number : kStopSignals) {
      struct sigaction current {};
      if (sigaction(signal_number, nullptr, &current) != 0) continue;
      if (current.sa_handler != SIG_DFL || (current.sa_flags & SA_SIGINFO)) {
        continue;  // The program's own handler, or nohup's SIG_IGN.
      }
      struct sigaction action {};
      action.sa_handler = OnStopSignal;
      action.sa_flags = SA_RESTART;
      sigemptyset(&action.sa_mask);
      sigaction(signal_number, &action, nullptr);
    }
  });
}

void StartHandlingPreemption() { g_handling = true; }

int PendingPreemptionSignal() { return g_pending.load(); }

const char* SignalName(int signal_number) {
  switch (signal_number) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGKILL:
      return "SIGKILL";
    case SIGPIPE:
      return "SIGPIPE";
    default: {
      thread_local char text[24];
      std::snprintf(text, sizeof(text), "signal %d", signal_number);
      return text;
    }
  }
}

}  // namespace accel
