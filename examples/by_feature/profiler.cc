// Accelerate's examples/by_feature/profiler.py in C++: each epoch's training
// runs under the profiler that ProfileKwargs (given to the Accelerator)
// configures; the main process prints the operators' table, and with
// --output_trace_dir every process writes its Chrome trace there
// (profile_<process_index>.json, for chrome://tracing or Perfetto).
//
//   bazel run //examples/by_feature:profiler -- --num_processes=2
//       --record_shapes --profile_memory --output_trace_dir=/tmp/traces
//
// Differences: CPU activity only, and no --with_flops (see
// accel/profiler.h); the table shows at most --row_limit rows.
#include "accel/profiler.h"

#include <iostream>

#include "examples/by_feature/common.h"

DEFINE_bool(record_shapes, false, "Record each operator's input shapes.");
DEFINE_bool(profile_memory, false, "Record what each operator allocates.");
DEFINE_bool(with_flops, false, "Python's FLOP counts: refused (none here).");
DEFINE_string(output_trace_dir, "", "Where each process writes its trace.");
DEFINE_int32(row_limit, 20, "Rows of the table (-1: all, as Python's).");

namespace {

int Main(int, char**) {
  if (FLAGS_with_flops) {
    throw accel::UsageError(
        "--with_flops: accel's profiler records CPU times and memory, not "
        "FLOPs");
  }
  // New code: the profiler's options, as the Accelerator's kwargs handler.
  accel::ProfileKwargs profile_kwargs;
  profile_kwargs.record_shapes = FLAGS_record_shapes;
  profile_kwargs.profile_memory = FLAGS_profile_memory;
  profile_kwargs.output_trace_dir = FLAGS_output_trace_dir;
  accel::AcceleratorOptions options = accel::AcceleratorOptions::FromFlags();
  options.kwargs_handlers = {profile_kwargs};
  accel::Accelerator accelerator(options);
  const by_feature::Config config;
  by_feature::Training training(accelerator, config);
  auto& [model, optimizer, train_loader, eval_loader, lr_scheduler] =
      training.prepared;
  for (int epoch = 0; epoch < config.num_epochs; ++epoch) {
    model->train();
    // New code: Python's `with accelerator.profile() as prof:`.
    accel::Profiler prof(accelerator);
    for (auto& batch : train_loader) {
      by_feature::TrainStep(accelerator, training, batch);
    }
    prof.stop();
    if (accelerator.is_main_process()) {
      std::cout << prof.key_averages().table("self_cpu_time_total",
                                             FLAGS_row_limit)
                << std::flush;
    }
    by_feature::PrintEpoch(accelerator, epoch,
                           by_feature::Evaluate(accelerator, training));
  }
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return by_feature::RunScript(argc, argv, Main);
}
