// The seed's gather snippet: every process holds [1, 2, 3] and every process
// receives all of them, concatenated in rank order.
//
//   bazel run //examples:gather_demo -- --num_processes=2
#include "accel/accelerator.h"
#include "accel/runtime/program.h"

namespace {

int Main(int argc, char** argv) {
  accel::Accelerator accelerator;
  torch::Tensor tensor = torch::tensor({1, 2, 3});
  torch::Tensor gathered = accelerator.gather(tensor);
  std::ostringstream line;
  line << "Process " << accelerator.process_index() << " gathered "
       << gathered.sizes() << ": [";
  for (int64_t i = 0; i < gathered.numel(); ++i) {
    line << (i ? ", " : "") << gathered[i].item<int64_t>();
  }
  std::printf("%s]\n", line.str().c_str());
  std::fflush(stdout);
  accelerator.wait_for_everyone();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
