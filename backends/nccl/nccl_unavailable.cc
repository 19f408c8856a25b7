// Registers "nccl" in a build without a CUDA toolkit, so that choosing it
// gives a clear error instead of "unknown backend".
#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/registry.h"

namespace accel {
namespace {

const BackendRegistration kRegistration(
    "nccl",
    [](const BackendContext&) -> std::unique_ptr<Transport> {
      throw UsageError(
          "the nccl backend is unavailable: accel was built without CUDA (no "
          "CUDA toolkit with NCCL was found at $CUDA_HOME or /usr/local/cuda "
          "when it was built). Use --backend=gloo, or rebuild where the "
          "toolkit is installed");
    },
    [] { return false; });

}  // namespace
}  // namespace accel
