// A program that defines flag names accel uses too, as Accelerate's example
// scripts do (--gradient_accumulation_steps, --mixed_precision), and builds
// its AcceleratorOptions by hand: it links, and what the user gives on the
// command line or in the launch configuration still reaches the
// Accelerator.
//
//   own_flags_program --num_processes=2 --mixed_precision=bf16
#include <gflags/gflags.h>

#include "accel/accelerator.h"

DEFINE_int32(gradient_accumulation_steps, 1, "The program's own.");
DEFINE_string(mixed_precision, "no", "The program's own.");
// As Accelerate's example scripts define it: a default that is not accel's.
DEFINE_string(report_to, "all", "The program's own.");
DEFINE_string(options_mixed_precision, "",
              "When set, the program's AcceleratorOptions say this.");
DEFINE_bool(from_flags, false,
            "Start from AcceleratorOptions::FromFlags() rather than options "
            "built by hand.");

namespace {

int Main(int argc, char** argv) {
  accel::AcceleratorOptions options =
      FLAGS_from_flags ? accel::AcceleratorOptions::FromFlags()
                       : accel::AcceleratorOptions();
  if (!FLAGS_options_mixed_precision.empty()) {
    options.mixed_precision = FLAGS_options_mixed_precision;
  }
  accel::Accelerator accelerator(options);
  accelerator.init_trackers("own_flags");
  accelerator.print("accelerator: gradient_accumulation_steps",
                    accelerator.gradient_accumulation_steps(),
                    "mixed_precision", accelerator.mixed_precision(),
                    "trackers", accelerator.trackers().size(), "on",
                    accelerator.num_processes(),
                    "process(es); program: gradient_accumulation_steps",
                    FLAGS_gradient_accumulation_steps, "mixed_precision",
                    FLAGS_mixed_precision, "report_to", FLAGS_report_to);
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
