// accel env: what a bug report needs to know about this machine and this
// build, as `accelerate env` prints it.
//
//   $ bazel run //tools:env          # or accel-env, once installed
//   Copy-and-paste the text below in your GitHub issue
//
//   - accel version: 0.1.1 (commit 8545a2d0c1e2)
//   - Platform: Linux 6.1.0-28-amd64 x86_64 (Debian GNU/Linux 12 (bookworm))
//   ...
//
// Every library is looked up the way a program would load it; what is
// missing is said with the reason, never an error.
#include <ATen/Parallel.h>
#include <gloo/config.h>
#include <sched.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <torch/cuda.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/version.h"
#include "accel/runtime/comm/registry.h"
#include "accel/runtime/launch/launch_config.h"
#include "accel/tracking/tracker.h"
#include "tools/env/build_info.h"
#include "tools/env/shared_libraries.h"

namespace accel::env {
namespace {

using Items = std::vector<std::pair<std::string, std::string>>;

std::string Joined(const std::vector<std::string>& parts,
                   const char* separator = ", ") {
  std::string text;
  for (const std::string& part : parts) {
    text += (text.empty() ? "" : separator) + part;
  }
  return text;
}

std::string OsName() {
  std::ifstream release("/etc/os-release");
  for (std::string line; std::getline(release, line);) {
    if (line.rfind("PRETTY_NAME=", 0) == 0) {
      std::string name = line.substr(12);
      if (name.size() >= 2 && name.front() == '"') {
        name = name.substr(1, name.size() - 2);
      }
      return name;
    }
  }
  return "unknown";
}

std::string Platform() {
  utsname system;
  if (uname(&system) != 0) return "unknown";
  return std::string(system.sysname) + " " + system.release + " " +
         system.machine + " (" + OsName() + ")";
}

std::string Cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int usable =
      sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : -1;
  std::string text = std::to_string(std::thread::hardware_concurrency());
  if (usable > 0 &&
      usable != static_cast<int>(std::thread::hardware_concurrency())) {
    text += " (" + std::to_string(usable) + " usable by this process)";
  }
  return text;
}

std::string Memory() {
  struct sysinfo info;
  if (sysinfo(&info) != 0) return "unknown";
  const double gib = static_cast<double>(info.totalram) * info.mem_unit /
                     (1024.0 * 1024 * 1024);
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GiB", gib);
  return text;
}

std::string GpusVisible(const CudaReport& cuda) {
  std::string text = std::to_string(cuda.device_count);
  if (!cuda.devices.empty()) text += ": " + Joined(cuda.devices, "; ");
  if (cuda.device_count == 0 && !cuda.problem.empty()) {
    text += " (" + cuda.problem + ")";
  }
  return text;
}

std::string Cuda(const CudaReport& cuda) {
  std::string text = kBuiltWithCuda
                         ? std::string("accel built against ") + kCudaHome
                         : std::string(
                               "accel built without CUDA "
                               "(no toolkit at ") +
                               kCudaHome + " at build time)";
  if (cuda.runtime_found) {
    text +=
        "; runtime " + cuda.runtime_version + " (" + cuda.runtime_library + ")";
    text += cuda.driver_version.empty()
                ? "; no NVIDIA driver"
                : "; driver supports CUDA " + cuda.driver_version;
  } else {
    text += "; " + cuda.problem;
  }
  return text;
}

std::string Blas() {
  const BlasReport blas = ProbeBlas();
  std::string text = blas.kind;
  if (!blas.library.empty()) text += " (" + blas.library + ")";
  if (blas.threads > 0)
    text += ", " + std::to_string(blas.threads) + " threads";
  return text;
}

std::string Threads() {
  const int omp = OpenMpMaxThreads();
  std::string text = "LibTorch intra-op " +
                     std::to_string(at::get_num_threads()) + ", inter-op " +
                     std::to_string(at::get_num_interop_threads());
  text += omp > 0 ? ", omp_get_max_threads " + std::to_string(omp)
                  : ", no OpenMP runtime loaded";
  return text;
}

bool IsLaunchVariable(const std::string& name) {
  static const char* const kNames[] = {"RANK",
                                       "WORLD_SIZE",
                                       "LOCAL_RANK",
                                       "LOCAL_WORLD_SIZE",
                                       "GROUP_RANK",
                                       "ROLE_RANK",
                                       "MASTER_ADDR",
                                       "MASTER_PORT",
                                       "CUDA_VISIBLE_DEVICES",
                                       "CUDA_HOME",
                                       "OMP_NUM_THREADS",
                                       "OPENBLAS_NUM_THREADS",
                                       "MKL_NUM_THREADS",
                                       "MPI_LOCALRANKID",
                                       "MPI_LOCALNRANKS",
                                       "SLURM_PROCID",
                                       "SLURM_NTASKS",
                                       "SLURM_LOCALID",
                                       "SLURM_NODEID",
                                       "SLURM_STEP_TASKS_PER_NODE",
                                       "SLURM_JOB_NODELIST",
                                       "SLURM_JOB_ID",
                                       "SLURM_STEP_ID"};
  for (const char* known : kNames) {
    if (name == known) return true;
  }
  for (const char* prefix : {"ACCEL_", "TORCHELASTIC_", "OMPI_COMM_WORLD_",
                             "PMI_", "NCCL_", "GLOO_"}) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// Values that grant access stay out of bug reports.
bool IsSecret(const std::string& name) {
  for (const char* word : {"SECRET", "TOKEN", "PASSWORD", "KEY"}) {
    if (name.find(word) != std::string::npos) return true;
  }
  return false;
}

std::string LaunchVariables() {
  std::vector<std::string> found;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const size_t equals = text.find('=');
    const std::string name = text.substr(0, equals);
    if (!IsLaunchVariable(name)) continue;
    found.push_back(IsSecret(name) ? name + "=(set, not shown)" : text);
  }
  std::sort(found.begin(), found.end());
  return found.empty() ? "none" : "\n    " + Joined(found, "\n    ");
}

// What every accel program would read now (see launch_config.h).
std::string Config() {
  std::string path;
  std::vector<std::pair<std::string, std::string>> flags;
  try {
    path = LaunchConfigPath(0, nullptr);
    if (path.empty()) {
      const std::string fallback = DefaultLaunchConfigPath();
      if (fallback.empty()) return "none ($HOME is not set)";
      return "none (" + fallback + " does not exist; accel-config writes it)";
    }
    flags = ReadLaunchConfig(path);
  } catch (const Error& e) {
    return std::string("unusable: ") + e.what();
  }
  std::vector<std::string> lines;
  for (const auto& [name, value] : flags)
    lines.push_back("--" + name + "=" + value);
  return path +
         (lines.empty() ? " (no flags)" : "\n    " + Joined(lines, "\n    "));
}

Items Report() {
  const CudaReport cuda = ProbeCuda();
  std::string version = std::string(kVersion);
  if (std::strlen(kCommit) > 0)
    version += " (commit " + std::string(kCommit) + ")";
  return {
      {"accel version", version},
      {"Platform", Platform()},
      {"Compiler", std::string("GCC ") + __VERSION__ + ", C++" +
                       std::to_string(__cplusplus / 100 % 100)},
      {"LibTorch version", std::string(TORCH_VERSION) + " (CUDA available: " +
                               (torch::cuda::is_available() ? "yes" : "no") +
                               ")"},
      {"Gloo version", std::to_string(GLOO_VERSION_MAJOR) + "." +
                           std::to_string(GLOO_VERSION_MINOR) + "." +
                           std::to_string(GLOO_VERSION_PATCH)},
      {"MPI version", ProbeMpi()},
      {"CUDA", Cuda(cuda)},
      {"NCCL version", ProbeNccl()},
      {"Backends linked", Joined(RegisteredBackends()) +
                              " (--backend=auto picks " +
                              ResolveBackend("auto") + ")"},
      {"Trackers linked", Joined(RegisteredTrackers())},
      {"GPUs visible", GpusVisible(cuda)},
      {"CPUs", Cpus()},
      {"System RAM", Memory()},
      {"Threads", Threads()},
      {"BLAS", Blas()},
      {"Launch variables", LaunchVariables()},
      {"Launch config", Config()},
  };
}

}  // namespace
}  // namespace accel::env

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf(
          "usage: %s\n\nPrints accel's version and commit, the versions of "
          "LibTorch, Gloo, MPI, CUDA and NCCL, the backends and trackers "
          "linked, the GPUs and CPUs, thread settings, the launch variables "
          "set and the launch configuration file, for bug reports.\n",
          argv[0]);
      return 0;
    }
    std::fprintf(stderr, "error: accel env takes no arguments, found '%s'\n",
                 argv[i]);
    return 2;
  }
  std::printf("Copy-and-paste the text below in your GitHub issue\n\n");
  for (const auto& [name, value] : accel::env::Report()) {
    // Lists start on their own line.
    std::printf("- %s:%s%s\n", name.c_str(), value[0] == '\n' ? "" : " ",
                value.c_str());
  }
  return 0;
}
