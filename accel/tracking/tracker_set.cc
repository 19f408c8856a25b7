#include "accel/tracking/tracker_set.h"

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"

namespace accel {

TrackerSet::TrackerSet(const std::vector<std::string>& log_with,
                       std::string logging_dir)
    : names_(ResolveTrackerNames(log_with)),
      logging_dir_(std::move(logging_dir)) {
  for (const std::string& name : names_) {
    if (TrackerNeedsLoggingDir(name) && logging_dir_.empty()) {
      throw UsageError("tracker '" + name +
                       "' (--report_to) needs a logging directory: pass "
                       "--logging_dir=DIR, or set AcceleratorOptions::"
                       "logging_dir or project_dir");
    }
  }
}

TrackerSet::~TrackerSet() {
  // Without end_training, finish the trackers all the same (nothing logged
  // is lost either way: trackers write through). While an exception unwinds
  // they are only closed.
  if (finished_ || std::uncaught_exceptions() > 0) return;
  for (const auto& tracker : trackers_) {
    try {
      tracker->finish();
    } catch (const std::exception& e) {
      ACCEL_LOG(WARNING) << "tracker '" << tracker->name()
                         << "' did not finish: " << e.what();
    }
  }
}

bool TrackerSet::writes_files() const {
  for (const std::string& name : names_) {
    if (TrackerNeedsLoggingDir(name)) return true;
  }
  return false;
}

void TrackerSet::Init(const std::string& project_name,
                      const TrackerValues& config, bool is_main_process) {
  if (started_ || finished_) {
    throw UsageError(started_ ? "init_trackers was called twice; call it "
                                "once, before the first log()"
                              : "init_trackers after end_training()");
  }
  if (project_name.empty()) {
    throw UsageError(
        "init_trackers: the project name is empty; it names the run's "
        "folder, <logging_dir>/<project_name>");
  }
  started_ = true;
  if (!is_main_process) return;
  const TrackerContext context{project_name, logging_dir_};
  for (const std::string& name : names_) {
    trackers_.push_back(CreateTracker(name, context));
  }
  if (config.empty()) return;  // Accelerate: only when a config is given.
  for (const auto& tracker : trackers_) {
    tracker->store_init_configuration(config);
  }
}

void TrackerSet::Log(const TrackerValues& values, std::optional<int64_t> step) {
  if (!started_) {
    throw UsageError(
        "log() before init_trackers(): call "
        "accelerator.init_trackers(project_name, config) once first");
  }
  if (finished_) throw UsageError("log() after end_training()");
  for (const auto& entry : values) {
    if (entry.first.empty()) throw UsageError("log(): a value has no name");
  }
  const int64_t at = step.value_or(next_step_);
  next_step_ = at + 1;
  for (const auto& tracker : trackers_) tracker->log(values, at);
}

Tracker& TrackerSet::Get(const std::string& name, bool is_main_process) {
  if (!is_main_process) return BlankTracker();
  std::string started;
  for (const auto& tracker : trackers_) {
    if (tracker->name() == name) return *tracker;
    started += (started.empty() ? "" : ", ") + tracker->name();
  }
  throw UsageError(
      "get_tracker: '" + name +
      "' is not an available tracker stored inside the Accelerator; "
      "started trackers: " +
      (started.empty() ? "(none)" : started) +
      (started_ ? "" : " (init_trackers has not been called)"));
}

std::exception_ptr TrackerSet::Finish() {
  std::exception_ptr error;
  if (finished_) return error;
  finished_ = true;
  for (const auto& tracker : trackers_) {
    try {
      tracker->finish();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  return error;
}

}  // namespace accel
