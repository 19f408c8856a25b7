#include "accel/runtime/base/error_report.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"

namespace accel {
namespace {

std::string OneLine(std::string text) {
  // LibTorch appends "\nException raised from <where> (most recent call
  // first):\nframe #0: ..." to c10::Error's message.
  const size_t backtrace = text.find("\nException raised from");
  if (backtrace != std::string::npos) text.resize(backtrace);
  for (char& c : text) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

// "[rank 1/2] " when several processes run and the message does not say
// which rank it comes from already.
std::string RankPrefix(const std::string& message) {
  const std::string mine = RankLabel();
  if (mine.empty() || message.find(mine) != std::string::npos) return "";
  return "[" + mine + "] ";
}

struct FatalHooks {
  std::mutex mutex;
  std::map<int, std::function<void(const std::string&)>> hooks;
  int next_id = 0;
};

FatalHooks& Hooks() {
  static FatalHooks* hooks = new FatalHooks();  // Never destroyed.
  return *hooks;
}

thread_local int g_reporting_scopes = 0;

[[noreturn]] void TerminateWithReport() {
  int code = 1;
  if (std::exception_ptr error = std::current_exception()) {
    ReportException(error);
    RunFatalErrorHooks(DescribeException(error));
    code = ExitCodeFor(error);
  } else {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "error: the program called std::terminate without an "
                 "exception (for example a joinable std::thread was "
                 "destroyed)\n");
  }
  std::fflush(stderr);
  // Not exit(): other threads may still hold locks that static destructors
  // would need.
  std::_Exit(code);
}

const bool kInstalledAtStartup = (InstallTerminateHandler(), true);

}  // namespace

std::string DescribeException(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    std::string message = OneLine(e.what());
    return message.empty() ? "unknown error (an exception with no message)"
                           : message;
  } catch (const std::string& s) {
    return OneLine(s);
  } catch (const char* s) {
    return OneLine(s);
  } catch (...) {
    return "unknown error (an exception that is not a std::exception)";
  }
}

void ReportException(std::exception_ptr error) {
  const std::string message = DescribeException(error);
  std::fflush(stdout);
  std::fflush(stderr);
  // One write: ranks that fail together share a console, and stdio may
  // write a long line in pieces that interleave with another rank's.
  const std::string line = "error: " + RankPrefix(message) + message + "\n";
  size_t written = 0;
  while (written < line.size()) {
    const ssize_t n =
        write(STDERR_FILENO, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // A closed console: nothing more to do.
    written += static_cast<size_t>(n);
  }
}

int AddFatalErrorHook(std::function<void(const std::string& message)> hook) {
  FatalHooks& fatal = Hooks();
  std::lock_guard<std::mutex> lock(fatal.mutex);
  const int id = fatal.next_id++;
  fatal.hooks[id] = std::move(hook);
  return id;
}

void RemoveFatalErrorHook(int id) {
  FatalHooks& fatal = Hooks();
  std::lock_guard<std::mutex> lock(fatal.mutex);
  fatal.hooks.erase(id);
}

void RunFatalErrorHooks(const std::string& message) {
  FatalHooks& fatal = Hooks();
  // try_lock: a terminate inside a hook must not deadlock here.
  if (!fatal.mutex.try_lock()) return;
  for (auto& [id, hook] : fatal.hooks) {
    try {
      hook(message);
    } catch (...) {
    }
  }
  fatal.mutex.unlock();
}

int ExitCodeFor(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const PeerError&) {
    return kPeerFailedExitCode;
  } catch (...) {
    return 1;
  }
}

ReportingScope::ReportingScope() { ++g_reporting_scopes; }
ReportingScope::~ReportingScope() { --g_reporting_scopes; }
bool ReportingScope::Active() { return g_reporting_scopes > 0; }

void InstallTerminateHandler() {
  static std::once_flag once;
  std::call_once(once, [] { std::set_terminate(TerminateWithReport); });
  (void)kInstalledAtStartup;
}

}  // namespace accel
