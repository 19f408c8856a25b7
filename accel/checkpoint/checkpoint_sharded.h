// Private to accel/checkpoint: the parts of a sharded checkpoint
// (checkpoint.h) beside the shared file: each rank's shard file and the
// index (sharded_state.h), the optimizers' param-group options that the
// shared file keeps in place of their state, and the models' names.
//
//   written.push_back(WriteRankShards(dir, rank, world_size, contents));
//   ... every rank wrote ...
//   written.push_back(WriteShardsIndex(dir, world_size, contents.run_id));
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <string>
#include <vector>

#include "accel/checkpoint/checkpoint.h"

namespace accel::checkpoint_internal {

// "rank-00001-of-00004.safetensors", of any process count.
bool IsShardFileName(const std::string& name);

// Whether `dir` holds a sharded checkpoint's index.
bool HoldsShardedTensors(const std::string& dir);

// Whether this save writes sharded tensors: several processes (DDP or
// ZeRO) training with state the Accelerator can cut
// (contents.sharded_tensors).
bool SavesShardedTensors(const CheckpointContents& contents, int world_size);

// This rank's shard file; returns its path. Shard files of another process
// count in `dir` (an earlier save into the same folder) go first.
std::string WriteRankShards(const std::string& dir, int rank, int world_size,
                            const CheckpointContents& contents);
// The index, once every rank wrote; returns its path.
std::string WriteShardsIndex(const std::string& dir, int world_size,
                             const std::string& run_id);

// An optimizer's param groups' options (lr, betas, weight decay... as a
// schedule left them), without its state.
void SaveOptimizerOptions(const torch::optim::Optimizer& optimizer,
                          torch::serialize::OutputArchive& groups);
// Puts saved options in place (the optimizer's own options type reads
// them); CheckpointError naming `path` when the group counts differ.
void LoadOptimizerOptions(torch::optim::Optimizer& optimizer,
                          torch::serialize::InputArchive& groups,
                          const std::string& path);

// The shared file's list of model `index`'s names; CheckpointError naming
// `path` when it is not there.
std::vector<std::string> ReadModelNames(torch::serialize::InputArchive& state,
                                        int64_t index, const std::string& path);
void WriteModelNames(torch::serialize::OutputArchive& state, int64_t index,
                     const std::vector<std::string>& names);

}  // namespace accel::checkpoint_internal
