#include "accel/runtime/launch/zygote.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"
#include "accel/runtime/env/env_value.h"

// glibc's: runs the destructors and atexit functions one module registered.
extern "C" void __cxa_finalize(void* module);

namespace accel {
namespace {

// What a request carries besides its text: which of the three descriptors
// come with it, in this order.
enum Passed { kOut, kErr, kKeep, kPassedCount };

// The largest request: a rank's environment is a dozen short variables.
constexpr size_t kMaxRequest = 64 * 1024;

// The signals the launcher catches and passes on (launch.cc). The zygote
// ignores them (the launcher decides what a Ctrl-C means); a rank gets what
// exec would have given it: the default, but for a SIGHUP that was ignored
// when the job started (nohup), which the launcher leaves ignored.
constexpr int kHeldSignals[] = {SIGINT,  SIGTERM, SIGHUP,
                                SIGQUIT, SIGUSR1, SIGUSR2};

// How long the launcher waits for the zygote's answer before it execs the
// rank instead: a fork takes milliseconds, so this is a zygote stopped or
// stuck.
constexpr auto kAnswerTimeout = std::chrono::seconds(10);

struct ZygoteState {
  int socket = -1;
  void* program_module = nullptr;
  pid_t launcher = 0;
  char name[16] = {};           // The program's name in ps (comm).
  bool hangup_ignored = false;  // SIGHUP was ignored when the job started.
  sigset_t mask{};              // The program's signal mask, as exec keeps it.
};

// The name exec gives a process in ps: its file's, not a symlink's.
void ExecutableName(char (&name)[16]) {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return;
  std::string file(path, static_cast<size_t>(n));
  const std::string deleted = " (deleted)";  // Rebuilt while running.
  if (file.size() > deleted.size() &&
      file.compare(file.size() - deleted.size(), deleted.size(), deleted) ==
          0) {
    file.resize(file.size() - deleted.size());
  }
  file = file.substr(file.rfind('/') + 1);
  std::snprintf(name, sizeof(name), "%s", file.c_str());
}

// Blocks the held signals, keeping the mask they had: a rank holds any
// sent to it while it still ignores them, and they arrive once it has
// exec's dispositions and the program's mask back.
void BlockHeldSignals(sigset_t* mask) {
  sigset_t held;
  sigemptyset(&held);
  for (const int signal_number : kHeldSignals) sigaddset(&held, signal_number);
  sigprocmask(SIG_BLOCK, &held, mask);
}

int ThreadCount() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int count = 0;
  while (dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
  closedir(dir);
  return count;
}

// OpenBLAS's idle workers, stopped (see ThreadsOfOurOwn); no-op without it.
void StopBlasWorkers() {
  if (void* stop = dlsym(RTLD_DEFAULT, "blas_thread_shutdown_")) {
    reinterpret_cast<int (*)()>(stop)();
  }
}

// The threads of this process once the known idle ones are stopped.
// OpenBLAS's pthread build (Debian's) starts its workers when loaded; it
// stops them itself before a fork (pthread_atfork) and starts them again
// when next needed, so stopping them first is safe. A thread that has been
// joined may stay listed for a moment.
int ThreadsOfOurOwn() {
  StopBlasWorkers();
  int threads = ThreadCount();
  for (int i = 0; i < 100 && threads > 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    threads = ThreadCount();
  }
  return threads;
}

struct Reply {
  pid_t pid;
  int error;  // errno of the fork that failed; 0 when pid is the rank.
};

// The launcher's answer to a Reply with a pid (LauncherTookRank).
constexpr char kTaken = 't';

bool WriteAll(int fd, const void* data, size_t size) {
  const char* at = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = write(fd, at, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// The first of `variables` that holds a positive count, as OpenMP and
// OpenBLAS read them (0 or a non-number passes to the next); 0 if none.
int ThreadCountFrom(std::initializer_list<const char*> variables) {
  for (const char* variable : variables) {
    const char* text = std::getenv(variable);
    if (text != nullptr && std::atoi(text) > 0) return std::atoi(text);
  }
  return 0;
}

// The CPUs this process may run on: OpenBLAS caps a count from the
// environment there when it loads (its setter does not).
int UsableCpuCount() {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return 0;
  return CPU_COUNT(&allowed);
}

// Calls `function(threads)` if this process has it and threads > 0.
void SetThreads(const char* function, int threads) {
  if (threads < 1) return;
  if (void* symbol = dlsym(RTLD_DEFAULT, function)) {
    reinterpret_cast<void (*)(int)>(symbol)(threads);
  }
}

// OpenMP and OpenBLAS read their thread counts when they are loaded, which
// for a forked rank was in the zygote, before the launcher's values existed:
// each is told again, from the variables it reads itself, in its order.
// Looked up at run time: accel's runtime links neither. OpenBLAS starts its
// workers again when told a count; they would idle until the rank exits,
// which then waits for them (0.6 s measured), so they are stopped again:
// OpenBLAS starts them when it next needs them, as after a fork.
void ApplyThreadCount() {
  SetThreads("omp_set_num_threads", ThreadCountFrom({"OMP_NUM_THREADS"}));
  int blas = ThreadCountFrom(
      {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"});
  if (const int cpus = UsableCpuCount(); cpus > 0) blas = std::min(blas, cpus);
  SetThreads("openblas_set_num_threads", blas);
  StopBlasWorkers();
}

// A forked rank's exit (see zygote.h): the program's destructors, buffers
// flushed, and not LibTorch's destructors.
void FinishForkedRank(int status, void* program_module) {
  __cxa_finalize(program_module);
  std::cout.flush();
  std::cerr.flush();
  std::clog.flush();
  google::FlushLogFiles(google::GLOG_INFO);
  std::fflush(nullptr);
  // LeakSanitizer checks from an exit handler of its own module, skipped
  // here: ask for the check (it exits non-zero on a leak).
  if (void* check = dlsym(RTLD_DEFAULT, "__lsan_do_leak_check")) {
    reinterpret_cast<void (*)()>(check)();
  }
  _exit(status);
}

// In the rank, once the middle process has exited: waits for the zygote's
// word that the launcher tracks its pid (`go`: EOF means the zygote died or
// the launcher gave up on it and will exec this rank instead), and to be
// the launcher's child; then becomes what exec would have made it.
void BecomeRank(const ZygoteState& zygote, pid_t middle, int go,
                const std::vector<std::string>& fields, const int* fds) {
  close(zygote.socket);
  setpgid(0, 0);
  char word = 0;
  ssize_t got;
  do {
    got = read(go, &word, 1);
  } while (got < 0 && errno == EINTR);
  close(go);
  if (got != 1) _exit(1);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (getppid() == middle && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  // Not the launcher's: it died, or is no subreaper; it could never reap us.
  if (getppid() != zygote.launcher) _exit(1);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != zygote.launcher) _exit(1);
  for (const int signal_number : kHeldSignals) {
    const bool ignored = signal_number == SIGHUP && zygote.hangup_ignored;
    signal(signal_number, ignored ? SIG_IGN : SIG_DFL);
  }
  prctl(PR_SET_NAME, zygote.name);
  // fields: flags, keep_fd_variable, then KEY=VALUE.
  for (size_t i = 2; i < fields.size(); ++i) {
    const size_t equals = fields[i].find('=');
    if (equals == std::string::npos) continue;
    setenv(fields[i].substr(0, equals).c_str(),
           fields[i].substr(equals + 1).c_str(), 1);
  }
  if (fds[kKeep] >= 0) {
    fcntl(fds[kKeep], F_SETFD, 0);  // As inherited across exec.
    if (!fields[1].empty()) {
      setenv(fields[1].c_str(), std::to_string(fds[kKeep]).c_str(), 1);
    }
  }
  std::fflush(stdout);
  std::fflush(stderr);
  for (const int target : {1, 2}) {
    const int fd = fds[target == 1 ? kOut : kErr];
    if (fd < 0) continue;
    dup2(fd, target);
    close(fd);
  }
  ApplyThreadCount();
  RaiseOpenFileLimit();
  if (zygote.program_module != nullptr) {
    on_exit(FinishForkedRank, zygote.program_module);
  }
  sigprocmask(SIG_SETMASK, &zygote.mask, nullptr);
}

// Reads one request; false at the launcher's end (EOF or an error).
bool ReadRequest(int socket, std::vector<std::string>* fields, int* fds) {
  std::vector<char> data(kMaxRequest);
  iovec io{data.data(), data.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kPassedCount)];
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  std::vector<int> received;
  for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr;
       c = CMSG_NXTHDR(&message, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const int* at = reinterpret_cast<const int*>(CMSG_DATA(c));
    received.insert(received.end(), at, at + count);
  }
  fields->clear();
  for (size_t start = 0; start < static_cast<size_t>(n);) {
    const size_t end =
        std::find(data.begin() + start, data.begin() + n, '\0') - data.begin();
    fields->emplace_back(data.data() + start, end - start);
    start = end + 1;
  }
  size_t next = 0;
  for (int i = 0; i < kPassedCount; ++i) {
    const bool sent = !fields->empty() && (*fields)[0].size() == kPassedCount &&
                      (*fields)[0][i] == '1';
    fds[i] = sent && next < received.size() ? received[next++] : -1;
  }
  for (; next < received.size(); ++next) close(received[next]);
  return fields->size() >= 2;
}

// The launcher's acknowledgement that it has the rank's pid and tracks it.
// A launcher that gave up on this answer (a timeout) never sends it: it
// kills the zygote, and the rank, told nothing, exits.
bool LauncherTookRank(int socket) {
  char ack = 0;
  ssize_t n;
  do {
    n = recv(socket, &ack, 1, 0);
  } while (n < 0 && errno == EINTR);
  return n == 1 && ack == kTaken;
}

// Forks a rank for one request; returns true in the rank, false in the
// zygote once it has answered. The rank goes on only when the zygote has
// told the launcher its pid (`go`), so that no rank runs unknown to it.
bool ForkRank(ZygoteState& zygote, const std::vector<std::string>& fields,
              const int* fds) {
  int pid_pipe[2] = {-1, -1};
  int go[2] = {-1, -1};
  Reply reply{-1, 0};
  if (pipe2(pid_pipe, O_CLOEXEC) != 0 || pipe2(go, O_CLOEXEC) != 0) {
    reply.error = errno;
  } else {
    const pid_t middle = fork();
    if (middle == 0) {
      const pid_t self = getpid();
      const pid_t rank = fork();
      if (rank == 0) {
        close(pid_pipe[0]);
        close(pid_pipe[1]);
        close(go[1]);
        BecomeRank(zygote, self, go[0], fields, fds);
        return true;
      }
      const Reply mine{rank, rank < 0 ? errno : 0};
      WriteAll(pid_pipe[1], &mine, sizeof(mine));
      _exit(0);
    }
    close(pid_pipe[1]);  // EOF, should the middle process die.
    pid_pipe[1] = -1;
    if (middle < 0) {
      reply.error = errno;
    } else {
      ssize_t n;
      do {
        n = read(pid_pipe[0], &reply, sizeof(reply));
      } while (n < 0 && errno == EINTR);
      if (n != sizeof(reply)) reply = {-1, ECHILD};
      // Once the middle process is reaped, the rank is the launcher's.
      while (waitpid(middle, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  }
  for (const int fd : {pid_pipe[0], pid_pipe[1], go[0]}) {
    if (fd >= 0) close(fd);
  }
  for (int i = 0; i < kPassedCount; ++i) {
    if (fds[i] >= 0) close(fds[i]);
  }
  if (WriteAll(zygote.socket, &reply, sizeof(reply)) && reply.pid > 0 &&
      LauncherTookRank(zygote.socket)) {
    WriteAll(go[1], "g", 1);
  }
  if (go[1] >= 0) close(go[1]);
  return false;
}

// The zygote's loop: a rank per request. Returns only in a rank.
void Serve(ZygoteState& zygote) {
  std::vector<std::string> fields;
  int fds[kPassedCount];
  while (ReadRequest(zygote.socket, &fields, fds)) {
    if (ForkRank(zygote, fields, fds)) return;
  }
  _exit(0);
}

}  // namespace

ZygoteStart StartZygote(void* program_module) {
  ZygoteStart start;
  if (!EnvSwitch("ACCEL_ZYGOTE").value_or(true)) return start;
  // fork() copies only the calling thread: with others running, a lock one
  // of them held would stay locked in every rank.
  const int threads = ThreadsOfOurOwn();
  if (threads != 1) {
    ACCEL_VLOG(1) << "launch: " << threads
                  << " threads before the ranks start; exec'ing them instead "
                     "of forking";
    return start;
  }
  int sockets[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets) != 0) {
    return start;
  }
  ZygoteState zygote;
  zygote.socket = sockets[1];
  zygote.program_module = program_module;
  zygote.launcher = getpid();
  ExecutableName(zygote.name);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(sockets[0]);
    close(sockets[1]);
    return start;
  }
  if (pid == 0) {
    close(sockets[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != zygote.launcher) _exit(0);
    prctl(PR_SET_NAME, "accel-zygote");
    zygote.hangup_ignored = signal(SIGHUP, SIG_IGN) == SIG_IGN;
    for (const int signal_number : kHeldSignals) signal(signal_number, SIG_IGN);
    // Inherited by each rank, which unblocks them once it has exec's
    // dispositions (BecomeRank).
    BlockHeldSignals(&zygote.mask);
    Serve(zygote);  // Returns only in a rank.
    start.role = ZygoteStart::Role::kRank;
    return start;
  }
  close(sockets[1]);
  fcntl(sockets[0], F_SETFD, 0);  // The exec'd supervisor keeps it.
  start.fd = sockets[0];
  start.pid = pid;
  return start;
}

bool AdoptZygoteRanks() { return prctl(PR_SET_CHILD_SUBREAPER, 1) == 0; }

void EndZygote(int fd, pid_t pid) {
  if (fd >= 0) close(fd);
  // Only while it is still our child: once reaped, its pid may be another's.
  if (pid > 0 && waitpid(pid, nullptr, WNOHANG) == 0) {
    kill(pid, SIGKILL);
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

// Waits for the zygote's answer on `fd`; false when `give_up` says so or
// kAnswerTimeout has passed.
bool AwaitAnswer(int fd, const std::function<bool()>& give_up,
                 const std::string& who) {
  const auto deadline = std::chrono::steady_clock::now() + kAnswerTimeout;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd ready{fd, POLLIN, 0};
    if (poll(&ready, 1, 100) > 0) return true;
    if (give_up && give_up()) {
      throw ZygoteInterrupted(who + ": interrupted while the zygote forked it");
    }
  }
  return false;
}

pid_t StartRankFromZygote(int fd, const ChildSetup& setup, int rank, int world,
                          const std::function<bool()>& give_up) {
  const int passed[kPassedCount] = {setup.pipes.out, setup.pipes.err,
                                    setup.keep_fd};
  std::string text;
  std::vector<int> fds;
  for (const int p : passed) {
    text += p >= 0 ? '1' : '0';
    if (p >= 0) fds.push_back(p);
  }
  text += '\0' + setup.keep_fd_variable + '\0';
  for (const auto& [key, value] : setup.env) {
    text += key + "=" + value + '\0';
  }
  const std::string who =
      "launch: rank " + std::to_string(rank) + " of " + std::to_string(world);
  if (text.size() > kMaxRequest) {
    throw Error(who + ": its environment is " + std::to_string(text.size()) +
                " bytes, over the zygote's " + std::to_string(kMaxRequest));
  }
  iovec io{text.data(), text.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kPassedCount)] = {};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  if (!fds.empty()) {
    message.msg_control = control;
    message.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&message);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = sendmsg(fd, &message, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(text.size())) {
    throw Error(who + ": the zygote is gone (" + std::strerror(errno) + ")");
  }
  if (!AwaitAnswer(fd, give_up, who)) {
    throw Error(who + ": the zygote did not answer in " +
                std::to_string(kAnswerTimeout.count()) + " s");
  }
  Reply reply{};
  do {
    n = recv(fd, &reply, sizeof(reply), MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n != sizeof(reply)) {
    throw Error(who + ": the zygote did not answer");
  }
  if (reply.pid <= 0) {
    throw Error(
        who + ": the zygote could not fork it: " + std::strerror(reply.error));
  }
  // Ours now, unless this process is no subreaper. WNOWAIT: a rank that has
  // already exited stays for the launcher's waitpid to report.
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(reply.pid), &info,
             WEXITED | WNOHANG | WNOWAIT) < 0 &&
      errno == ECHILD) {
    throw Error(who + ": the zygote's rank (pid " + std::to_string(reply.pid) +
                ") is not this launcher's child");
  }
  setpgid(reply.pid, reply.pid);
  do {
    n = send(fd, &kTaken, 1, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != 1) {
    // The rank never starts without it; the caller ends the zygote.
    throw Error(who + ": the zygote is gone (" + std::strerror(errno) + ")");
  }
  ACCEL_VLOG(1) << "launch: forked rank " << rank << "/" << world
                << " from the zygote as pid " << reply.pid;
  return reply.pid;
}

}  // namespace accel
