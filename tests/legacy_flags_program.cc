// A program written before accel registered its flags at start-up: it
// reads them as gflags variables (FLAGS_gradient_accumulation_steps, ...),
// which still compile and hold the values given (the deprecated spellings
// of accel/runtime/launch/program_flags.h).
//
//   legacy_flags_program --mixed_precision=bf16
#include <cstdio>

#include "accel/accelerator.h"

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  std::printf(
      "legacy: num_processes %d mixed_precision %s "
      "gradient_accumulation_steps %d collective_checks %d report_to '%s' "
      "timeout_s %d\n",
      FLAGS_num_processes, FLAGS_mixed_precision.c_str(),
      FLAGS_gradient_accumulation_steps, FLAGS_collective_checks ? 1 : 0,
      FLAGS_report_to.c_str(), FLAGS_timeout_s);
  accel::Accelerator accelerator;
  accelerator.print(
      "accelerator: mixed_precision", accelerator.mixed_precision(),
      "gradient_accumulation_steps", accelerator.gradient_accumulation_steps());
  return 0;
}
