// Versions and settings of the libraries accel runs on, found at run time
// through the dynamic loader (dlopen), so that `accel env` works, and says
// what is missing, on machines without CUDA, NCCL or MPI.
//
//   accel::env::CudaReport cuda = accel::env::ProbeCuda();
//   if (!cuda.runtime_found) std::puts(cuda.problem.c_str());
#pragma once

#include <string>
#include <vector>

namespace accel::env {

struct CudaReport {
  bool runtime_found = false;
  std::string runtime_library;  // The libcudart that was loaded.
  std::string runtime_version;  // "13.0"
  std::string driver_version;   // "13.0", or "" without a driver.
  int device_count = 0;
  std::vector<std::string> devices;  // "NVIDIA H200, 139 GiB" each.
  std::string problem;  // Why there are no devices, when there are none.
};
CudaReport ProbeCuda();

// "2.28.9 (libnccl.so.2)" or "not found (...)".
std::string ProbeNccl();
// MPI_Get_library_version's first line, or "not found (...)".
std::string ProbeMpi();

struct BlasReport {
  std::string library;  // The BLAS the process loaded (a path).
  std::string kind;     // "OpenBLAS 0.3.21 ...", "reference BLAS", ...
  int threads = 0;      // 0 when the library cannot say.
};
// After LibTorch is loaded (it pulls in the BLAS).
BlasReport ProbeBlas();

// omp_get_max_threads() of the loaded OpenMP runtime, or -1 without one.
int OpenMpMaxThreads();

}  // namespace accel::env
