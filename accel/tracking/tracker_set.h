// An Accelerator's experiment trackers and their lifecycle, as
// Accelerate's: named at construction (log_with, --report_to: an unknown
// name fails at once, on every rank), started by init_trackers on the main
// process, fed by log(), finished by end_training() or, when the program
// never calls it, by the destructor (closed without "finished" while an
// exception unwinds, so TensorBoard does not mark a failed run as done).
//
//   TrackerSet trackers({"jsonl", "tensorboard"}, "runs");
//   trackers.Init("demo", {{"lr", 3e-4}}, is_main_process);
//   trackers.Log({{"loss", 0.7}}, /*step=*/std::nullopt);  // step 0, 1, ...
//   if (std::exception_ptr e = trackers.Finish()) std::rethrow_exception(e);
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accel/tracking/tracker.h"

namespace accel {

class TrackerSet {
 public:
  // UsageError for an unknown tracker, or one that writes files without a
  // logging_dir.
  TrackerSet(const std::vector<std::string>& log_with, std::string logging_dir);
  ~TrackerSet();
  TrackerSet(const TrackerSet&) = delete;
  TrackerSet& operator=(const TrackerSet&) = delete;

  // Whether a named tracker writes into logging_dir (to check it early).
  bool writes_files() const;
  const std::string& logging_dir() const { return logging_dir_; }

  // Every process calls it once; the trackers start on the main one.
  void Init(const std::string& project_name, const TrackerValues& config,
            bool is_main_process);
  // Without a step: one past the last step logged (0 at first).
  void Log(const TrackerValues& values, std::optional<int64_t> step);
  // The started tracker of that name (BlankTracker off the main process).
  Tracker& Get(const std::string& name, bool is_main_process);
  const std::vector<std::unique_ptr<Tracker>>& started() const {
    return trackers_;
  }
  // Finishes every tracker once; returns the first error, after trying all.
  std::exception_ptr Finish();

 private:
  std::vector<std::string> names_;  // log_with, "all" resolved.
  std::string logging_dir_;
  std::vector<std::unique_ptr<Tracker>> trackers_;
  bool started_ = false;
  bool finished_ = false;
  int64_t next_step_ = 0;
};

}  // namespace accel
