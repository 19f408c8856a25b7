// The seed's gather snippet: every process holds [1, 2, 3]; gather
// concatenates them in rank order on every process, and the main process
// prints the result.
//
//   bazel run //examples:gather_demo -- --num_processes=2
//   Gathered tensor: tensor([1, 2, 3, 1, 2, 3])
#include "accel/accelerator.h"
#include "accel/core/tensor_format.h"
#include "accel/runtime/launch/program.h"

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  accel::Accelerator accelerator;

  // A local batch on every device (the model's output, say).
  torch::Tensor local_tensor =
      torch::tensor({1, 2, 3}).to(accelerator.device());

  // Every process receives all of them.
  torch::Tensor gathered_tensor = accelerator.gather(local_tensor);

  if (accelerator.is_main_process()) {
    std::printf("Gathered tensor: %s\n", accel::Repr(gathered_tensor).c_str());
  }
  return 0;
}
