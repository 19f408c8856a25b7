// Dropout of a share of a tensor that one process would hold whole (a
// tensor-parallel rank's attention heads, a context-parallel rank's part of
// the sequence), dropping exactly what one process's dropout drops there.
//
//   // Attention weights [B, H / tp, T, T]: tp rank r holds heads
//   // [r * H / tp, (r + 1) * H / tp).
//   weights = accel::SplitDropout(
//       weights, 0.1, is_training(),
//       {{.dim = 1, .index = tp.rank(), .count = tp.size()}});
//
// The mask is drawn from the default generator for the whole tensor, in the
// order torch::dropout draws it, and this share of it kept: ranks whose
// generators are alike (the same seed, the same draws so far) together
// drop what one process drops, and their generators stay alike. The price
// is drawing `count` times the random numbers a share needs. Megatron-LM
// instead draws each rank's share from a generator of its own: cheaper, but
// no two tensor-parallel sizes then train alike.
//
// The generators must be alike: accel::Accelerator makes them so within
// every tp and cp group in prepare() and after load_state()
// (AlignModelParallelGenerators below), so a program that seeds each rank
// differently, or a checkpoint loaded at another process count (whose
// extra ranks find no random state of their own), still drops alike.
//
// Equal to torch::dropout's mask on the CPU only: on CUDA torch::dropout
// draws with its fused kernel, while SplitDropout draws with bernoulli_
// (its shares still agree with each other at every tp and cp size).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "accel/runtime/comm/communicator.h"
#include "accel/runtime/comm/device_mesh.h"

namespace accel {

// `x` is share `index` of `count` equal, consecutive shares along `dim` of
// the whole tensor. Shares listed one after another nest: the second is a
// share of the first's part (a sequence split over cp, then each part over
// tp: {{1, cp_rank, cp_size}, {1, tp_rank, tp_size}}).
struct DropoutShare {
  int64_t dim = 0;
  int64_t index = 0;
  int64_t count = 1;
};

// torch::dropout(x, p, training) of the whole tensor, this share of it.
// With no shares, torch::dropout itself. A negative dim counts from the
// end. UsageError for p outside [0, 1], a dim `x` lacks, a count below 1,
// an index outside [0, count), or a whole tensor too large to draw.
torch::Tensor SplitDropout(const torch::Tensor& x, double p, bool training,
                           const std::vector<DropoutShare>& shares);

// Gives every rank of `group` the default CPU generator's state of the
// group's rank 0 (one broadcast of about 5 KB; `api` names it in errors).
void AlignGenerators(Communicator& group, const char* api);

// AlignGenerators over the mesh's tp group, then its cp group: every rank
// of a tp x cp block ends with the state of the block's first rank.
void AlignModelParallelGenerators(DeviceMesh& mesh, const char* api);

}  // namespace accel
