// Accelerate's tensor collectives on top of a Communicator.
//
//   accel::Communicator& comm = ...;
//   torch::Tensor all = accel::Gather(comm, preds);          // [N * b]
//   torch::Tensor mean = accel::ReduceTensor(comm, loss, "mean");
//   torch::Tensor padded = accel::PadAcrossProcesses(comm, seq, /*dim=*/1);
//
// Every rank must call the same function in the same order. Unlike
// Accelerate, Gather, ReduceTensor and BroadcastTensor always check that
// shapes and dtypes agree across ranks (one small allgather of metadata) and
// fail on every rank with one message listing each rank's shape and dtype,
// instead of hanging or returning garbage.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "accel/runtime/base/dtype.h"
#include "accel/runtime/comm/communicator.h"

namespace accel {

// The accel dtype of a torch dtype; UsageError names unsupported ones.
DType ToDType(torch::ScalarType type);

// Each function takes the options of its collectives: timeout, and the
// name and call site that diagnostics show (the Accelerator passes its
// caller's).

// Concatenation along dim 0, in rank order, on every rank. 0-d tensors
// count as shape [1].
torch::Tensor Gather(Communicator& comm, const torch::Tensor& tensor,
                     const CollectiveOptions& options = {});

// A reduced copy: "sum", "mean" (sum / num_processes), "max" or "min".
torch::Tensor ReduceTensor(Communicator& comm, const torch::Tensor& tensor,
                           const std::string& reduction,
                           const CollectiveOptions& options = {});

// `from_process`'s values, on every rank.
torch::Tensor BroadcastTensor(Communicator& comm, const torch::Tensor& tensor,
                              int from_process,
                              const CollectiveOptions& options = {});

// c10d's default bucket for broadcasting module state.
inline constexpr int64_t kBroadcastBucketBytes = int64_t{256} << 20;

// Overwrites `tensors` on every rank with `from_process`'s, in buckets of at
// most `bucket_bytes` per dtype and device (c10d's broadcast_coalesced): one
// collective per bucket instead of one per tensor, plus one small one that
// checks that every rank passes the same list. When the lists differ (names,
// shapes or dtypes, with check_collectives on), every rank throws the same
// UsageError naming the first tensor that differs and each rank's version
// of it. `names[i]` labels `tensors[i]` ("model_0.fc.weight").
void BroadcastCoalesced(Communicator& comm,
                        const std::vector<std::string>& names,
                        const std::vector<torch::Tensor>& tensors,
                        int from_process, const CollectiveOptions& options = {},
                        int64_t bucket_bytes = kBroadcastBucketBytes);

// Pads `dim` up to the largest size over all ranks with `pad_index`; data
// first unless `pad_first`. A dim beyond the tensor's rank returns it as is.
torch::Tensor PadAcrossProcesses(Communicator& comm,
                                 const torch::Tensor& tensor, int64_t dim,
                                 double pad_index, bool pad_first,
                                 const CollectiveOptions& options = {});

// Allreduces a few host values (flags, counters, a norm) in place, on any
// backend: through a buffer on the GPU for device backends (NCCL takes
// device memory only), directly otherwise.
void AllreduceHostValues(Communicator& comm, void* values, size_t count,
                         torch::ScalarType type, ReduceOp op,
                         const CollectiveOptions& options = {});

// Moves a CPU result of a collective onto `like`'s device, keeping dtype.
torch::Tensor OnDeviceOf(const torch::Tensor& result,
                         const torch::Tensor& like);

}  // namespace accel
