// A LibTorch program for //tests:zygote_test: each rank says where it was
// loaded and what it runs with, so that the test can tell a rank forked from
// the zygote (accel/runtime/launch/zygote.h) from one exec'd, and check that
// it got what exec would have given it.
//
//   zygote_program --num_processes=2 --main_process_port=0
//   rank 1/2: loaded in pid 41, runs as pid 45, parent 41, name
//   zygote_program, torch threads 1, blas threads 1, gather 1
//   rank 1 signals: INT=dfl TERM=dfl HUP=dfl QUIT=dfl USR1=dfl USR2=dfl
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <gflags/gflags.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "accel/accelerator.h"

DEFINE_int32(fail_rank, -1,
             "This rank exits with code 3 in the first attempt "
             "(TORCHELASTIC_RESTART_COUNT=0).");
DEFINE_string(pid_dir, "", "Each rank writes rank<r>.pid here, then sleeps.");

namespace {

// Set while the program is loaded, before main: the pid that paid for
// loading LibTorch.
const pid_t g_loaded_pid = getpid();

// What each stop signal does in this process (dfl, ign or handled, and
// whether it is blocked): a forked rank must start with what exec would
// have given it.
std::string Dispositions() {
  const std::pair<const char*, int> signals[] = {
      {"INT", SIGINT},   {"TERM", SIGTERM}, {"HUP", SIGHUP},
      {"QUIT", SIGQUIT}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}};
  sigset_t blocked;
  sigprocmask(SIG_BLOCK, nullptr, &blocked);
  std::string text;
  for (const auto& [name, number] : signals) {
    struct sigaction now {};
    sigaction(number, nullptr, &now);
    text += std::string(text.empty() ? "" : " ") + name + "=" +
            (now.sa_handler == SIG_DFL   ? "dfl"
             : now.sa_handler == SIG_IGN ? "ign"
                                         : "handled") +
            (sigismember(&blocked, number) ? "/blocked" : "");
  }
  return text;
}

int Main(int argc, char** argv) {
  // Before the Accelerator installs its own handlers (preemption.h).
  const std::string signals = Dispositions();
  accel::Accelerator accelerator;
  const int rank = accelerator.process_index();
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (rank == FLAGS_fail_rank && restart != nullptr &&
      std::string(restart) == "0") {
    std::printf("rank %d fails on purpose\n", rank);
    return 3;
  }
  // Proves the collectives work in a forked rank (rank 0 serves the store
  // on the socket the launcher passed to the zygote).
  const torch::Tensor ranks = accelerator.gather(
      torch::full({1}, static_cast<double>(rank), torch::kFloat64));
  // OpenBLAS reads OMP_NUM_THREADS when loaded (in the zygote, for a forked
  // rank); LibTorch reads it when first asked.
  int blas_threads = -1;
  if (void* get = dlsym(RTLD_DEFAULT, "openblas_get_num_threads")) {
    blas_threads = reinterpret_cast<int (*)()>(get)();
  }
  char name[16] = {};
  prctl(PR_GET_NAME, name);
  std::printf(
      "rank %d/%d: loaded in pid %d, runs as pid %d, parent %d, name %s, "
      "torch threads %d, blas threads %d, gather %g\n",
      rank, accelerator.num_processes(), static_cast<int>(g_loaded_pid),
      static_cast<int>(getpid()), static_cast<int>(getppid()), name,
      at::get_num_threads(), blas_threads, ranks.sum().item<double>());
  std::printf("rank %d signals: %s\n", rank, signals.c_str());
  std::fflush(stdout);
  if (!FLAGS_pid_dir.empty()) {
    std::ofstream(FLAGS_pid_dir + "/rank" + std::to_string(rank) + ".pid")
        << getpid();
    std::this_thread::sleep_for(std::chrono::minutes(10));
  }
  accelerator.wait_for_everyone();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
