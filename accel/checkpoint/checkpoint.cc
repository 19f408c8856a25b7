#include "accel/checkpoint/checkpoint.h"

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
namespace checkpoint_internal {

const char* const kLoaderSamplesKey = "loader_samples";

std::string RandomStatesRole(int rank) {
  return "random_states_" + std::to_string(rank);
}

// LibTorch's Optimizer::load restores each parameter's state (moments,
// step counts) but leaves every param group's options as the optimizer was
// built, though save() wrote them: betas, momentum, weight decay, eps and
// whatever a schedule or the program changed would come back wrong. Read
// each group's options into a copy of its own (so any optimizer's options
// type reads its own fields) and put them in place.
void LoadOptimizer(torch::optim::Optimizer& optimizer,
                   torch::serialize::InputArchive& archive) {
  optimizer.load(archive);
  torch::serialize::InputArchive groups;
  if (!archive.try_read("param_groups", groups)) return;
  auto& param_groups = optimizer.param_groups();
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> restored;
  for (size_t i = 0; i < param_groups.size(); ++i) {
    torch::serialize::InputArchive group;
    torch::serialize::InputArchive options;
    groups.read("param_groups/" + std::to_string(i), group);
    group.read("options", options);
    restored.push_back(param_groups[i].options().clone());
    restored.back()->serialize(options);
  }
  for (size_t i = 0; i < param_groups.size(); ++i) {
    param_groups[i].set_options(std::move(restored[i]));
  }
}

std::vector<StatefulKind> StatefulKinds(const CheckpointContents& contents) {
  std::vector<StatefulKind> kinds = {{"optimizer", "optimizers", {}},
                                     {"scheduler", "schedulers", {}},
                                     {"scaler", "scalers", {}},
                                     {"object", "objects", {}}};
  for (torch::optim::Optimizer* optimizer : contents.optimizers) {
    kinds[0].parts.push_back({"", [=](auto& a) { optimizer->save(a); },
                              [=](auto& a) { LoadOptimizer(*optimizer, a); }});
  }
  for (const auto& scheduler : contents.schedulers) {
    LRScheduler* s = scheduler.get();
    kinds[1].parts.push_back(
        {"", [=](auto& a) { s->save(a); }, [=](auto& a) { s->load(a); }});
  }
  if (GradScaler* scaler = contents.scaler.get()) {
    kinds[2].parts.push_back({"", [=](auto& a) { scaler->save(a); },
                              [=](auto& a) { scaler->load(a); }});
  }
  for (const CheckpointObject& object : contents.objects) {
    kinds[3].parts.push_back({"", object.save, object.load});
  }
  return kinds;
}

bool IsSharded(const CheckpointContents& contents, int world_size) {
  return contents.zero_stage > 0 && world_size > 1 &&
         !contents.optimizers.empty();
}

}  // namespace checkpoint_internal

namespace {

using checkpoint_internal::Exists;
using checkpoint_internal::IsSharded;
using checkpoint_internal::Join;
using checkpoint_internal::kLoaderSamplesKey;
using checkpoint_internal::RandomStatesRole;
using checkpoint_internal::SaveModelArchive;
using checkpoint_internal::StatefulKind;
using checkpoint_internal::StatefulKinds;

}  // namespace

std::string RandomStatesFile(int rank) {
  return "random_states_" + std::to_string(rank) + ".pt";
}

bool IsRandomStatesFile(const std::string& name) {
  const std::string prefix = "random_states_";
  const std::string suffix = ".pt";
  if (name.size() <= prefix.size() + suffix.size() ||
      name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return false;
  }
  const std::string digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  return digits.find_first_not_of("0123456789") == std::string::npos;
}

namespace {

// The number r of random_states_<r>.pt (IsRandomStatesFile), or -1 when it
// does not fit an int.
int RandomStatesRank(const std::string& name) {
  const std::string digits = name.substr(14, name.size() - 14 - 3);
  if (digits.size() > 9) return -1;
  return std::stoi(digits);
}

// The main process's file (kStateFile), written last: it marks the
// checkpoint complete. `written` and `last_complete` tell the caller what
// to remove if this fails.
void WriteSharedFile(const std::string& dir, int world_size, bool sharded,
                     bool shards, const CheckpointContents& contents,
                     const CheckpointIdentity& base,
                     std::vector<std::string>* written, bool* last_complete) {
  // A save at fewer processes than an earlier one into the same folder:
  // the extra ranks' files are of that save, and a later load at the
  // larger count would refuse them. Gone before the shared file makes the
  // checkpoint complete.
  for (const std::string& name : ListFolder(dir)) {
    if (!IsRandomStatesFile(name)) continue;
    const int other = RandomStatesRank(name);
    if (other < 0 || other >= world_size) {
      std::remove(Join(dir, name).c_str());
    }
  }
  // An earlier sharded save into this folder: its index would speak for
  // files this save does not write.
  if (!shards) {
    std::remove(Join(dir, kShardIndexName).c_str());
    for (const std::string& name : ListFolder(dir)) {
      if (checkpoint_internal::IsShardFileName(name)) {
        std::remove(Join(dir, name).c_str());
      }
    }
  }
  torch::serialize::OutputArchive state;
  state.write("num_processes", c10::IValue(int64_t{world_size}));
  state.write("sharded_tensors", c10::IValue(shards));
  state.write("zero_stage",
              c10::IValue(int64_t{sharded ? contents.zero_stage : 0}));
  state.write("num_models", c10::IValue(int64_t(contents.models.size())));
  for (size_t i = 0; i < contents.models.size(); ++i) {
    if (shards) {
      // The weights are in the ranks' shard files.
      checkpoint_internal::WriteModelNames(
          state, i, contents.sharded_tensors->model_names.at(i));
      continue;
    }
    auto model = SaveModelArchive(*contents.models[i]);
    state.write("model_" + std::to_string(i), model);
  }
  for (size_t i = 0; shards && i < contents.optimizers.size(); ++i) {
    torch::serialize::OutputArchive options;
    checkpoint_internal::SaveOptimizerOptions(*contents.optimizers[i], options);
    state.write("optimizer_options_" + std::to_string(i), options);
  }
  for (const StatefulKind& kind : StatefulKinds(contents)) {
    state.write("num_" + kind.plural, c10::IValue(int64_t(kind.parts.size())));
    // Sharded optimizer state is in each rank's file (its random_states, or
    // its shard file with the options above).
    if ((sharded || shards) && kind.singular == "optimizer") continue;
    for (size_t i = 0; i < kind.parts.size(); ++i) {
      torch::serialize::OutputArchive archive;
      kind.parts[i].save(archive);
      state.write(kind.singular + "_" + std::to_string(i), archive);
    }
  }
  // Per loader: the epoch to run next and the samples of it done (over
  // all ranks, so that any number of processes can resume there).
  c10::List<int64_t> positions;
  for (const auto& loader : contents.loaders) {
    const auto [epoch, done] = loader->Checkpoint();
    positions.push_back(epoch);
    positions.push_back(done);
  }
  state.write(kLoaderSamplesKey, c10::IValue(positions));
  CheckpointIdentity id = base;
  id.role = "accelerator_state";
  *last_complete = false;
  written->push_back(Join(dir, kStateFile));
  WriteCheckpointFile(written->back(), id, state);
  *last_complete = true;
}

}  // namespace

namespace {

void SaveFiles(const std::string& dir, int rank, int world_size,
               bool write_shared, const CheckpointContents& contents) {
  const bool existed = Exists(dir);
  MakeDirectories(dir);
  const CheckpointIdentity base{contents.run_id, contents.step, ""};
  std::vector<std::string> written;
  bool last_complete = false;  // Whether written.back() was fully written.
  // With several processes the ranks agree twice (all_ranks_wrote): once
  // every rank wrote its own file, so that the shared file, which marks the
  // checkpoint complete, comes last; and once the main process wrote that,
  // so that no rank returns before the checkpoint is complete (a load right
  // after the save found another save's files on 3 of 3 tries).
  const bool several = world_size > 1 && contents.all_ranks_wrote;
  int agreements = 0;    // Those this rank took part in.
  bool refused = false;  // One of them said that some rank failed.
  int failed = -1;       // Then the lowest rank that did.
  const auto agree = [&](bool wrote) {
    ++agreements;
    failed = contents.all_ranks_wrote(wrote);
    refused = failed >= 0;
    return !refused;
  };
  try {
    // This rank's file first: the shared file, written last, marks the
    // checkpoint complete.
    torch::serialize::OutputArchive random;
    {
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      random.write("cpu_rng", generator.get_state());
    }
    const bool sharded = IsSharded(contents, world_size);
    const bool shards =
        checkpoint_internal::SavesShardedTensors(contents, world_size);
    if (sharded && !shards) {
      for (size_t i = 0; i < contents.optimizers.size(); ++i) {
        torch::serialize::OutputArchive archive;
        contents.optimizers[i]->save(archive);
        random.write("optimizer_" + std::to_string(i), archive);
      }
    }
    CheckpointIdentity id = base;
    id.role = RandomStatesRole(rank);
    written.push_back(Join(dir, RandomStatesFile(rank)));
    WriteCheckpointFile(written.back(), id, random);
    last_complete = true;
    if (shards) {
      written.push_back(checkpoint_internal::WriteRankShards(
          dir, rank, world_size, contents));
    }
    if (several && !agree(true)) {
      throw CheckpointError(
          "save_state: rank " + std::to_string(failed) +
          " could not write its file(s) into '" + dir +
          "' (see its error); the checkpoint is not complete");
    }
    if (write_shared) {
      if (shards) {
        written.push_back(checkpoint_internal::WriteShardsIndex(
            dir, world_size, contents.run_id));
      }
      WriteSharedFile(dir, world_size, sharded, shards, contents, base,
                      &written, &last_complete);
      // Complete: nothing after this may remove it.
      written.clear();
    }
    if (several && !agree(true)) {
      throw CheckpointError("save_state: the main process could not write '" +
                            Join(dir, kStateFile) +
                            "' (see its error); the checkpoint is not "
                            "complete");
    }
  } catch (...) {
    // What this rank wrote goes (the file that failed is already gone): a
    // failed save must not keep a full disk full. The folder goes only when
    // no other rank may be writing into it; otherwise their files of this
    // save stay in an incomplete checkpoint, which loading passes over and
    // pruning removes. The others learn of a failure here in the agreement
    // they wait in; after one that failed, nobody waits in another.
    if (several && !refused && agreements < 2) contents.all_ranks_wrote(false);
    // A collective error in the last agreement (the main process died)
    // leaves it unknown whether the shared file was written: this rank's
    // file stays, and loading tells whether the checkpoint is complete.
    if (agreements == 2 && !refused) written.clear();
    if (!written.empty() && !last_complete) written.pop_back();
    for (const std::string& path : written) std::remove(path.c_str());
    if (!existed && world_size == 1) rmdir(dir.c_str());
    throw;
  }
}

}  // namespace

void SaveCheckpoint(const std::string& dir, int rank, int world_size,
                    bool write_shared, const CheckpointContents& contents) {
  const auto save = [&] {
    SaveFiles(dir, rank, world_size, write_shared, contents);
  };
  if (!checkpoint_internal::SavesShardedTensors(contents, world_size) &&
      contents.with_whole_models) {
    contents.with_whole_models(save);
  } else {
    save();
  }
}

bool IsCheckpointFileName(const std::string& name) {
  // A temporary of AtomicFile: "<final name>.partial.<pid>.<n>".
  const size_t partial = name.find(".partial.");
  const std::string base =
      partial == std::string::npos ? name : name.substr(0, partial);
  if (base == kStateFile || IsRandomStatesFile(base)) return true;
  if (base == kShardIndexName || checkpoint_internal::IsShardFileName(base)) {
    return true;
  }
  return IsModelWeightsFileName(base);
}

}  // namespace accel
