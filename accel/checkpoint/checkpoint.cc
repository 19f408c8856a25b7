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
using checkpoint_internal::Join;
using checkpoint_internal::NamedState;
using checkpoint_internal::ReadInt;
using checkpoint_internal::ReadModelArchive;
using checkpoint_internal::ReadValue;
using checkpoint_internal::SaveModelArchive;

constexpr const char* kLoaderSamplesKey = "loader_samples";

std::string RandomStatesRole(int rank) {
  return "random_states_" + std::to_string(rank);
}

void Note(const std::string& message) { ACCEL_LOG(INFO) << message; }

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

// A part of the training state with a save/load pair.
struct Stateful {
  std::string name;
  std::function<void(torch::serialize::OutputArchive&)> save;
  std::function<void(torch::serialize::InputArchive&)> load;
};

struct StatefulKind {
  std::string singular;  // "optimizer": entries optimizer_0, optimizer_1...
  std::string plural;    // "optimizers": the count is num_optimizers.
  std::vector<Stateful> parts;
};

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

bool IsSharded(const CheckpointContents& contents, int world_size) {
  return contents.zero_stage > 0 && world_size > 1 &&
         !contents.optimizers.empty();
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
    // Sharded optimizer state is in each rank's file.
    if (sharded && kind.singular == "optimizer") continue;
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
  const auto agree = [&](bool wrote) {
    ++agreements;
    refused = !contents.all_ranks_wrote(wrote);
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
          "save_state: another rank could not write its " +
          std::string(sharded ? "optimizer shard" : "random states") +
          " into '" + dir +
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
  ShardedStateReader reader = ShardedStateReader::Open(dir);
  if (reader.run_id() != files.state.identity.run) {
    throw CheckpointError("'" + dir + "': its shard files were saved by run " +
                          reader.run_id() + ", but '" + files.state_path +
                          "' by run " + files.state.identity.run +
                          ": the files come from different saves");
  }
  contents.sharded_tensors->check(reader);
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
