// find_executable_batch_size under a memory cap (a measurement, not a
// test): where the search ends with accel's reuse of freed host memory on
// and off, min/median/max over repetitions in the same run. Kept memory
// must not make the search stop early: before accel returned it to the
// system on a retry, a 300 MB cap ended searches at batch 63-87 with reuse
// against 186 without.
//
//   bazel run -c opt //tools/bench:batch_size_search
//   bazel run -c opt //tools/bench:batch_size_search -- --cap_mb=300
//       --repetitions=5 --processes=2   (one line)
//
// Each rank caps its private writable memory (RLIMIT_DATA, what malloc's
// heap and mmap draw on; the shared-memory transport is not in it) at what
// it uses once the Accelerator is up plus --cap_mb, then searches from
// --starting_batch_size with 3 SGD steps a try of --layers layers that
// scale --width features by learned weights and apply ReLU (big activations,
// little compute). A try runs out of memory when LibTorch's allocator cannot
// get its activations.
#include <cstdio>
#include <string>

#include "accel/memory.h"
#include "accel/runtime/launch/program.h"
#include "tests/memory_cap.h"
#include "tools/bench/driver.h"

DEFINE_bool(worker, false, "Run one search (the driver starts these).");
DEFINE_int32(cap_mb, 300, "Private memory a rank may add to what it has.");
DEFINE_int32(starting_batch_size, 1024, "The search's first batch size.");
DEFINE_int32(layers, 4, "Layers of the model.");
DEFINE_int32(width, 65536, "Features of each layer.");
DEFINE_int32(repetitions, 3, "Searches per setting.");
DEFINE_int32(processes, 2, "Processes of each search.");

namespace {

int Worker() {
  accel::Accelerator accelerator(accel::AcceleratorOptions::FromFlags());
  const accel::testing::DataLimit cap(static_cast<uint64_t>(FLAGS_cap_mb)
                                      << 20);
  int tries = 0;
  const int64_t batch_size = accel::find_executable_batch_size(
      accelerator,
      [&](int64_t batch_size) {
        ++tries;
        accel::testing::TrainScaleModel(accelerator, {.batch_size = batch_size,
                                                      .layers = FLAGS_layers,
                                                      .width = FLAGS_width});
        return batch_size;
      },
      FLAGS_starting_batch_size);
  if (accelerator.is_main_process()) {
    std::printf("{\"batch_size\": %lld, \"tries\": %d}\n",
                static_cast<long long>(batch_size), tries);
  }
  return 0;
}

int Driver() {
  std::printf(
      "find_executable_batch_size, %d processes, cap %d MB a rank, "
      "%d x relu(x * w) over %d features, from batch %d, %d "
      "repetitions\n\n",
      FLAGS_processes, FLAGS_cap_mb, FLAGS_layers, FLAGS_width,
      FLAGS_starting_batch_size, FLAGS_repetitions);
  std::printf("%-22s %-22s %-16s\n", "reuse_host_memory", "batch size found",
              "tries");
  std::printf("%-22s %-22s %-16s\n", "", "min/median/max", "min/median/max");
  for (const char* reuse : {"true", "false"}) {
    accel::bench::Spread found, tries;
    for (int i = 0; i < FLAGS_repetitions; ++i) {
      const accel::bench::Results r = accel::bench::RunAndParse(
          std::string("reuse=") + reuse,
          accel::bench::SelfPath() +
              " --worker --num_processes=" + std::to_string(FLAGS_processes) +
              " --main_process_port=0 --reuse_host_memory=" + reuse +
              " --cap_mb=" + std::to_string(FLAGS_cap_mb) +
              " --starting_batch_size=" +
              std::to_string(FLAGS_starting_batch_size) +
              " --layers=" + std::to_string(FLAGS_layers) +
              " --width=" + std::to_string(FLAGS_width));
      if (r.count("batch_size") == 0) continue;
      found.values.push_back(r.at("batch_size"));
      tries.values.push_back(r.at("tries"));
    }
    std::printf("%-22s %-22s %-16s\n", reuse,
                accel::bench::Plain(found, "%.0f").c_str(),
                accel::bench::Plain(tries, "%.0f").c_str());
  }
  return 0;
}

int Main(int, char**) { return FLAGS_worker ? Worker() : Driver(); }

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
