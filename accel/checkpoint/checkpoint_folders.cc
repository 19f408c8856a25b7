#include "accel/checkpoint/checkpoint_folders.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "accel/checkpoint/checkpoint.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"
#include "accel/runtime/base/logging.h"

namespace accel {

std::string CheckpointFolder(const std::string& project_dir, int64_t index) {
  return project_dir + "/checkpoints/checkpoint_" + std::to_string(index);
}

std::vector<int64_t> CheckpointIndices(const std::string& project_dir) {
  std::vector<int64_t> indices;
  const std::string folder = project_dir + "/checkpoints";
  DIR* dir = opendir(folder.c_str());
  if (dir == nullptr) return indices;
  const std::string prefix = "checkpoint_";
  std::string too_large;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    // Only the names accel writes: decimal, without leading zeros.
    if (digits.empty() ||
        digits.find_first_not_of("0123456789") != std::string::npos ||
        (digits.size() > 1 && digits[0] == '0')) {
      continue;
    }
    errno = 0;
    const long long number = std::strtoll(digits.c_str(), nullptr, 10);
    if (errno != 0 || number > kMaxCheckpointNumber) {
      too_large = name;
      continue;
    }
    indices.push_back(number);
  }
  closedir(dir);
  if (!too_large.empty()) {
    // Skipping it would resume from an older checkpoint and number new
    // ones below it, as if it were not there.
    throw CheckpointError("'" + folder + "/" + too_large +
                          "' has a number beyond accel's checkpoint "
                          "numbering (at most " +
                          std::to_string(kMaxCheckpointNumber) +
                          "); rename or remove it");
  }
  std::sort(indices.begin(), indices.end());
  return indices;
}

bool IsCompleteCheckpoint(const std::string& dir) {
  return IsFile(dir + "/" + kStateFile);
}

std::string LatestCheckpoint(const std::string& project_dir) {
  const std::vector<int64_t> indices = CheckpointIndices(project_dir);
  for (auto it = indices.rbegin(); it != indices.rend(); ++it) {
    const std::string dir = CheckpointFolder(project_dir, *it);
    if (IsCompleteCheckpoint(dir)) return dir;
  }
  return "";
}

namespace {

// Removes a checkpoint folder, as far as it holds only what accel writes.
void RemoveCheckpoint(const std::string& dir) {
  const Removal removal = RemoveOwnedTree(dir, IsCheckpointFileName);
  const std::vector<std::string>& kept = removal.kept;
  // Said once: the folder is left incomplete, and later prunings find
  // nothing of accel's in it.
  if (kept.empty() || removal.removed == 0) return;
  std::string listed;
  for (size_t i = 0; i < kept.size() && i < 5; ++i) {
    listed += (i ? ", " : "") + kept[i];
  }
  if (kept.size() > 5) listed += ", ...";
  ACCEL_LOG(WARNING) << "pruning checkpoint " << dir
                     << " removed accel's files but left the folder, which "
                        "holds what accel did not write: "
                     << listed;
}

}  // namespace

void PruneCheckpoints(const std::string& project_dir, int keep) {
  if (keep <= 0) return;
  const std::vector<int64_t> indices = CheckpointIndices(project_dir);
  int complete = 0;
  int64_t oldest_kept = -1;
  int64_t newest_complete = -1;
  for (auto it = indices.rbegin(); it != indices.rend() && complete < keep;
       ++it) {
    if (IsCompleteCheckpoint(CheckpointFolder(project_dir, *it))) {
      if (newest_complete < 0) newest_complete = *it;
      ++complete;
      oldest_kept = *it;
    }
  }
  for (int64_t index : indices) {
    const std::string dir = CheckpointFolder(project_dir, index);
    // Older than what we keep, or a save that never completed and has been
    // overtaken by a complete one.
    if ((complete == keep && index < oldest_kept) ||
        (index < newest_complete && !IsCompleteCheckpoint(dir))) {
      RemoveCheckpoint(dir);
    }
  }
}

}  // namespace accel
