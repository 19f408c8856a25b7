#include "accel/checkpoint/checkpoint_manager.h"

#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"
#include "accel/runtime/base/folder_lock.h"
#include "accel/runtime/base/logging.h"
#include "accel/runtime/base/startup_trace.h"
#include "accel/runtime/comm/object_collectives.h"

namespace accel {
namespace {

// The longest path save_state writes under `project_dir` must fit the
// system's limit: found at once rather than at the first save.
void CheckPathLength(const std::string& project_dir, int world_size) {
  long limit = pathconf(project_dir.c_str(), _PC_PATH_MAX);
  if (limit <= 0) limit = PATH_MAX;
  const std::string longest =
      CheckpointFolder(project_dir, kMaxCheckpointNumber) + "/" +
      std::max<std::string>(RandomStatesFile(world_size - 1),
                            std::string("model.safetensors.index.json"),
                            [](const std::string& a, const std::string& b) {
                              return a.size() < b.size();
                            }) +
      ".partial.4194304.18446744073709551615";
  if (static_cast<long>(longest.size()) < limit) return;
  throw UsageError(
      "project_dir '" + project_dir.substr(0, 80) + "...' (" +
      std::to_string(project_dir.size()) +
      " characters) is too long for the checkpoint files under it: their "
      "paths reach " +
      std::to_string(longest.size()) +
      " characters, over the system's limit "
      "of " +
      std::to_string(limit - 1) + "; choose a shorter folder");
}

}  // namespace

void CheckWritableFolder(const std::string& dir, const char* what) {
  if (dir.empty()) return;
  try {
    MakeDirectories(dir);
  } catch (const CheckpointError& e) {
    throw UsageError(std::string(what) + ": " + e.what());
  }
  if (!IsWritableFolder(dir)) {
    throw UsageError(
        std::string(what) + " '" + dir +
        "' is not a folder this process can write to: " + std::strerror(errno));
  }
}

void CheckpointManager::CheckProjectDir(const std::string& project_dir,
                                        int world_size) {
  if (project_dir.empty()) return;
  CheckPathLength(project_dir, world_size);  // Before making any folder.
  CheckWritableFolder(project_dir, "project_dir");
}

CheckpointManager::CheckpointManager(std::string project_dir, int total_limit,
                                     Job job)
    : project_dir_(std::move(project_dir)),
      total_limit_(total_limit),
      job_(std::move(job)) {
  if (project_dir_.empty()) return;
  Claim();
  // Numbering continues after earlier runs' checkpoints. No rank can save
  // before every rank got here (saving follows collectives), so all agree.
  const std::vector<int64_t> indices = CheckpointIndices(project_dir_);
  if (indices.empty()) return;
  if (indices.back() == kMaxCheckpointNumber) {
    throw CheckpointError(
        "'" + CheckpointFolder(project_dir_, indices.back()) +
        "' has the last number accel's checkpoint numbering has: no "
        "checkpoint can follow it; rename or remove it");
  }
  next_ = indices.back() + 1;
}

CheckpointManager::~CheckpointManager() = default;

void CheckpointManager::Claim() {
  // Rank 0 claims it for the job (the folder is shared by the job's
  // machines); every rank gets the verdict, so none trains on alone.
  std::string refusal;
  if (job_.rank == 0) {
    std::string holder;
    lock_ = FolderLock::TryAcquire(project_dir_, &holder);
    const std::string me = "pid " + std::to_string(getpid()) + " ";
    if (lock_ == nullptr && holder.rfind(me, 0) == 0) {
      refusal = "project_dir '" + project_dir_ +
                "' is in use by another Accelerator of this process: two "
                "would interleave their checkpoints; give each its own "
                "project_dir";
    } else if (lock_ == nullptr) {
      refusal = "project_dir '" + project_dir_ +
                "' is in use by another job (" + holder +
                "): two jobs in one folder would interleave their "
                "checkpoints. Let it finish or stop it, or give this job "
                "another folder";
    } else if (!lock_->unlocked_reason().empty()) {
      ACCEL_LOG(WARNING) << lock_->unlocked_reason()
                         << ": nothing keeps another job from writing "
                            "checkpoints into the same project_dir";
    }
  }
  if (job_.from_main) refusal = job_.from_main("project_dir_refusal", refusal);
  if (!refusal.empty()) throw UsageError(refusal);
}

CollectiveOptions CheckpointManager::At(CallSite site, const char* api) const {
  CollectiveOptions options;
  options.site = site;
  options.api = api;
  return options;
}

void CheckpointManager::RequireProjectDir(const char* operation) const {
  if (!project_dir_.empty()) return;
  throw UsageError(std::string(operation) +
                   "() without a folder needs AcceleratorOptions::project_dir "
                   "(automatic checkpoint naming)");
}

void CheckpointManager::Save(const std::string& dir,
                             const CheckpointContents& contents,
                             const Hook& before) {
  TraceStartup("save_begin");
  if (before) before(dir);
  SaveCheckpoint(dir, job_.rank, job_.size, job_.rank == 0, contents);
  TraceStartup("save_end");
}

std::string CheckpointManager::SaveNext(const CheckpointContents& contents,
                                        const Hook& before, CallSite site) {
  RequireProjectDir("save_state");
  const std::string dir = CheckpointFolder(project_dir_, next_++);
  Save(dir, contents, before);
  if (!checked_shared_folder_ && job_.local_size < job_.size) {
    checked_shared_folder_ = true;
    CheckSharedFolder(dir, site);
  }
  if (job_.rank == 0) PruneCheckpoints(project_dir_, total_limit_);
  return dir;
}

void CheckpointManager::CheckSharedFolder(const std::string& dir,
                                          CallSite site) {
  // Found at the first save, not at a resume.
  job_.comm().barrier(At(site, "save_state"));
  const std::string marker = dir + "/" + kStateFile;
  const std::vector<int> blind =
      GatherObject(job_.comm(), std::vector<int>{IsFile(marker) ? 0 : 1},
                   At(site, "save_state"));
  std::string ranks;
  for (size_t r = 0; r < blind.size(); ++r) {
    if (blind[r] != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (ranks.empty()) return;
  throw CheckpointError(
      "save_state: rank(s) " + ranks + " do not see '" + marker +
      "', which rank 0 wrote: '" + project_dir_ +
      "' is not on a disk that every machine shares. Automatic checkpoint "
      "naming and resuming need a shared project_dir");
}

std::vector<CheckpointProblem> CheckpointManager::Problems(
    const std::string& dir, CallSite site, bool sharded) {
  const CheckpointProblem mine =
      CheckCheckpoint(dir, job_.rank, job_.size, sharded);
  if (job_.size == 1) return {mine};
  const std::vector<std::string> all =
      GatherObject(job_.comm(), std::vector<std::string>{mine.Encode()},
                   At(site, "load_state"));
  std::vector<CheckpointProblem> problems;
  for (const std::string& text : all) {
    problems.push_back(CheckpointProblem::Decode(text));
  }
  return problems;
}

std::string CheckpointManager::Describe(
    const std::vector<CheckpointProblem>& problems) {
  std::string why;
  for (size_t r = 0; r < problems.size(); ++r) {
    if (!problems[r]) continue;
    why += (why.empty() ? "" : "; ") + std::string("rank ") +
           std::to_string(r) + ": " + problems[r].detail;
  }
  return why;
}

namespace {

// Whether each rank's file holds its optimizer shard (ZeRO).
bool Sharded(const CheckpointContents& contents) {
  return contents.zero_stage > 0 && !contents.optimizers.empty();
}

}  // namespace

void CheckpointManager::Load(const std::string& dir,
                             CheckpointContents& contents, const Hook& before,
                             CallSite site) {
  if (job_.size > 1) {
    const std::string why = Describe(Problems(dir, site, Sharded(contents)));
    if (!why.empty()) {
      throw CheckpointError("cannot load checkpoint '" + dir + "': " + why);
    }
  } else {
    // Alone, loading checks the same and says more about what it found,
    // except for damaged shard data, which it meets only while loading.
    const CheckpointProblem problem =
        CheckCheckpoint(dir, job_.rank, job_.size, Sharded(contents));
    if (problem.kind == CheckpointProblem::Kind::kDamaged) {
      throw CheckpointError("cannot load checkpoint '" + dir +
                            "': " + problem.detail);
    }
  }
  if (before) before(dir);
  LoadCheckpoint(dir, job_.rank, job_.size, contents);
}

std::string CheckpointManager::LoadNewest(CheckpointContents& contents,
                                          const Hook& before, CallSite site) {
  RequireProjectDir("load_state");
  // Rank 0's list decides, so that every rank tries the same folders. A
  // save that never finished (killed before its last file) left no
  // checkpoint: it is passed over, and with nothing else the run starts
  // afresh.
  std::vector<std::string> candidates;
  if (job_.rank == 0) {
    const std::vector<int64_t> indices = CheckpointIndices(project_dir_);
    for (auto it = indices.rbegin(); it != indices.rend(); ++it) {
      const std::string dir = CheckpointFolder(project_dir_, *it);
      if (IsCompleteCheckpoint(dir)) {
        candidates.push_back(dir);
      } else {
        ACCEL_LOG(INFO) << "skipped checkpoint " << dir
                        << " (incomplete: its save did not finish)";
      }
    }
  }
  if (job_.size > 1) {
    BroadcastObjectList(job_.comm(), candidates, 0, At(site, "load_state"));
  }
  std::vector<std::string> skipped;
  bool unshared = false;
  for (const std::string& dir : candidates) {
    const std::vector<CheckpointProblem> problems =
        Problems(dir, site, Sharded(contents));
    // Rank 0 has its files and another rank lacks them.
    for (size_t r = 1; r < problems.size(); ++r) {
      unshared |=
          !problems[0] && problems[r].kind == CheckpointProblem::Kind::kMissing;
    }
    const std::string why = Describe(problems);
    if (why.empty()) {
      if (job_.rank == 0) {
        for (const std::string& note : skipped) {
          ACCEL_LOG(WARNING) << "skipped checkpoint " << note
                             << "; resuming from an older one";
        }
      }
      if (before) before(dir);
      LoadCheckpoint(dir, job_.rank, job_.size, contents);
      return dir;
    }
    skipped.push_back(dir + " (" + why + ")");
  }
  if (candidates.empty()) return "";
  std::string message = "no checkpoint in '" + project_dir_ +
                        "/checkpoints' that every rank can load: ";
  for (size_t i = 0; i < skipped.size(); ++i) {
    message += (i ? ", " : "") + skipped[i];
  }
  if (unshared) {
    message += ". Rank 0 has files that other ranks lack: is '" + project_dir_ +
               "' on a disk that every machine shares?";
  }
  throw CheckpointError(message);
}

std::string CheckpointManager::Latest() const {
  return project_dir_.empty() ? "" : LatestCheckpoint(project_dir_);
}

}  // namespace accel
