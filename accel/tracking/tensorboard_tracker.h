// The "tensorboard" tracker, as Accelerate's TensorBoardTracker: event files
// in <logging_dir>/<project_name>/ that `tensorboard --logdir <logging_dir>`
// shows. Numbers become scalars (float32), strings text summaries, and
// init_trackers' configuration the HParams dashboard's hyperparameters (and
// a table in the text summary "hparams"); finish() marks the session
// successful. See event_file_writer.h for the format.
//
//   auto& tensorboard = dynamic_cast<accel::TensorBoardTracker&>(
//       accelerator.get_tracker("tensorboard"));
//   tensorboard.writer().AddText("samples", generated_text, step);
#pragma once

#include <string>

#include "accel/tracking/event_file_writer.h"
#include "accel/tracking/tracker.h"

namespace accel {

class TensorBoardTracker : public Tracker {
 public:
  explicit TensorBoardTracker(const TrackerContext& context);

  const std::string& name() const override { return name_; }
  void store_init_configuration(const TrackerValues& config) override;
  void log(const TrackerValues& values, int64_t step) override;
  void finish() override;

  // For what log() does not cover (Accelerate's get_tracker(..., unwrap)).
  EventFileWriter& writer() { return writer_; }
  // <logging_dir>/<project_name>.
  const std::string& run_dir() const { return run_dir_; }

 private:
  std::string name_ = "tensorboard";
  std::string run_dir_;
  EventFileWriter writer_;
  bool finished_ = false;
};

}  // namespace accel
