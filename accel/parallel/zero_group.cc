#include "accel/parallel/zero_group.h"

#include <algorithm>
#include <string>

#include "accel/core/tensor_ops.h"
#include "accel/memory/released_memory.h"
#include "accel/runtime/base/errors.h"

namespace accel {

ShardLayout::ShardLayout(const std::vector<int64_t>& numels, int world_size)
    : world_size_(world_size) {
  for (int64_t numel : numels) {
    offsets_.push_back(total_);
    total_ += numel;
  }
  shard_size_ = (total_ + world_size - 1) / world_size;
}

int64_t ShardLayout::begin(int rank) const {
  return std::min(total_, rank * shard_size_);
}

int64_t ShardLayout::end(int rank) const {
  return std::min(total_, (rank + 1) * shard_size_);
}

std::vector<size_t> ShardLayout::Counts(int64_t lo, int64_t hi) const {
  std::vector<size_t> counts;
  for (int rank = 0; rank < world_size_; ++rank) {
    const int64_t from = std::max(lo, begin(rank));
    const int64_t to = std::min(hi, end(rank));
    counts.push_back(static_cast<size_t>(std::max<int64_t>(0, to - from)));
  }
  return counts;
}

std::vector<ShardLayout::Piece> ShardLayout::Pieces(int rank) const {
  std::vector<Piece> pieces;
  for (size_t tensor = 0; tensor < offsets_.size(); ++tensor) {
    const int64_t start = offsets_[tensor];
    const int64_t stop =
        tensor + 1 < offsets_.size() ? offsets_[tensor + 1] : total_;
    const int64_t from = std::max(start, begin(rank));
    const int64_t to = std::min(stop, end(rank));
    if (from < to) pieces.push_back({tensor, from - start, to - from});
  }
  return pieces;
}

namespace zero_internal {

const void* Key(const torch::Tensor& t) { return t.unsafeGetTensorImpl(); }

std::string Shape(const torch::Tensor& t) {
  std::string text = "[";
  for (int64_t i = 0; i < t.dim(); ++i) {
    text += (i ? ", " : "") + std::to_string(t.size(i));
  }
  return text + "]";
}

void Flatten(ZeroGroup& group, std::optional<c10::ScalarType> dtype) {
  torch::NoGradGuard no_grad;
  const torch::Tensor& first = group.params.front();
  group.flat = torch::zeros({group.layout.padded()},
                            first.options()
                                .dtype(dtype.value_or(first.scalar_type()))
                                .requires_grad(false));
  for (size_t i = 0; i < group.params.size(); ++i) {
    torch::Tensor& param = group.params[i];
    torch::Tensor place =
        group.flat.narrow(0, group.layout.offset(i), param.numel());
    place.copy_(param.reshape({-1}));
    param.set_data(place.view(param.sizes()));
  }
}

void* SendBuffer(ZeroGroup& group) {
  if (group.shard.scalar_type() == group.flat.scalar_type()) {
    return group.shard.data_ptr();
  }
  torch::NoGradGuard no_grad;
  group.sending = group.shard.to(group.flat.scalar_type());
  return group.sending.data_ptr();
}

torch::Tensor GatherMaster(Communicator& comm, const ZeroGroup& group,
                           const char* api, CallSite site) {
  torch::Tensor whole =
      torch::empty({group.layout.padded()}, group.shard.options());
  CollectiveOptions options;
  options.api = api;
  options.site = site;
  comm.allgather(group.shard.data_ptr(), whole.data_ptr(),
                 static_cast<size_t>(group.layout.shard_size()),
                 ToDType(whole.scalar_type()), options);
  return whole;
}

c10::DataPtr AllocateDetached(const torch::Tensor& flat) {
  c10::StorageImpl* storage = flat.storage().unsafeGetStorageImpl();
  return storage->allocator()->allocate(flat.numel() * flat.element_size());
}

void InstallStorage(const torch::Tensor& flat, c10::DataPtr data) {
  c10::StorageImpl* storage = flat.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(std::move(data));
  storage->set_nbytes(flat.numel() * flat.element_size());
}

void FreeStorage(const torch::Tensor& flat) {
  c10::StorageImpl* storage = flat.storage().unsafeGetStorageImpl();
  const size_t bytes = flat.numel() * flat.element_size();
  void* released =
      flat.device().is_cpu() ? ReleasedMemory(storage, bytes) : nullptr;
  storage->set_data_ptr_noswap(c10::DataPtr(released, flat.device()));
  storage->set_nbytes(released != nullptr ? bytes : 0);
}

void RefuseAfterLeavingTheJob(const char* api) {
  throw UsageError(std::string(api) +
                   ": this process has left the job (end_training(), or an "
                   "error), and ZeRO needs every rank for it (each holds a "
                   "shard of the parameters); call it before end_training()");
}

}  // namespace zero_internal
}  // namespace accel
