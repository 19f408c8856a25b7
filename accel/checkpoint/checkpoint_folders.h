// Where automatically named checkpoints live in a project folder, and
// their lifecycle there: numbering, listing, the newest complete one, and
// pruning. CheckpointManager (checkpoint_manager.h) is the policy on top;
// checkpoint.h is a checkpoint's own files.
//
//   std::string dir = accel::CheckpointFolder("run", 3);
//       // "run/checkpoints/checkpoint_3"
//   std::string newest = accel::LatestCheckpoint("run");
//   accel::PruneCheckpoints("run", /*keep=*/2);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace accel {

// Automatic naming (Accelerate's automatic_checkpoint_naming): checkpoints
// live in <project_dir>/checkpoints/checkpoint_<n>. A checkpoint is complete
// once its accelerator_state.pt exists: the main process writes that file
// last, so a save interrupted at any moment leaves an incomplete folder that
// is never taken for the latest one.
// Numbers go up to kMaxCheckpointNumber (int64's largest but one, so that
// the next number exists); only names accel writes count (no leading
// zeros). A folder with a larger number is a CheckpointError rather than
// skipped: resuming would go back past it, and numbering would reuse
// numbers below it.
inline constexpr int64_t kMaxCheckpointNumber = 9223372036854775806;
std::string CheckpointFolder(const std::string& project_dir, int64_t index);
// Indices of the checkpoint folders there (complete or not), ascending.
std::vector<int64_t> CheckpointIndices(const std::string& project_dir);
bool IsCompleteCheckpoint(const std::string& dir);
// The newest complete checkpoint folder, or "" when there is none.
std::string LatestCheckpoint(const std::string& project_dir);
// Keeps the newest `keep` complete checkpoints, removing every folder older
// than the oldest of those and every incomplete one older than the newest.
// Removing never follows a symbolic link (a link is removed as a link) and
// deletes only files accel writes (IsCheckpointFileName); a folder that
// holds anything else keeps it, and a warning names it.
void PruneCheckpoints(const std::string& project_dir, int keep);

}  // namespace accel
