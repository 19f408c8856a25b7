// The seed's data-loader snippet: each process runs a "model" (x * 2) on its
// share of the batches, the predictions of every step are gathered, and the
// main process prints all of them, in dataset order, each sample once
// (gather_for_metrics drops what even_batches repeated to fill the last
// step on every process).
//
//   bazel run //examples:gather_loop_demo -- --num_processes=2
//   Full predictions: tensor([0, 2, 4, 6, 8, 10, 12, 14])
#include "accel/accelerator.h"
#include "accel/core/tensor_format.h"
#include "accel/runtime/launch/program.h"

DEFINE_int32(samples, 8, "Size of the data set (the numbers 0, 1, ...).");
DEFINE_int32(batch_size, 2, "Batch size of each process.");

namespace {

class Numbers {
 public:
  torch::Tensor get(size_t i) { return torch::tensor(static_cast<int64_t>(i)); }
  size_t size() const { return static_cast<size_t>(FLAGS_samples); }
};

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  accel::Accelerator accelerator;
  accel::DataLoaderOptions options;
  options.batch_size = static_cast<size_t>(FLAGS_batch_size);
  accel::DataLoader<Numbers> data(Numbers(), options);
  auto dataloader = accelerator.prepare(data);

  std::vector<torch::Tensor> all_predictions;
  for (auto& batch : dataloader) {
    torch::Tensor predictions = batch * 2;
    torch::Tensor gathered = accelerator.gather_for_metrics(predictions);
    if (accelerator.is_main_process()) all_predictions.push_back(gathered);
  }
  if (accelerator.is_main_process()) {
    std::printf("Full predictions: %s\n",
                accel::Repr(torch::cat(all_predictions)).c_str());
  }
  return 0;
}
