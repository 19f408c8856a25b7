// save_state / load_state: the checkpoint format behind Accelerator.
//
//   accel::CheckpointContents contents{models, optimizers, loaders, step};
//   accel::SaveCheckpoint("trained_model", rank, world_size, is_main,
//   contents); accel::LoadCheckpoint("trained_model", rank, world_size,
//   contents);
//
// Layout of a checkpoint folder (LibTorch archives, torch::serialize):
//   accelerator_state.pt    written by the main process: format version,
//                           step, num_processes, every model's parameters and
//                           buffers by name (model_0, model_1, ...), every
//                           optimizer's state (optimizer_0, ...), every
//                           scheduler's (scheduler_0, ...), the fp16 loss
//                           scaler's, every prepared data loader's epoch and
//                           the samples of it done (by all ranks, so any
//                           process count resumes there), and every object
//                           registered for checkpointing (object_0, ...).
//   random_states_<r>.pt    written by rank r: the step and that rank's RNG
//                           state (CPU generator); under ZeRO (zero_stage >
//                           0, several processes) also rank r's shard of
//                           every optimizer's state (optimizer_0, ...). Such
//                           a checkpoint loads at the same number of
//                           processes only (CheckpointError naming both).
//   rank-<r>-of-<N>.safetensors, sharded_state.index.json
//                           under ZeRO (zero_stage > 0, several processes)
//                           when every optimizer's state is one
//                           param_state_codec.h knows: each rank's pieces
//                           of every model's weights and every optimizer's
//                           state (sharded_state.h), in place of the
//                           weights and optimizer state above; the shared
//                           file then keeps the optimizers' param-group
//                           options and the models' names. Such a
//                           checkpoint loads at any process count and any
//                           stage 0-3, each rank reading only what it
//                           holds.
// Every rank calls save_state: it returns on each once every file is
// written.
// Each file is written beside its final name, flushed to disk, then renamed
// over it, so a crash mid-save leaves the previous file whole. Loading
// checks everything (names, shapes, dtypes, counts) before changing anything
// and raises CheckpointError naming the file and the mismatch. As in
// Accelerate, a missing random_states file is only reported (a checkpoint
// of an older accel, where only the main process had to save).
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accel/checkpoint/sharded_state.h"
#include "accel/data/data_loader_state.h"
#include "accel/optim/grad_scaler.h"
#include "accel/optim/scheduler.h"

namespace accel {

// Anything with a save/load pair over LibTorch archives
// (Accelerator::register_for_checkpointing).
struct CheckpointObject {
  std::function<void(torch::serialize::OutputArchive&)> save;
  std::function<void(torch::serialize::InputArchive&)> load;
};

// The models' weights and the optimizers' state as this rank holds them,
// for sharded checkpoints (see above): the Accelerator, which knows how
// ZeRO cut them, fills it in.
struct ShardedTensors {
  // This rank's pieces: "model_<m>/<name>" (the state_dict's names, every
  // element of every entry in exactly one rank's pieces) and
  // "optimizer_<o>/<parameter>/<key>" (param_state_codec.h; a count is a
  // one-element int64 tensor).
  std::function<std::vector<ShardPiece>()> pieces;
  // Whether the checkpoint holds everything this job needs, with the
  // right shapes; CheckpointError naming the tensor. Changes nothing.
  std::function<void(const ShardedStateReader&)> check;
  // Reads this rank's part into the models and optimizers (after check,
  // on every rank: it may run collectives).
  std::function<void(const ShardedStateReader&)> load;
  // Model m's state_dict names, in order (ReadCheckpointWeights).
  std::vector<std::vector<std::string>> model_names;
  // Every rank file's metadata (tensor_shares.h's splits).
  std::map<std::string, std::string> metadata;
};

struct CheckpointContents {
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  std::vector<torch::optim::Optimizer*> optimizers;
  std::vector<std::shared_ptr<LRScheduler>> schedulers;
  std::vector<std::shared_ptr<DataLoaderState>> loaders;
  std::shared_ptr<GradScaler> scaler;  // fp16 only.
  std::vector<CheckpointObject> objects;
  int64_t step = 0;
  // The run that saves (shared by its ranks): a checkpoint's files must
  // all come from one save.
  std::string run_id;
  // ZeRO stage of the optimizers (accel/parallel/zero.h): with several
  // processes and a stage above 0, each rank's optimizer state is its shard,
  // saved in its own file.
  int zero_stage = 0;
  // Saves at several processes: every rank calls it once it wrote (true)
  // or failed to write (false) its file, and again once the main process
  // wrote the shared file (the others pass true); it returns whether every
  // rank did: -1, else the lowest rank that failed. So the shared file,
  // which marks the checkpoint complete, comes last, and no rank returns
  // before it is there. Without it (a program calling SaveCheckpoint
  // itself) ranks do not wait for each other.
  std::function<int(bool)> all_ranks_wrote;
  // Set when every optimizer's state is one param_state_codec.h knows:
  // then a ZeRO job at several processes saves sharded tensors, and any
  // job loads them.
  std::optional<ShardedTensors> sharded_tensors;
  // Runs a save or load that reads or writes the models' weights whole (a
  // checkpoint without sharded tensors) with every parameter whole on this
  // rank: under ZeRO stage 3 the Accelerator gathers the units around it.
  // Every rank calls it at the same point. Unset: the work just runs.
  std::function<void(const std::function<void()>&)> with_whole_models;
};

inline constexpr const char* kStateFile = "accelerator_state.pt";
std::string RandomStatesFile(int rank);

// Writes the shared file when `write_shared`, and this rank's RNG file.
void SaveCheckpoint(const std::string& dir, int rank, int world_size,
                    bool write_shared, const CheckpointContents& contents);

// Why a rank cannot load a checkpoint, as ranks compare it.
struct CheckpointProblem {
  enum class Kind {
    kNone,        // It can load it.
    kMissing,     // accelerator_state.pt is not there (on this rank).
    kDamaged,     // A file does not verify (truncated, corrupt, foreign).
    kMixedSaves,  // Its files come from different saves.
  };
  Kind kind = Kind::kNone;
  std::string detail;  // The message ("'.../accelerator_state.pt' is ...").
  explicit operator bool() const { return kind != Kind::kNone; }
  // For ranks to exchange it (object collectives), and back.
  std::string Encode() const;
  static CheckpointProblem Decode(const std::string& text);
};

// Whether this rank can load `dir`: its files are there, intact and from
// one save (without parsing the archives).
// `sharded`: this job shards its optimizers (ZeRO), so this rank's
// random_states file holds its shard and must be there.
CheckpointProblem CheckCheckpoint(const std::string& dir, int rank,
                                  int world_size, bool sharded = false);

// Model `index`'s weights as the checkpoint in `dir` holds them (verified),
// by name in state_dict order ("fc.weight", buffers too): what
// `accel-merge-weights` writes as model.safetensors. Every stage keeps the
// whole weights in the shared file (ZeRO-3 gathers them to save).
// CheckpointError naming the file for a missing, damaged or foreign file,
// or a model it does not hold.
std::vector<std::pair<std::string, torch::Tensor>> ReadCheckpointWeights(
    const std::string& dir, int64_t index = 0);

// Restores `contents` (and this rank's RNG) from `dir`.
void LoadCheckpoint(const std::string& dir, int rank, int world_size,
                    CheckpointContents& contents);

// Whether accel writes files of this name into a checkpoint folder:
// accelerator_state.pt, random_states_<r>.pt, the safetensors files of
// save_model, and the temporaries of each ("<name>.partial.<pid>.<n>").
bool IsCheckpointFileName(const std::string& name);
// random_states_<r>.pt, for a rank r.
bool IsRandomStatesFile(const std::string& name);

}  // namespace accel
