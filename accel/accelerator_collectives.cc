// The Accelerator's collectives: tensors, synchronization points, triggers
// and preemption (see accelerator.h). Each opens a LibTorch profiler scope
// ("accel::gather", ...), so accel::Profiler shows the time spent in them.
#include <ATen/record_function.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "accel/accelerator.h"
#include "accel/core/tensor_ops.h"
#include "accel/runtime/base/logging.h"

namespace accel {

CollectiveOptions Accelerator::At(CallSite site, const char* api) const {
  CollectiveOptions options;
  options.site = site;
  options.api = api;
  return options;
}

torch::Tensor Accelerator::GatherOne(const torch::Tensor& tensor, CallSite site,
                                     const char* api, bool drop_duplicates) {
  RECORD_USER_SCOPE("accel::gather");
  torch::Tensor gathered = Gather(DataGroup(), tensor, At(site, api));
  if (!drop_duplicates || gathered.dim() == 0) return gathered;
  const int64_t keep = SamplesToKeep(gathered.size(0));
  return keep == gathered.size(0) ? gathered : gathered.narrow(0, 0, keep);
}

int64_t Accelerator::SamplesToKeep(int64_t gathered) const {
  const GradientState& gradients = state_->gradients;
  if (!gradients.end_of_dataloader() || gradients.remainder() <= 0) {
    return gathered;
  }
  return std::min<int64_t>(gathered, gradients.remainder());
}

torch::Tensor Accelerator::ReduceOne(const torch::Tensor& tensor,
                                     const std::string& reduction,
                                     CallSite site) {
  RECORD_USER_SCOPE("accel::reduce");
  return ReduceTensor(DataGroup(), tensor, reduction, At(site));
}

torch::Tensor Accelerator::BroadcastOne(const torch::Tensor& tensor,
                                        int from_process, CallSite site) {
  RECORD_USER_SCOPE("accel::broadcast");
  return BroadcastTensor(communicator(), tensor, from_process, At(site));
}

torch::Tensor Accelerator::pad_across_processes(const torch::Tensor& tensor,
                                                int64_t dim, double pad_index,
                                                bool pad_first, CallSite site) {
  return PadAcrossProcesses(DataGroup(), tensor, dim, pad_index, pad_first,
                            At(site));
}

torch::Tensor Accelerator::FromMainProcessTensor(const torch::Tensor& tensor) {
  RECORD_USER_SCOPE("accel::dispatch_batches");
  const CollectiveOptions options = At(CallSite::Here(), "dispatch_batches");
  // dtype, dim, sizes: the others hold zeros, so a max is the main's.
  constexpr int kMaxDims = 8;
  std::array<int64_t, kMaxDims + 2> meta{};
  torch::Tensor data;
  if (is_main_process()) {
    if (!tensor.defined() || tensor.dim() > kMaxDims) {
      throw UsageError(
          "dispatch_batches: a batch tensor must be defined and have at most " +
          std::to_string(kMaxDims) + " dimensions");
    }
    data = tensor.to(device_).contiguous();
    meta[0] = static_cast<int64_t>(data.scalar_type());
    meta[1] = data.dim();
    for (int64_t d = 0; d < data.dim(); ++d) meta[2 + d] = data.size(d);
  }
  AllreduceHostValues(communicator(), meta.data(), meta.size(), torch::kInt64,
                      ReduceOp::kMax, options);
  if (!is_main_process()) {
    const std::vector<int64_t> sizes(meta.begin() + 2,
                                     meta.begin() + 2 + meta[1]);
    data =
        torch::empty(sizes, torch::TensorOptions()
                                .dtype(static_cast<torch::ScalarType>(meta[0]))
                                .device(device_));
  }
  if (data.numel() > 0) {
    communicator().broadcast(data.data_ptr(), static_cast<size_t>(data.numel()),
                             ToDType(data.scalar_type()), /*root=*/0, options);
  }
  return data;
}

void Accelerator::wait_for_everyone(CallSite site) {
  RECORD_USER_SCOPE("accel::wait_for_everyone");
  communicator().barrier(At(site, "wait_for_everyone"));
}

bool Accelerator::check_preemption(CallSite site) {
  StartHandlingPreemption();
  if (preemption_signal_ != 0) return true;
  // The signal and, below it, which rank got it: the maximum is the
  // highest signal, at the lowest rank that got it.
  constexpr int64_t kRanks = int64_t{1} << 32;
  const int signal_number = PendingPreemptionSignal();
  int64_t seen = signal_number == 0
                     ? 0
                     : signal_number * kRanks + (kRanks - 1 - process_index());
  if (num_processes() > 1) {
    AllreduceHostValues(communicator(), &seen, 1, torch::kInt64, ReduceOp::kMax,
                        At(site, "check_preemption"));
  }
  if (seen == 0) return false;
  preemption_signal_ = static_cast<int>(seen / kRanks);
  const int64_t rank = kRanks - 1 - seen % kRanks;
  if (is_main_process()) {
    ACCEL_LOG(WARNING) << (num_processes() > 1
                               ? "rank " + std::to_string(rank) + " got "
                               : std::string("got "))
                       << SignalName(preemption_signal_)
                       << ": every rank stops at this step (" << site.ToString()
                       << ")";
  }
  return true;
}

bool Accelerator::check_trigger(CallSite site) {
  int32_t flag = trigger_ ? 1 : 0;
  AllreduceHostValues(communicator(), &flag, 1, torch::kInt32, ReduceOp::kMax,
                      At(site, "check_trigger"));
  trigger_ = false;
  return flag != 0;
}

ProcessOrderScope Accelerator::main_process_first(CallSite site) {
  return ProcessOrderScope(is_main_process(), [this, site] {
    communicator().barrier(At(site, "main_process_first"));
  });
}

ProcessOrderScope Accelerator::local_main_process_first(CallSite site) {
  return ProcessOrderScope(is_local_main_process(), [this, site] {
    communicator().barrier(At(site, "local_main_process_first"));
  });
}

}  // namespace accel
