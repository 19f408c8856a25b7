// How this build of accel was made, for `accel env`.
#pragma once

namespace accel::env {

// The git commit (Bazel's workspace status, see tools/workspace_status.sh),
// or "" when built outside a checkout.
extern const char kCommit[];
// Whether the nccl backend was compiled against a CUDA toolkit, and where
// the build looked for one ($CUDA_HOME).
extern const bool kBuiltWithCuda;
extern const char kCudaHome[];

}  // namespace accel::env
