// accel estimate-memory: how much memory a process needs for a model's
// training state at each ZeRO stage, process count and mixed precision, as
// `accelerate estimate-memory` tells it for Hugging Face models, from the
// docs/parallelism.md's table of bytes per parameter (arithmetic in
// memory_estimate.h).
//
//   $ bazel run //tools:estimate_memory -- --parameters=1.3B
//   $ accel-estimate-memory --model=trained_model --num_processes=2,4
//   $ accel-estimate-memory --parameters=7B --mixed_precision=bf16 --units=32
//
// --model reads only the safetensors headers of a model.safetensors file, a
// model.safetensors.index.json or a folder save_model wrote, so any size
// is counted in a moment.

// This tool's --num_processes is a list, not accel's int32 flag of the name
// (see program_flags.h).
#define ACCEL_NO_LEGACY_FLAG_NAMES

#include <gflags/gflags.h>

#include <cstdio>
#include <exception>
#include <set>
#include <string>

#include "accel/runtime/base/error_report.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/launch/help.h"
#include "accel/runtime/launch/program.h"
#include "tools/memory_estimate.h"

DEFINE_string(parameters, "",
              "The model's parameter count: 350000, 125M, 1.3B, 7B (K, M, B "
              "or G); or give --model.");
DEFINE_string(model, "",
              "A model.safetensors file, a model.safetensors.index.json, or "
              "a folder save_model wrote: its parameters are counted from "
              "the headers.");
DEFINE_string(num_processes, "1,2,4,8",
              "The process counts to show, comma-separated.");
DEFINE_string(mixed_precision, "all", "no, bf16, fp16, or all of them.");
DEFINE_int32(units, 0,
             "Stage 3's units (L), for its 12/L bytes per parameter during "
             "backward; 0 leaves them out.");

namespace {

const std::set<std::string> kFlags = {"parameters", "model", "num_processes",
                                      "mixed_precision", "units"};

// The tool's own flags, parsed here rather than by gflags: a mistake is one
// "error:" line and exit code 2 (gflags exits 1 in its own words), and no
// flag of the libraries linked in (LibTorch's) is taken.
void ParseFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.size() < 2 || arg[0] != '-') {
      throw accel::UsageError(
          "unexpected argument '" + arg +
          "': accel-estimate-memory takes only flags (--help "
          "lists them)");
    }
    std::string name = arg.substr(arg.find_first_not_of('-'));
    std::string value;
    const size_t equals = name.find('=');
    const bool has_value = equals != std::string::npos;
    if (has_value) {
      value = name.substr(equals + 1);
      name.resize(equals);
    }
    if (kFlags.count(name) == 0) {
      throw accel::UsageError("accel-estimate-memory has no flag --" + name +
                              " (--help lists them)");
    }
    if (!has_value) {
      if (i + 1 == argc) {
        throw accel::UsageError("--" + name + " needs a value");
      }
      value = argv[++i];
    }
    if (gflags::SetCommandLineOption(name.c_str(), value.c_str()).empty()) {
      throw accel::UsageError(
          "--" + name + ": expected a whole number, found '" + value + "'");
    }
  }
}

int Estimate(int argc, char** argv) {
  namespace estimate = accel::memory_estimate;
  estimate::EstimateOptions options;
  estimate::Model model;
  try {
    ParseFlags(argc, argv);
    if (FLAGS_parameters.empty() == FLAGS_model.empty()) {
      throw accel::UsageError(
          "give either --parameters=N (e.g. 1.3B) or --model=PATH, found " +
          std::string(FLAGS_model.empty() ? "neither" : "both"));
    }
    options.process_counts = estimate::ParseProcessCounts(FLAGS_num_processes);
    options.precisions = estimate::ParsePrecisions(FLAGS_mixed_precision);
    if (FLAGS_units < 0) {
      throw accel::UsageError(
          "--units: expected the number of stage-3 units (0 leaves them "
          "out), found " +
          std::to_string(FLAGS_units));
    }
    options.units = FLAGS_units;
    if (!FLAGS_parameters.empty()) {
      model =
          estimate::ModelOfSize(estimate::ParseParameterCount(FLAGS_parameters),
                                "--parameters=" + FLAGS_parameters);
    } else {
      accel::EnterUserDirectory();  // Under `bazel run`, the user's paths.
      model = estimate::ModelFromWeights(FLAGS_model);
    }
  } catch (const accel::UsageError&) {
    accel::ReportException(std::current_exception());
    return 2;
  }
  std::fputs(estimate::Report(model, options).c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "accel-estimate-memory --parameters=N | --model=PATH "
      "[--num_processes=1,2,4,8] [--mixed_precision=no|bf16|fp16|all] "
      "[--units=L]");
  accel::PrintHelpAndExitIfAsked(argc, argv, &kFlags);
  return accel::RunAndReportErrors(Estimate, argc, argv);
}
