#include "tools/env/shared_libraries.h"

#include <dlfcn.h>

#include <fstream>
#include <string>

namespace accel::env {
namespace {

// The first of `names` that loads, or null; `loaded` gets its name.
void* OpenFirst(const std::vector<std::string>& names, std::string* loaded,
                std::string* why) {
  for (const std::string& name : names) {
    if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *loaded = name;
      return handle;
    }
  }
  std::string tried;
  for (const std::string& name : names)
    tried += (tried.empty() ? "" : ", ") + name;
  *why = "none of " + tried + " loads";
  return nullptr;
}

template <typename Fn>
Fn Symbol(void* handle, const char* name) {
  return reinterpret_cast<Fn>(dlsym(handle, name));
}

// CUDA encodes versions as 1000 * major + 10 * minor.
std::string CudaVersion(int version) {
  return std::to_string(version / 1000) + "." +
         std::to_string((version % 1000) / 10);
}

}  // namespace

CudaReport ProbeCuda() {
  CudaReport report;
  std::string why;
  void* runtime = OpenFirst({"libcudart.so.13", "libcudart.so.12",
                             "libcudart.so.11.0", "libcudart.so"},
                            &report.runtime_library, &why);
  if (runtime == nullptr) {
    report.problem = "no CUDA runtime (" + why + ")";
    return report;
  }
  report.runtime_found = true;
  using GetInt = int (*)(int*);
  using ErrorString = const char* (*)(int);
  int version = 0;
  if (auto fn = Symbol<GetInt>(runtime, "cudaRuntimeGetVersion");
      fn && fn(&version) == 0) {
    report.runtime_version = CudaVersion(version);
  }
  if (auto fn = Symbol<GetInt>(runtime, "cudaDriverGetVersion");
      fn && fn(&version) == 0 && version > 0) {
    report.driver_version = CudaVersion(version);
  }
  auto count = Symbol<GetInt>(runtime, "cudaGetDeviceCount");
  auto error_string = Symbol<ErrorString>(runtime, "cudaGetErrorString");
  const int status = count ? count(&report.device_count) : -1;
  if (status != 0) {
    report.device_count = 0;
    report.problem = std::string("cudaGetDeviceCount: ") +
                     (error_string ? error_string(status) : "failed") +
                     " (error " + std::to_string(status) + ")";
    return report;
  }
  // Names come from the driver API, whose signatures do not change.
  std::string driver_name;
  if (void* driver = OpenFirst({"libcuda.so.1"}, &driver_name, &why)) {
    using Init = int (*)(unsigned);
    using GetName = int (*)(char*, int, int);
    using TotalMem = int (*)(size_t*, int);
    auto init = Symbol<Init>(driver, "cuInit");
    auto get_name = Symbol<GetName>(driver, "cuDeviceGetName");
    auto total_mem = Symbol<TotalMem>(driver, "cuDeviceTotalMem_v2");
    if (init && get_name && init(0) == 0) {
      for (int i = 0; i < report.device_count; ++i) {
        char name[256] = {};
        std::string device = get_name(name, sizeof(name) - 1, i) == 0
                                 ? name
                                 : "GPU " + std::to_string(i);
        size_t bytes = 0;
        if (total_mem && total_mem(&bytes, i) == 0) {
          device += ", " + std::to_string(bytes >> 30) + " GiB";
        }
        report.devices.push_back(device);
      }
    }
  }
  return report;
}

std::string ProbeNccl() {
  std::string loaded, why;
  void* nccl = OpenFirst({"libnccl.so.2", "libnccl.so"}, &loaded, &why);
  if (nccl == nullptr) return "not found (" + why + ")";
  int code = 0;
  auto get_version = Symbol<int (*)(int*)>(nccl, "ncclGetVersion");
  if (get_version == nullptr || get_version(&code) != 0) {
    return "unknown version (" + loaded + ")";
  }
  // NCCL >= 2.9 encodes 10000 * major + 100 * minor + patch.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? (code % 10000) / 100 : (code % 1000) / 100;
  const int patch = code % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." +
         std::to_string(patch) + " (" + loaded + ")";
}

std::string ProbeMpi() {
  std::string loaded, why;
  void* mpi =
      OpenFirst({"libmpi.so.40", "libmpi.so.12", "libmpi.so"}, &loaded, &why);
  if (mpi == nullptr) return "not found (" + why + ")";
  // Callable before MPI_Init, by the standard.
  auto get_version =
      Symbol<int (*)(char*, int*)>(mpi, "MPI_Get_library_version");
  if (get_version == nullptr) return "unknown version (" + loaded + ")";
  char text[8192] = {};
  int length = 0;
  if (get_version(text, &length) != 0)
    return "unknown version (" + loaded + ")";
  std::string version(text, static_cast<size_t>(length));
  version = version.substr(0, version.find_first_of(",\n"));
  return version + " (" + loaded + ")";
}

BlasReport ProbeBlas() {
  BlasReport report;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string name = path.substr(path.rfind('/') + 1);
    if (name.rfind("libblas", 0) == 0 || name.rfind("libopenblas", 0) == 0 ||
        name.rfind("libmkl_rt", 0) == 0 || name.rfind("libblis", 0) == 0) {
      report.library = path;
      break;
    }
  }
  using GetConfig = const char* (*)();
  using GetThreads = int (*)();
  if (auto config = reinterpret_cast<GetConfig>(
          dlsym(RTLD_DEFAULT, "openblas_get_config"))) {
    report.kind = config();
    if (auto threads = reinterpret_cast<GetThreads>(
            dlsym(RTLD_DEFAULT, "openblas_get_num_threads"))) {
      report.threads = threads();
    }
  } else if (auto threads = reinterpret_cast<GetThreads>(
                 dlsym(RTLD_DEFAULT, "mkl_get_max_threads"))) {
    report.kind = "Intel MKL";
    report.threads = threads();
  } else if (report.library.find("/blas/") != std::string::npos) {
    report.kind =
        "reference BLAS (slow: install libopenblas0-pthread, see "
        "tools/setup.sh)";
    report.threads = 1;
  } else {
    report.kind = report.library.empty() ? "none loaded" : "unknown";
  }
  return report;
}

int OpenMpMaxThreads() {
  auto max_threads =
      reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  return max_threads ? max_threads() : -1;
}

}  // namespace accel::env
