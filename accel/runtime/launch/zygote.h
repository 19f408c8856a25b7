// Starting ranks by forking a program that has already loaded itself, rather
// than running it again for each rank: a program linking Debian's LibTorch
// spends about 0.75 s of CPU binding ~300 shared libraries before main, and
// N ranks on a 2-core machine paid that N times.
//
//   // Program side (self_launch.cc), after flags are parsed, before any
//   // thread exists:
//   ZygoteStart start = StartZygote(&__dso_handle);
//   if (start.role == ZygoteStart::Role::kRank) return;  // go on as a rank
//   // start.fd >= 0: the launcher asks the zygote for its ranks.
//
//   // Launcher side (launch.cc), a child subreaper:
//   pid_t pid = StartRankFromZygote(zygote_fd, setup, rank, world);
//
// The zygote is a fork of the program, named accel-zygote in ps, with no
// thread and nothing to do but wait on a socket. For each rank it forks
// twice: the middle process exits at once, so the rank is orphaned and the
// kernel hands it to the launcher (PR_SET_CHILD_SUBREAPER), which then
// waits for it, signals it and reaps it exactly as a rank it had exec'd.
// The rank gets what exec would have given it: its own process group, the
// launcher's environment for it, its output pipes (SCM_RIGHTS), rank 0's
// store socket, the program file's name in ps (not a symlink's), exec's
// signal dispositions (default; SIGHUP ignored if it was when the job
// started; a signal sent meanwhile is held, not lost), SIGKILL when the
// launcher dies, the thread counts of OMP_NUM_THREADS and
// OPENBLAS_NUM_THREADS (OpenMP and OpenBLAS read them when loaded, so the
// zygote's values would stick otherwise) and the open-file limit raised.
// Then it returns from StartZygote into main, as if it had just parsed its
// flags. What stays different, as with any fork server: /proc/<pid>/environ
// and cmdline show the program's start (getenv sees the rank's variables);
// threads the program starts itself begin OpenMP with its default count
// rather than OMP_NUM_THREADS (set it in each thread); memory locked
// (mlock) before the fork is not locked in the rank; the ranks share the
// zygote's address layout and stack canary, where exec'd ranks each get
// their own; a rank's orphaned children go to the launcher (a subreaper)
// rather than init; and a restart after the program was rebuilt forks the
// old program, where exec would run the new file.
//
// A forked rank leaves without the destructors of the libraries it shares
// with the zygote: LibTorch's unregister thousands of operator kernels, and
// in a forked process every page they write is copied first (perf: 0.45 s
// of the 0.6 s from a rank's last line to its exit, against 0.05 s in an
// exec'd rank). Python's multiprocessing ends forked children with
// os._exit for the same reason. The program's own destructors and atexit
// functions (its module's, given to StartZygote) still run, as does all
// that is registered after the fork, and stdio, iostreams and glog's files
// are flushed.
//
// The zygote ends when the launcher closes its socket (EndZygote kills it
// if it does not) or dies. Anything
// that fails on the way (a thread already running, ACCEL_ZYGOTE=0, a fork
// or socket error) leaves the launcher to exec the ranks as before.
#pragma once

#include <sys/types.h>

#include <functional>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/launch/rank_processes.h"

namespace accel {

struct ZygoteStart {
  enum class Role {
    kLauncher,  // This process goes on to supervise; fd talks to the zygote.
    kRank,      // A rank forked by the zygote: go on with main.
  };
  Role role = Role::kLauncher;
  int fd = -1;    // -1: no zygote; exec the ranks.
  pid_t pid = 0;  // The zygote, a child of the launcher.
};

// StartRankFromZygote gave up because `give_up` said so (a stop signal).
class ZygoteInterrupted : public Error {
 public:
  using Error::Error;
};

// Forks the zygote. In the launcher, returns the socket (not close-on-exec,
// so that the exec'd supervisor keeps it) or -1; in each rank, returns
// kRank; the zygote itself never returns. `program_module` is the
// program's __dso_handle (see above); null runs every destructor.
ZygoteStart StartZygote(void* program_module);

// Asks the zygote on `fd` for a rank set up as `setup` (env, pipes,
// keep_fd) and returns its pid, by then a child of this process. The caller
// must be a child subreaper (AdoptZygoteRanks). Throws Error when the zygote
// fails, is gone, does not answer in 10 s (stopped, say), or the rank is not
// this process's child; ZygoteInterrupted when `give_up` returns true while
// it waits. A rank the zygote forks but could not report never runs: it
// waits for the zygote's word that the launcher knows it.
pid_t StartRankFromZygote(int fd, const ChildSetup& setup, int rank, int world,
                          const std::function<bool()>& give_up = nullptr);

// Ends the zygote: closes its socket and, if `pid` (> 0) is still this
// process's child, kills and reaps it, so that neither a stopped zygote nor
// its zombie outlives the job's launch.
void EndZygote(int fd, pid_t pid);

// Makes this process the parent of the ranks the zygote forks (a child
// subreaper); false if the kernel refuses.
bool AdoptZygoteRanks();

}  // namespace accel
