// Checkpoint policy, over the file format (checkpoint.h): a project folder
// that one job at a time owns, automatic naming and pruning, every rank's
// agreement before a load, and the newest checkpoint every rank can load.
// The Accelerator's save_state and load_state are this.
//
//   CheckpointManager checkpoints("run", /*total_limit=*/2, job);
//   checkpoints.SaveNext(contents, before_save, site);   // run/checkpoints/
//                                                         //   checkpoint_<n>
//   std::string dir = checkpoints.LoadNewest(contents, before_load, site);
//
// Loading is all or nothing across ranks: every rank checks its files, all
// learn every rank's CheckpointProblem (one small collective), and either
// every rank loads or every rank throws the same CheckpointError naming
// each rank's problem. LoadNewest passes over incomplete checkpoints and
// ones that do not verify, saying which and why.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accel/checkpoint/checkpoint.h"
#include "accel/checkpoint/checkpoint_folders.h"
#include "accel/runtime/comm/communicator.h"

namespace accel {

class FolderLock;

// Makes `dir` (mkdir -p) and checks this process can write there;
// UsageError naming `what` ("logging_dir") otherwise.
void CheckWritableFolder(const std::string& dir, const char* what);

class CheckpointManager {
 public:
  // What the manager needs of the job.
  struct Job {
    int rank = 0;
    int size = 1;
    int local_size = 1;  // Ranks on this machine.
    // Collectives, when size > 1 (the Accelerator's communicator(), which
    // throws once the job is left).
    std::function<Communicator&()> comm;
    // Rank 0's `value` on every rank, through the store (no collective).
    std::function<std::string(const std::string& name,
                              const std::string& value)>
        from_main;
  };
  // Called with the folder before a save writes or a load reads.
  using Hook = std::function<void(const std::string& dir)>;

  // Before the ranks join: `project_dir` can hold the checkpoints (made,
  // writable, paths within the system's limit, not a link loop).
  static void CheckProjectDir(const std::string& project_dir, int world_size);

  // With a project_dir: claims it for the job (every rank learns if another
  // job or Accelerator holds it: UsageError), and numbering continues after
  // the checkpoints there.
  CheckpointManager(std::string project_dir, int total_limit, Job job);
  ~CheckpointManager();

  const std::string& project_dir() const { return project_dir_; }
  int64_t next_number() const { return next_; }

  void Save(const std::string& dir, const CheckpointContents& contents,
            const Hook& before);
  // The next automatically named checkpoint, then pruning to total_limit.
  std::string SaveNext(const CheckpointContents& contents, const Hook& before,
                       CallSite site);
  // Restores `contents` (and contents.step) from `dir` on every rank, or
  // throws on every rank.
  void Load(const std::string& dir, CheckpointContents& contents,
            const Hook& before, CallSite site);
  // The newest automatically named checkpoint every rank can load; "" when
  // there is none at all.
  std::string LoadNewest(CheckpointContents& contents, const Hook& before,
                         CallSite site);
  // The newest complete one, or "".
  std::string Latest() const;

 private:
  void RequireProjectDir(const char* operation) const;
  void Claim();
  // Every rank's problem with `dir`, in rank order.
  // `sharded`: see CheckCheckpoint.
  std::vector<CheckpointProblem> Problems(const std::string& dir, CallSite site,
                                          bool sharded);
  // "rank 1: '.../random_states_1.pt' is missing; rank 2: ...", "" for none.
  static std::string Describe(const std::vector<CheckpointProblem>& problems);
  // Across machines, automatic naming needs a folder every machine sees.
  void CheckSharedFolder(const std::string& dir, CallSite site);
  CollectiveOptions At(CallSite site, const char* api) const;

  const std::string project_dir_;
  const int total_limit_;
  const Job job_;
  std::unique_ptr<FolderLock> lock_;  // Main process, with a project_dir.
  int64_t next_ = 1;
  bool checked_shared_folder_ = false;
};

}  // namespace accel
