// PowerSGD (Vogels et al., 2019) for one gradient bucket, as torch's
// powerSGD_hook: each member big enough to gain is approximated by a rank-r
// product P Q^T, so that the ranks sum P (n x r) and Q (m x r) instead of
// the n x m matrix; the rest travels whole in one allreduce. The error of
// the approximation is added to the next step's gradient (error feedback),
// and each step's Q starts from the last one's (warm start).
//
//   PowerSgdBucket compressor(options, {{32, 10}, {32}, {2, 32}, {2}});
//   compressor.Reduce(comm, flat, call);   // flat: the bucket, now averaged
//
// Every rank must run the same steps in the same order (the initial Qs are
// drawn from random_seed alike on every rank).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "accel/runtime/comm/communicator.h"

namespace accel {

// torch's PowerSGDState arguments (Accelerate's comm_state_option).
struct PowerSgdOptions {
  int matrix_approximation_rank = 1;  // >= 1.
  // Steps that sync with a plain allreduce before PowerSGD starts (torch's
  // default; the first steps' gradients change the most).
  int64_t start_powerSGD_iter = 1000;
  // A member is compressed when n m > (n + m) r * min_compression_rate.
  double min_compression_rate = 2;
  bool use_error_feedback = true;
  bool warm_start = true;
  double orthogonalization_epsilon = 0;
  uint64_t random_seed = 0;
};

class PowerSgdBucket {
 public:
  // `shapes`: the bucket's members in the order they are packed.
  PowerSgdBucket(const PowerSgdOptions& options,
                 const std::vector<std::vector<int64_t>>& shapes);

  // Replaces the float32 or float64 bucket `flat` with the ranks' average,
  // approximated; blocking. Returns the bytes given to the allreduces.
  uint64_t Reduce(Communicator& comm, torch::Tensor& flat,
                  const CollectiveOptions& call);

 private:
  struct Matrix {
    int64_t offset, rows, columns;
    torch::Tensor p, q;  // rows x r, columns x r.
  };
  PowerSgdOptions options_;
  std::vector<Matrix> matrices_;
  std::vector<std::pair<int64_t, int64_t>> whole_;  // offset, numel.
  int64_t whole_numel_ = 0;
  torch::Tensor error_;  // Error feedback, the bucket's size.
  uint64_t draws_ = 0;   // Random Q initializations so far.
};

}  // namespace accel
