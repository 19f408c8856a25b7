// One job at a time in a folder: an exclusive claim that lasts as long as
// the process holding it, however that process ends.
//
//   std::string holder;
//   auto lock = accel::FolderLock::TryAcquire(project_dir, &holder);
//   if (lock == nullptr) {
//     // holder: "pid 4242 on node7 since 2026-12-01 20:01:14 UTC:
//     //          train_demo --num_processes=2"
//   }
//
// The claim is flock(2) on <dir>/accel.lock, which the kernel drops when the
// holder's file closes or the process dies (also by SIGKILL or a crash), so
// a job that died never blocks the next one, and no stale-lock guessing is
// needed. The file holds a line naming its holder, for the message of
// whoever is refused. A second claim from the same process (two
// Accelerators on one folder) is refused too. File systems without locks
// (flock fails with ENOLCK or EOPNOTSUPP) give a lock that claims nothing,
// and `unlocked_reason` says why.
#pragma once

#include <memory>
#include <string>

namespace accel {

class FolderLock {
 public:
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  // Claims `dir` (which must exist). Null when another holder has it, with
  // *holder set to its line (or to why the lock file cannot be used).
  static std::unique_ptr<FolderLock> TryAcquire(const std::string& dir,
                                                std::string* holder);

  // Why this lock claims nothing ("" when it does).
  const std::string& unlocked_reason() const { return unlocked_reason_; }
  const std::string& path() const { return path_; }

 private:
  FolderLock(int fd, std::string path, std::string unlocked_reason);

  int fd_;
  std::string path_;
  std::string unlocked_reason_;
};

// "pid 4242 on node7 since 2026-12-01 20:01:14 UTC: train_demo --flag":
// this process, as the lock file names its holder.
std::string DescribeThisProcess();

}  // namespace accel
