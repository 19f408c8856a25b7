// accel merge-weights: a checkpoint's model weights as one model.safetensors
// (or Hugging Face's shards and index), as `accelerate merge-weights` turns
// an FSDP checkpoint into weights a single process loads. The file equals
// what DDP's save_model writes for the same parameters.
//
//   $ bazel run //tools:merge_weights -- run/checkpoints/checkpoint_3 out
//   $ accel-merge-weights CHECKPOINT OUT [--model=1] [--max_shard_size=5GB]
//
// A checkpoint of whole weights keeps them in its shared file; a sharded
// one (accel/checkpoint/sharded_state.h) in the ranks' pieces, which
// merging joins, tensor-parallel shares included (tensor_shares.h),
// verified; no optimizer state is written.
#include <gflags/gflags.h>

#include <cstdio>
#include <set>
#include <string>

#include "accel/checkpoint/checkpoint.h"
#include "accel/checkpoint/model_weights.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/launch/help.h"
#include "accel/runtime/launch/program.h"

DEFINE_int32(model, 0, "Which prepared model (in prepare order).");
DEFINE_string(max_shard_size, "10GB",
              "Largest safetensors file; more weights are split into shards "
              "with model.safetensors.index.json.");

namespace {

int Main(int argc, char** argv) {
  if (argc != 3) {
    throw accel::UsageError(
        "usage: " + accel::ProgramName(argv[0]) +
        " CHECKPOINT OUT [--model=N] "
        "[--max_shard_size=SIZE]: CHECKPOINT is a folder save_state wrote, "
        "OUT the folder for model.safetensors");
  }
  if (std::string(argv[2]).empty()) {
    throw accel::UsageError(
        "merge-weights: OUT is empty: give the folder "
        "for model.safetensors");
  }
  accel::EnterUserDirectory();  // Under `bazel run`, relative paths.
  const auto weights = accel::ReadCheckpointWeights(argv[1], FLAGS_model);
  const auto written =
      accel::SaveModelWeights(weights, argv[2], FLAGS_max_shard_size);
  std::printf("merged %zu tensors of model %d from %s into", weights.size(),
              FLAGS_model, argv[1]);
  for (const std::string& path : written) std::printf(" %s", path.c_str());
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string name = accel::ProgramName(argv[0]);
  gflags::SetUsageMessage(
      name +
      " CHECKPOINT OUT [--model=N] [--max_shard_size=SIZE]\n\n"
      "Writes a checkpoint's model weights (CHECKPOINT: a folder save_state "
      "wrote, at any\nZeRO stage) as OUT/model.safetensors, or Hugging Face's "
      "shards with their index,\nas accelerate merge-weights does; "
      "accel::LoadModelWeightsInto reads them back.");
  // Its own flags, not the 252 of the LibTorch it links.
  const std::set<std::string> own = {"model", "max_shard_size"};
  accel::PrintHelpAndExitIfAsked(argc, argv, &own);
  accel::RejectUnknownFlags(argc, argv, &own);
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return accel::RunAndReportErrors(Main, argc, argv);
}
