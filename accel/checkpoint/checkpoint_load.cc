// LoadCheckpoint and CheckCheckpoint (checkpoint.h): the checks that come
// before anything changes, then the load itself, of a checkpoint with whole
// weights or with sharded tensors.
#include <ATen/CPUGeneratorImpl.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <sstream>

#include "accel/checkpoint/checkpoint.h"
#include "accel/checkpoint/checkpoint_archive.h"
#include "accel/checkpoint/checkpoint_file.h"
#include "accel/checkpoint/checkpoint_parts.h"
#include "accel/checkpoint/checkpoint_sharded.h"
#include "accel/checkpoint/model_weights.h"
#include "accel/checkpoint/state_dict.h"
#include "accel/core/state_archive.h"
#include "accel/core/tensor_ops.h"
#include "accel/runtime/base/error_report.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"
#include "accel/runtime/base/logging.h"

namespace accel {
namespace {

using checkpoint_internal::Exists;
using checkpoint_internal::HoldsShardedTensors;
using checkpoint_internal::IsSharded;
using checkpoint_internal::Join;
using checkpoint_internal::kLoaderSamplesKey;
using checkpoint_internal::NamedState;
using checkpoint_internal::RandomStatesRole;
using checkpoint_internal::ReadInt;
using checkpoint_internal::ReadModelArchive;
using checkpoint_internal::ReadValue;
using checkpoint_internal::Stateful;
using checkpoint_internal::StatefulKind;
using checkpoint_internal::StatefulKinds;

void Note(const std::string& message) { ACCEL_LOG(INFO) << message; }

// Loads every part from its archive; if one fails, the parts loaded before
// it get their previous state back and CheckpointError names the part.
void LoadAllOrNothing(const std::vector<Stateful>& parts,
                      std::vector<torch::serialize::InputArchive>& archives,
                      const std::string& path) {
  std::vector<std::string> backups;
  for (const Stateful& part : parts) backups.push_back(SaveStateToBytes(part));
  for (size_t i = 0; i < parts.size(); ++i) {
    try {
      parts[i].load(archives[i]);
    } catch (const std::exception&) {
      const std::string reason = DescribeException(std::current_exception());
      for (size_t j = 0; j <= i; ++j) {
        Stateful part = parts[j];
        LoadStateFromBytes(part, backups[j]);
      }
      throw CheckpointError("'" + path + "': " + parts[i].name +
                            " does not match this program's (" + reason + ")");
    }
  }
}

// What this rank reads of a checkpoint, checked: the shared state and, when
// it is there, this rank's random state.
struct CheckedFiles {
  CheckpointFileContents state;
  std::optional<CheckpointFileContents> random;
  std::string state_path;
  std::string random_path;
};

CheckedFiles ReadFiles(const std::string& dir, int rank, int world_size) {
  struct stat info;
  if (stat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    throw CheckpointError("checkpoint folder '" + dir + "' does not exist");
  }
  CheckedFiles files;
  files.state_path = Join(dir, kStateFile);
  if (!Exists(files.state_path)) {
    throw CheckpointError("'" + files.state_path + "' is missing: '" + dir +
                          "' is not a complete accel checkpoint");
  }
  files.state = ReadCheckpointFile(files.state_path, "accelerator_state");
  files.random_path = Join(dir, RandomStatesFile(rank));
  if (Exists(files.random_path)) {
    files.random =
        ReadCheckpointFile(files.random_path, RandomStatesRole(rank));
    const CheckpointIdentity& mine = files.random->identity;
    const CheckpointIdentity& shared = files.state.identity;
    if (mine.run != shared.run || mine.step != shared.step) {
      throw CheckpointError("'" + files.random_path + "' was saved by run " +
                            mine.run + " at step " + std::to_string(mine.step) +
                            ", but '" + files.state_path + "' by run " +
                            shared.run + " at step " +
                            std::to_string(shared.step) +
                            ": the files come from different saves");
    }
  }
  (void)world_size;
  return files;
}

// Whether the checkpoint holds sharded optimizer state that this job can
// load (then in this rank's file); CheckpointError when the sharding does
// not match this job's, naming both.
bool CheckShardedOptimizers(torch::serialize::InputArchive& state,
                            int64_t saved_world,
                            const CheckpointContents& contents, int world_size,
                            const CheckedFiles& files) {
  c10::IValue stage_value;
  const int64_t saved_stage =
      state.try_read("zero_stage", stage_value) && stage_value.isInt()
          ? stage_value.toInt()
          : 0;
  const bool saved = saved_stage > 0;
  const bool wanted = IsSharded(contents, world_size);
  const std::string here = std::to_string(world_size) + " process(es)";
  const std::string there = std::to_string(saved_world) + " process(es)";
  if (saved && !wanted) {
    throw CheckpointError(
        "'" + files.state_path +
        "' holds optimizer state sharded by ZeRO "
        "stage " +
        std::to_string(saved_stage) + " over " + there +
        ", but this job does not shard it (" +
        (world_size == 1 ? std::string("one process shards nothing, "
                                       "whatever its zero_stage")
                         : "zero_stage " + std::to_string(contents.zero_stage) +
                               " at " + here) +
        "); resume with --zero_stage=" + std::to_string(saved_stage) + " at " +
        there);
  }
  if (!saved && wanted) {
    throw CheckpointError(
        "'" + files.state_path +
        "' holds whole optimizer state (saved "
        "without ZeRO at " +
        there + "), but this job shards it (ZeRO stage " +
        std::to_string(contents.zero_stage) + " at " + here +
        "); resume without --zero_stage, or start the sharded run afresh");
  }
  if (!saved) return false;
  if (saved_world != world_size) {
    throw CheckpointError(
        "'" + files.state_path + "' holds optimizer state sharded over " +
        there + " (ZeRO stage " + std::to_string(saved_stage) +
        "), but this job runs " + here +
        "; accel does not re-shard it yet: resume at " + there);
  }
  // Stages 1 and 2 cut the optimizer state into the same shares; stage 3
  // cuts each unit on its own.
  if ((saved_stage == 3) != (contents.zero_stage == 3)) {
    throw CheckpointError(
        "'" + files.state_path +
        "' holds optimizer state sharded by ZeRO stage " +
        std::to_string(saved_stage) + " over " + there +
        ", but this job shards it by stage " +
        std::to_string(contents.zero_stage) +
        (saved_stage == 3 ? " (stage 3 cuts each unit on its own)"
                          : " (stage 3 cuts each unit on its own, stages 1-2 "
                            "all parameters together)") +
        "; resume with --zero_stage=" + std::to_string(saved_stage));
  }
  if (!files.random) {
    throw CheckpointError("'" + files.random_path +
                          "' is missing: it holds "
                          "this rank's shard of the optimizer state (ZeRO "
                          "stage " +
                          std::to_string(saved_stage) + ")");
  }
  return true;
}

}  // namespace

std::string CheckpointProblem::Encode() const {
  return std::to_string(static_cast<int>(kind)) + "\t" + detail;
}

CheckpointProblem CheckpointProblem::Decode(const std::string& text) {
  const size_t tab = text.find('\t');
  const int kind = tab == std::string::npos ? -1 : std::atoi(text.c_str());
  if (kind < 0 || kind > static_cast<int>(Kind::kMixedSaves)) {
    return {Kind::kDamaged, "an unreadable verdict: " + text};
  }
  return {static_cast<Kind>(kind), text.substr(tab + 1)};
}

CheckpointProblem CheckCheckpoint(const std::string& dir, int rank,
                                  int world_size, bool sharded) {
  using Kind = CheckpointProblem::Kind;
  try {
    const std::string state = Join(dir, kStateFile);
    if (!Exists(state)) return {Kind::kMissing, "'" + state + "' is missing"};
    const CheckpointIdentity shared =
        VerifyCheckpointFile(state, "accelerator_state");
    // Sharded tensors: the index, and each rank every world_size-th shard
    // file from its own, header and data checksums: every rank then names
    // the problem (the verdicts are gathered), load_state() passes over a
    // damaged checkpoint for an older one, and a load never stops half done
    // on damaged data. No rank parses every header.
    if (HoldsShardedTensors(dir)) {
      const ShardedStateReader reader = ShardedStateReader::OpenIndex(dir);
      for (int file = rank; file < reader.world_size(); file += world_size) {
        reader.VerifyFile(file);
      }
    }
    const std::string random = Join(dir, RandomStatesFile(rank));
    // A sharded checkpoint loads at any process count: the new ranks have
    // no file of their own (their RNG state is not restored).
    if (sharded && !Exists(random) && !HoldsShardedTensors(dir)) {
      // A job larger than the one that saved finds no file for its new
      // ranks: say how many the folder holds.
      int saved_files = 0;
      for (const std::string& name : ListFolder(dir)) {
        if (IsRandomStatesFile(name)) ++saved_files;
      }
      return {Kind::kMissing,
              "'" + random +
                  "' is missing: under ZeRO it holds this rank's shard of "
                  "the optimizer state (the folder holds the files of " +
                  std::to_string(saved_files) + " rank(s); this job runs " +
                  std::to_string(world_size) + " process(es))"};
    }
    if (Exists(random)) {
      const CheckpointIdentity mine =
          VerifyCheckpointFile(random, RandomStatesRole(rank));
      if (mine.run != shared.run || mine.step != shared.step) {
        return {
            Kind::kMixedSaves,
            "'" + random + "' comes from another save than '" + state + "'"};
      }
    }
    return {};
  } catch (const Error& e) {
    return {Kind::kDamaged, e.what()};
  }
}

namespace {

// The checkpoint's shards, checked against the shared file and against what
// this job needs, before anything changes.
ShardedStateReader OpenShards(const std::string& dir, const CheckedFiles& files,
                              const CheckpointContents& contents) {
  if (!contents.sharded_tensors) {
    throw CheckpointError(
        "'" + dir +
        "' holds sharded tensors (rank-*-of-*.safetensors), but this "
        "program's optimizer keeps state that accel cannot reshard (see "
        "accel/optim/param_state_codec.h); resume with Adam, AdamW, SGD, "
        "Adagrad, RMSprop or AdamWScheduleFree");
  }
  // The files it reads are checked as it reads them (CheckCheckpoint
  // checked them all, shared out among the ranks).
  ShardedStateReader reader = ShardedStateReader::OpenIndex(dir);
  if (reader.run_id() != files.state.identity.run) {
    throw CheckpointError("'" + dir + "': its shard files were saved by run " +
                          reader.run_id() + ", but '" + files.state_path +
                          "' by run " + files.state.identity.run +
                          ": the files come from different saves");
  }
  try {
    contents.sharded_tensors->check(reader);
  } catch (const CheckpointError& e) {
    throw CheckpointError("load_state('" + dir + "'): " + e.what());
  }
  return reader;
}

}  // namespace

namespace {

void LoadFiles(const std::string& dir, int rank, int world_size,
               CheckedFiles& files, bool shards, CheckpointContents& contents) {
  const std::string& path = files.state_path;
  torch::serialize::InputArchive& state = *files.state.archive;
  try {
    const int64_t num_models = ReadInt(state, "num_models", path);
    if (num_models != static_cast<int64_t>(contents.models.size())) {
      throw CheckpointError("'" + path + "' holds " +
                            std::to_string(num_models) +
                            " model(s), but this program prepared " +
                            std::to_string(contents.models.size()));
    }
    // Check everything before changing anything.
    std::optional<ShardedStateReader> reader;
    std::vector<std::vector<torch::Tensor>> model_values;
    if (shards) {
      reader = OpenShards(dir, files, contents);
    } else {
      for (int64_t i = 0; i < num_models; ++i) {
        model_values.push_back(
            ReadModelArchive(state, i, *contents.models[i], path));
      }
    }
    const int64_t saved_world = ReadInt(state, "num_processes", path);
    // Sharded tensors load at any count and stage; other ZeRO checkpoints
    // only where they were saved.
    const bool sharded =
        !shards &&
        CheckShardedOptimizers(state, saved_world, contents, world_size, files);
    std::vector<Stateful> parts;
    std::vector<torch::serialize::InputArchive> archives;
    for (const StatefulKind& kind : StatefulKinds(contents)) {
      const int64_t count = ReadInt(state, "num_" + kind.plural, path);
      if (count != static_cast<int64_t>(kind.parts.size())) {
        throw CheckpointError("'" + path + "' holds " + std::to_string(count) +
                              " " + kind.plural + ", but this program has " +
                              std::to_string(kind.parts.size()));
      }
      for (size_t i = 0; i < kind.parts.size(); ++i) {
        const bool options_only = shards && kind.singular == "optimizer";
        const std::string key =
            (options_only ? "optimizer_options_" : kind.singular + "_") +
            std::to_string(i);
        archives.emplace_back();
        const bool in_rank_file = sharded && kind.singular == "optimizer";
        torch::serialize::InputArchive& source =
            in_rank_file ? *files.random->archive : state;
        if (!source.try_read(key, archives.back())) {
          throw CheckpointError("'" +
                                (in_rank_file ? files.random_path : path) +
                                "' has no " + key);
        }
        parts.push_back(kind.parts[i]);
        parts.back().name = key;
        if (options_only) {
          // The state is in the shards (loaded below).
          torch::optim::Optimizer* optimizer = contents.optimizers[i];
          parts.back().save = [optimizer](auto& archive) {
            checkpoint_internal::SaveOptimizerOptions(*optimizer, archive);
          };
          parts.back().load = [optimizer, path](auto& archive) {
            checkpoint_internal::LoadOptimizerOptions(*optimizer, archive,
                                                      path);
          };
        }
      }
    }
    // An older accel recorded batches per rank ("loader_positions").
    c10::IValue positions_value;
    const bool in_samples = state.try_read(kLoaderSamplesKey, positions_value);
    if (!in_samples) {
      positions_value = ReadValue(state, "loader_positions", path);
    }
    std::vector<int64_t> positions;
    if (positions_value.isIntList()) positions = positions_value.toIntVector();
    if (positions.size() != 2 * contents.loaders.size()) {
      throw CheckpointError(
          "'" + path + "' holds " + std::to_string(positions.size() / 2) +
          " data loader position(s), but this program "
          "prepared " +
          std::to_string(contents.loaders.size()) + " data loader(s)");
    }
    torch::Tensor rng_state;
    if (files.random) {
      if (!files.random->archive->try_read("cpu_rng", rng_state)) {
        throw CheckpointError("'" + files.random_path +
                              "' has no cpu_rng entry");
      }
    } else if (saved_world == world_size) {
      Note("'" + files.random_path + "' is missing (rank " +
           std::to_string(rank) +
           " wrote none: a checkpoint of an older accel, or a removed file); "
           "its RNG state is not restored");
    }

    // Optimizers, schedulers, the scaler and registered objects can only be
    // checked by loading them: all of them load, or none stays changed.
    LoadAllOrNothing(parts, archives, path);
    torch::NoGradGuard no_grad;
    if (shards) contents.sharded_tensors->load(*reader);
    for (int64_t i = 0; i < num_models && !shards; ++i) {
      const auto targets = NamedState(*contents.models[i]);
      for (size_t j = 0; j < targets.size(); ++j) {
        torch::Tensor target = targets[j].second;
        target.copy_(model_values[i][j]);
      }
    }
    for (size_t i = 0; i < contents.loaders.size(); ++i) {
      if (in_samples) {
        contents.loaders[i]->Restore(positions[2 * i], positions[2 * i + 1]);
      } else {
        contents.loaders[i]->RestoreBatches(positions[2 * i],
                                            positions[2 * i + 1], saved_world);
      }
    }
    contents.step = files.state.identity.step;
    if (rng_state.defined()) {
      // A Generator is a handle: the copy shares torch's default generator.
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(rng_state);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception&) {
    // A file that verified but does not read as this accel wrote it.
    throw CheckpointError("'" + path + "' cannot be read: " +
                          DescribeException(std::current_exception()));
  }
}

bool HoldsShardedTensors(CheckpointFileContents& state) {
  c10::IValue value;
  return state.archive->try_read("sharded_tensors", value) && value.isBool() &&
         value.toBool();
}

}  // namespace

void LoadCheckpoint(const std::string& dir, int rank, int world_size,
                    CheckpointContents& contents) {
  CheckedFiles files = ReadFiles(dir, rank, world_size);
  const bool shards = HoldsShardedTensors(files.state);
  const auto load = [&] {
    LoadFiles(dir, rank, world_size, files, shards, contents);
  };
  if (!shards && contents.with_whole_models) {
    contents.with_whole_models(load);
  } else {
    load();
  }
}

}  // namespace accel
