#include "accel/runtime/launch/zygote.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
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

// The signals whose dispositions the program had when the zygote was
// forked; the zygote ignores them (the launcher decides what a Ctrl-C
// means) and each rank gets them back.
constexpr int kHeldSignals[] = {SIGINT,  SIGTERM, SIGHUP,
                                SIGQUIT, SIGUSR1, SIGUSR2};

struct ZygoteState {
  int socket = -1;
  void* program_module = nullptr;
  pid_t launcher = 0;
  char name[16] = {};  // The program's name in ps (comm).
  struct sigaction signals[sizeof(kHeldSignals) / sizeof(int)] = {};
};

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

void WriteAll(int fd, const void* data, size_t size) {
  const char* at = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = write(fd, at, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    at += n;
    size -= static_cast<size_t>(n);
  }
}

// OpenMP and OpenBLAS read OMP_NUM_THREADS when they are loaded, which for
// a forked rank was in the zygote, before the launcher's value existed.
// Looked up at run time: accel's runtime links neither. OpenBLAS starts its
// workers again when told a count; they would idle until the rank exits,
// which then waits for them (0.6 s measured), so they are stopped again:
// OpenBLAS starts them when it next needs them, as after a fork.
void ApplyThreadCount() {
  const char* text = std::getenv("OMP_NUM_THREADS");
  if (text == nullptr) return;
  const int threads = std::atoi(text);
  if (threads < 1) return;
  for (const char* name : {"omp_set_num_threads", "openblas_set_num_threads"}) {
    if (void* symbol = dlsym(RTLD_DEFAULT, name)) {
      reinterpret_cast<void (*)(int)>(symbol)(threads);
    }
  }
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

// In the rank, once the middle process has exited: waits to be the
// launcher's child, then becomes what exec would have made it.
void BecomeRank(const ZygoteState& zygote, pid_t middle,
                const std::vector<std::string>& fields, const int* fds) {
  close(zygote.socket);
  setpgid(0, 0);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (getppid() == middle && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  // Not the launcher's: it died, or is no subreaper; it could never reap us.
  if (getppid() != zygote.launcher) _exit(1);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != zygote.launcher) _exit(1);
  for (size_t i = 0; i < sizeof(kHeldSignals) / sizeof(int); ++i) {
    sigaction(kHeldSignals[i], &zygote.signals[i], nullptr);
  }
  signal(SIGINT, SIG_DFL);  // As StartRank does before exec.
  signal(SIGTERM, SIG_DFL);
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

// The zygote's loop: a rank per request. Returns only in a rank.
void Serve(ZygoteState& zygote) {
  std::vector<std::string> fields;
  int fds[kPassedCount];
  while (ReadRequest(zygote.socket, &fields, fds)) {
    int pid_pipe[2];
    Reply reply{-1, 0};
    if (pipe2(pid_pipe, O_CLOEXEC) != 0) {
      reply.error = errno;
    } else {
      const pid_t middle = fork();
      if (middle == 0) {
        const pid_t self = getpid();
        const pid_t rank = fork();
        if (rank == 0) {
          close(pid_pipe[0]);
          close(pid_pipe[1]);
          BecomeRank(zygote, self, fields, fds);
          return;
        }
        const Reply mine{rank, rank < 0 ? errno : 0};
        WriteAll(pid_pipe[1], &mine, sizeof(mine));
        _exit(0);
      }
      close(pid_pipe[1]);
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
      close(pid_pipe[0]);
    }
    for (const int fd : fds) {
      if (fd >= 0) close(fd);
    }
    WriteAll(zygote.socket, &reply, sizeof(reply));
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
  prctl(PR_GET_NAME, zygote.name);
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
    for (size_t i = 0; i < sizeof(kHeldSignals) / sizeof(int); ++i) {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigaction(kHeldSignals[i], &ignore, &zygote.signals[i]);
    }
    Serve(zygote);  // Returns only in a rank.
    start.role = ZygoteStart::Role::kRank;
    return start;
  }
  close(sockets[1]);
  fcntl(sockets[0], F_SETFD, 0);  // The exec'd supervisor keeps it.
  start.fd = sockets[0];
  return start;
}

bool AdoptZygoteRanks() { return prctl(PR_SET_CHILD_SUBREAPER, 1) == 0; }

pid_t StartRankFromZygote(int fd, const ChildSetup& setup, int rank,
                          int world) {
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
  Reply reply{};
  do {
    n = recv(fd, &reply, sizeof(reply), 0);
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
  ACCEL_VLOG(1) << "launch: forked rank " << rank << "/" << world
                << " from the zygote as pid " << reply.pid;
  return reply.pid;
}

}  // namespace accel
