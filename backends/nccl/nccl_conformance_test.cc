// Runs the backend conformance suite (tests/conformance.cc) on NCCL, with
// buffers in GPU memory. Ranks are threads sharing the visible GPUs; world
// sizes above the GPU count need NCCL_MULTI_RANK_GPU_ENABLE=1 and are
// otherwise skipped. Without a GPU (CI) every test is skipped; the GPU
// check (tools/gpu_check.sh) runs it on a lent GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "backends/nccl/nccl_transport.h"
#include "tests/conformance.h"

namespace accel::testing {
namespace {

void Check(cudaError_t result, const char* what) {
  if (result != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " +
                             cudaGetErrorString(result));
  }
}

// Device memory on the GPU of the calling rank's thread (the communicator
// made it current), staged through the host by the suite.
class CudaMemory : public ConformanceMemory {
 public:
  void* Allocate(size_t bytes) override {
    void* buffer = nullptr;
    Check(cudaMalloc(&buffer, bytes + 1), "cudaMalloc");
    return buffer;
  }
  void Free(void* buffer) override { cudaFree(buffer); }
  void CopyIn(void* buffer, const void* host, size_t bytes) override {
    Check(cudaMemcpy(buffer, host, bytes, cudaMemcpyHostToDevice),
          "cudaMemcpy to device");
  }
  void CopyOut(void* host, const void* buffer, size_t bytes) override {
    Check(cudaMemcpy(host, buffer, bytes, cudaMemcpyDeviceToHost),
          "cudaMemcpy to host");
  }
};

class GpuEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    std::string error;
    const int devices = VisibleCudaDevices(&error);
    if (devices <= 0) GTEST_SKIP() << "no CUDA GPU is visible: " << error;
    const char* share = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    if ((share == nullptr || std::string(share) != "1") &&
        std::getenv("ACCEL_CONFORMANCE_MAX_WORLD_SIZE") == nullptr) {
      setenv("ACCEL_CONFORMANCE_MAX_WORLD_SIZE",
             std::to_string(devices).c_str(), 1);
    }
  }
};

const auto* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new GpuEnvironment());

}  // namespace

const ConformanceSetup& GetConformanceSetup() {
  static CudaMemory memory;
  static const ConformanceSetup setup{{"nccl"}, &memory};
  return setup;
}

}  // namespace accel::testing
