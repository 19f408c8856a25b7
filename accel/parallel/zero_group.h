// ZeRO's flat buffers: the parameters of one unit, dtype and device packed
// into one buffer they are views of, with this rank's share of it, and the
// storage stage 3 gives back between uses. Private to //accel:zero.
//
//   ZeroGroup group;
//   group.params = {weight, bias};
//   group.layout = ShardLayout({weight.numel(), bias.numel()}, world_size);
//   zero_internal::Flatten(group);        // weight, bias: views of group.flat
//   zero_internal::FreeStorage(group.flat);      // stage 3, between uses
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accel/parallel/zero.h"
#include "accel/runtime/comm/communicator.h"

namespace accel {

// The parameters of one dtype and device, packed into one flat buffer that
// they are views of.
struct ZeroGroup {
  ShardLayout layout;
  torch::Tensor flat;                       // layout.padded() elements.
  std::vector<torch::Tensor> params;        // Views of flat.
  std::vector<ShardLayout::Piece> pieces;   // This rank's.
  std::vector<torch::Tensor> piece_params;  // What the optimizer steps.
  // Stage 2: this rank's share of the reduced gradients (its own size;
  // one element more so that its pointer is valid when the share is empty).
  torch::Tensor shard_grad;
  // Whether shard_grad holds a reduced gradient that zero_grad has not
  // cleared: the next sync then reduces into `incoming` and adds, so that
  // two backwards before a step sum as under DDP.
  bool shard_grad_held = false;
  torch::Tensor incoming;
  int64_t own_begin = 0;
  // Stage 3: the unit these parameters belong to, or -1 (the flat buffer
  // then stays, as under stages 1-2). A unit's group keeps this rank's
  // share of it in `shard` (shard_size elements, the pieces are views of
  // it); `flat` has storage only while gathered.
  int unit = -1;
  torch::Tensor shard;
  // Mixed precision (zero.h): `flat` holds the compute dtype and `shard`,
  // kept under every stage, the master dtype; an all-gather sends
  // `sending`, the share cast to flat's dtype.
  bool mixed = false;
  torch::Tensor sending;
  // The dtype gradients are reduced in.
  c10::ScalarType reduce_dtype = c10::ScalarType::Float;
  bool gathered = true;
  // The all-gather filling `arriving`, memory that becomes flat's storage
  // only when the unit is about to run: until then its parameters still
  // point at released memory, so a layer called around accel::forward
  // while its unit is prefetched meets released_memory.h's message instead
  // of reading a buffer the all-gather is still writing.
  std::shared_ptr<Work> gathering;
  c10::DataPtr arriving;
};

namespace zero_internal {

// A tensor's identity (its TensorImpl), shared by its handles.
const void* Key(const torch::Tensor& t);

// "[4, 2]".
std::string Shape(const torch::Tensor& t);

// Makes every parameter a view of its place in a new group.flat (of
// `dtype`, by default the first parameter's), holding its values.
void Flatten(ZeroGroup& group,
             std::optional<c10::ScalarType> dtype = std::nullopt);

// The share of the flat buffer an all-gather sends from this rank: the
// shard, cast to flat's dtype when they differ (kept in group.sending
// until the all-gather is done).
void* SendBuffer(ZeroGroup& group);

// A blocking all-gather of every rank's master share (`shard`) into a new
// tensor of the master dtype (layout.padded() elements).
torch::Tensor GatherMaster(Communicator& comm, const ZeroGroup& group,
                           const char* api, CallSite site = {});

// Stage 3's storage resizing: the flat buffer's storage (which its
// parameters, their views and autograd's saved tensors share) gets memory
// again, or gives it back. Released on the CPU it points at a range that
// faults with a message (released_memory.h) and keeps its size, so that any
// use of a parameter meets that message; elsewhere it is null and empty.
void FreeStorage(const torch::Tensor& flat);
// Memory for flat's data that is not yet its storage, and making it so.
c10::DataPtr AllocateDetached(const torch::Tensor& flat);
void InstallStorage(const torch::Tensor& flat, c10::DataPtr data);
// UsageError: `api` needs the other ranks (their shards), but this process
// left the job (end_training, or an error).
[[noreturn]] void RefuseAfterLeavingTheJob(const char* api);

}  // namespace zero_internal
}  // namespace accel
