#include "accel/runtime/base/process_setup.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

namespace accel {
namespace {

void OpenClosedStandardStreams() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    // open() returns the lowest free descriptor: this one, since the lower
    // ones are open by now.
    const int opened = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (opened >= 0 && opened != fd) {
      dup2(opened, fd);
      close(opened);
    }
  }
}

void IgnoreIfDefault(int signal_number) {
  struct sigaction current {};
  if (sigaction(signal_number, nullptr, &current) != 0) return;
  // A program that handles the signal itself keeps its handler.
  if (current.sa_handler != SIG_DFL || (current.sa_flags & SA_SIGINFO)) return;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(signal_number, &ignore, nullptr);
}

// A SIGCHLD that is ignored (SIG_IGN, or a handler with SA_NOCLDWAIT) makes
// the kernel reap children by itself, and the disposition survives exec: a
// parent that ignored it (a Python script's signal(SIGCHLD, SIG_IGN), some
// daemons) left a launcher unable to learn that its ranks had ended.
void WaitForChildrenAgain() {
  struct sigaction current {};
  if (sigaction(SIGCHLD, nullptr, &current) != 0) return;
  const bool ignored =
      !(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_IGN;
  if (!ignored && !(current.sa_flags & SA_NOCLDWAIT)) return;
  // The default also discards the signal, but leaves the children for
  // waitpid; a program's own handler stays, without SA_NOCLDWAIT.
  struct sigaction restored = current;
  restored.sa_flags &= ~SA_NOCLDWAIT;
  if (ignored) restored.sa_handler = SIG_DFL;
  sigaction(SIGCHLD, &restored, nullptr);
}

const bool kPreparedAtStartup = (PrepareProcess(), true);

}  // namespace

void PrepareProcess() {
  (void)kPreparedAtStartup;
  OpenClosedStandardStreams();
  IgnoreIfDefault(SIGPIPE);
  IgnoreIfDefault(SIGXFSZ);
  WaitForChildrenAgain();
}

}  // namespace accel
