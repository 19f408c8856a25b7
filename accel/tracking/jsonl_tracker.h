// The "jsonl" tracker: the run as JSON Lines, one object per line, appended
// to <logging_dir>/<project_name>/metrics.jsonl (a resumed run continues the
// same file). Read it with any JSON tool, or plot it with tools/plot_metrics.
//
//   {"config":{"batch_size":32,"lr":0.0003},"wall_time":1733050000.12}
//   {"step":1,"values":{"accuracy":0.5,"loss":0.69},"wall_time":1733050001.5}
//
// A line with "config" holds init_trackers' hyperparameters; each other line
// is one log() call: its step, the wall time in seconds since the epoch and
// the values with their types (numbers, strings, true/false). JSON has no
// NaN or infinity: those numbers are written as null.
#pragma once

#include <string>

#include "accel/tracking/append_file.h"
#include "accel/tracking/tracker.h"

namespace accel {

class JsonlTracker : public Tracker {
 public:
  explicit JsonlTracker(const TrackerContext& context);

  const std::string& name() const override { return name_; }
  void store_init_configuration(const TrackerValues& config) override;
  void log(const TrackerValues& values, int64_t step) override;
  void finish() override;

  // The file it appends to.
  const std::string& path() const { return file_.path(); }

 private:
  std::string name_ = "jsonl";
  AppendFile file_;
};

}  // namespace accel
