// The Accelerator's side of invariant_micro_batches
// (accel/parallel/invariant_reduction.h): the process count, the threads each
// process computes with, and the micro-batches of a batch. (Which options it
// combines with, AcceleratorOptions::Validate checks.)
#include <algorithm>
#include <cstdlib>
#include <string>

#include "accel/accelerator.h"
#include "accel/parallel/invariant_reduction.h"
#include "accel/runtime/base/logging.h"
#include "accel/throughput.h"

namespace accel {

void Accelerator::SetUpInvariantMicroBatches() {
  const int micro_batches = options_.invariant_micro_batches;
  if (micro_batches == 0) return;
  CheckInvariantMicroBatches(micro_batches, num_processes());
  const std::string mode =
      "invariant_micro_batches=" + std::to_string(micro_batches);
  // Sums split across threads depend on how many there are: one per
  // process, as the launcher gives each of several. OpenBLAS (LibTorch's
  // BLAS on Debian) starts its own threads, which at::set_num_threads does
  // not reach, so it is told too where it is loaded.
  if (!device_.is_cpu() || std::getenv("OMP_NUM_THREADS") != nullptr) return;
  SetCpuThreads(1);
  if (is_main_process()) {
    ACCEL_LOG(INFO) << mode
                    << ": 1 thread per process, as the launcher gives each of "
                       "several (OMP_NUM_THREADS is unset); set "
                       "OMP_NUM_THREADS to another count, the same at every "
                       "process count, for the same bits";
  }
}

bool Accelerator::MidStep() const {
  const std::vector<GradientReducer*> reducers =
      state_->prepared.synchronizers();
  return std::any_of(reducers.begin(), reducers.end(),
                     [](const GradientReducer* r) { return r->mid_step(); });
}

void Accelerator::CheckStepsComplete(const char* operation) const {
  for (const GradientReducer* reducer : state_->prepared.synchronizers()) {
    reducer->CheckStepComplete(operation);
  }
}

std::vector<torch::Tensor> Accelerator::SplitMicroBatches(
    const torch::Tensor& tensor, const char* what) const {
  const int micro_batches = options_.invariant_micro_batches;
  if (micro_batches == 0) return {tensor};
  const int count = micro_batches / num_processes();
  const int64_t rows =
      !tensor.defined() || tensor.dim() == 0 ? 0 : tensor.size(0);
  if (rows == 0 || rows % count != 0) {
    throw UsageError(std::string("micro_batches: the batch's ") + what +
                     " has " + std::to_string(rows) +
                     " rows, which do not split into " + std::to_string(count) +
                     " equal micro-batches (invariant_micro_batches=" +
                     std::to_string(micro_batches) + " at " +
                     std::to_string(num_processes()) +
                     (num_processes() == 1 ? " process" : " processes") +
                     "); use a global batch that " +
                     std::to_string(micro_batches) +
                     " divides, with drop_last for a short last batch");
  }
  return tensor.split(rows / count);
}

std::vector<torch::data::Example<>> Accelerator::micro_batches(
    const torch::data::Example<>& batch) const {
  if (options_.invariant_micro_batches == 0) return {batch};
  // A batch without targets (an undefined one) keeps none.
  if (batch.target.defined() && batch.data.defined() &&
      batch.target.dim() > 0 && batch.data.dim() > 0 &&
      batch.target.size(0) != batch.data.size(0)) {
    throw UsageError("micro_batches: the batch's data has " +
                     std::to_string(batch.data.size(0)) +
                     " rows and its target " +
                     std::to_string(batch.target.size(0)) +
                     "; they must have as many to be cut alike");
  }
  const std::vector<torch::Tensor> data = SplitMicroBatches(batch.data, "data");
  std::vector<torch::Tensor> target(data.size());
  if (batch.target.defined())
    target = SplitMicroBatches(batch.target, "target");
  std::vector<torch::data::Example<>> slices;
  for (size_t i = 0; i < data.size(); ++i) {
    slices.push_back({data[i], target[i]});
  }
  return slices;
}

std::vector<torch::Tensor> Accelerator::micro_batches(
    const torch::Tensor& batch) const {
  return SplitMicroBatches(batch, "tensor");
}

}  // namespace accel
