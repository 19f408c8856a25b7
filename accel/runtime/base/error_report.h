// Every error a program does not handle ends as one line on stderr and exit
// code 1, on every rank, whatever the exception's type: an accel::Error, a
// LibTorch c10::Error (its backtrace left out), any std::exception, also one
// thrown from a destructor or on another thread.
//
//   int main(int argc, char** argv) {
//     accel::InitProgram(&argc, &argv);   // installs the handler
//     accel::Accelerator accelerator;     // so does this
//     ...                                 // an escaping throw prints
//   }                                     // "error: ..." and exits 1
//
// Linking accel installs the handler before main runs (std::set_terminate);
// RunAndReportErrors (program.h) reports the same way without terminating.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace accel {

// The exception's message on one line: a c10::Error's backtrace and any line
// breaks are dropped.
std::string DescribeException(std::exception_ptr error);

// Writes "error: <message>" (with the rank when several processes run) to
// stderr after flushing stdout.
void ReportException(std::exception_ptr error);

// Makes std::terminate report the exception in flight and exit with code 1.
// Idempotent.
void InstallTerminateHandler();

// The exit code for an error that ends the process: kPeerFailedExitCode
// for a PeerError (another rank failed first), 1 otherwise.
int ExitCodeFor(std::exception_ptr error);

// Called with the one-line message when an error ends the process through
// std::terminate or RunAndReportErrors (after it is printed, before the
// exit): the process group uses it to tell the other ranks why this one
// leaves. Returns an id for RemoveFatalErrorHook. Hooks must be quick and
// must not throw.
int AddFatalErrorHook(std::function<void(const std::string& message)> hook);
void RemoveFatalErrorHook(int id);
// Runs the hooks (once the message is printed).
void RunFatalErrorHooks(const std::string& message);

// While one lives on this thread, an exception that escapes is printed and
// the hooks run by the code that made it (RunAndReportErrors): objects
// destroyed on the way out (the Accelerator) keep the job for that, so
// that this rank's error is on the console before the others learn that
// it left, and the first error line a user sees is the cause.
class ReportingScope {
 public:
  ReportingScope();
  ~ReportingScope();
  ReportingScope(const ReportingScope&) = delete;
  ReportingScope& operator=(const ReportingScope&) = delete;
  // Whether one lives on this thread.
  static bool Active();
};

}  // namespace accel
