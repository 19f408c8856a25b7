// Writes TensorBoard event files: events.out.tfevents.<time>.<host>.<pid>.<n>
// in a run's folder, TFRecord-framed Event messages (see tfrecord_writer.h
// and tensorboard.proto), each written through as it is added. What
// torch.utils.tensorboard.SummaryWriter writes for add_scalar, add_text and
// add_hparams, without TensorFlow or Python.
//
//   accel::EventFileWriter writer("runs/my_run");
//   writer.AddHParams({{"lr", 3e-4}, {"optimizer", "adamw"}});
//   writer.AddScalars({{"loss", 0.25}, {"accuracy", 0.9}}, /*step=*/10);
//   writer.AddText("note", "warmup done", /*step=*/10);
//   writer.EndSession(/*success=*/true);
//   writer.Close();
//
//   $ tensorboard --logdir runs
//
// Scalars are stored as float32 (TensorBoard's simple_value), as every
// TensorBoard writer does; the JSONL tracker keeps full doubles.
#pragma once

#include <cstdint>
#include <string>

#include "accel/tracking/tfrecord_writer.h"
#include "accel/tracking/tracker.h"

namespace accel {

namespace tensorboard {
class Summary;
}  // namespace tensorboard

class EventFileWriter {
 public:
  // Creates `run_dir` (and parents) and a new event file in it, whose first
  // record names the format version ("brain.Event:2").
  explicit EventFileWriter(const std::string& run_dir);

  // One event at `step`: numbers (and bools, as 0 and 1) as scalars named by
  // their key, strings as text summaries.
  void AddScalars(const TrackerValues& values, int64_t step);
  void AddScalar(const std::string& tag, double value, int64_t step);
  void AddText(const std::string& tag, const std::string& text, int64_t step);
  // The HParams plugin's session_start_info with these hyperparameters, and
  // the same as a Markdown table in the text summary "hparams".
  void AddHParams(const TrackerValues& hparams);
  // The HParams plugin's session_end_info (success or failure).
  void EndSession(bool success);

  void Close() { file_.Close(); }
  const std::string& path() const { return file_.path(); }

 private:
  void WriteSummary(const tensorboard::Summary& summary, int64_t step);

  TfRecordWriter file_;
};

}  // namespace accel
