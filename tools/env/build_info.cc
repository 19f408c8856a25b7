#include "tools/env/build_info.h"

namespace accel::env {

const bool kBuiltWithCuda = ACCEL_BUILT_WITH_CUDA;
const char kCudaHome[] = ACCEL_CUDA_HOME;

}  // namespace accel::env
