#include "accel/tracking/tensorboard_tracker.h"

namespace accel {
namespace {

const TrackerRegistration kRegistration(
    "tensorboard", [](const TrackerContext& context) {
      return std::make_unique<TensorBoardTracker>(context);
    });

}  // namespace

TensorBoardTracker::TensorBoardTracker(const TrackerContext& context)
    : run_dir_(context.logging_dir + "/" + context.project_name),
      writer_(run_dir_) {}

void TensorBoardTracker::store_init_configuration(const TrackerValues& config) {
  writer_.AddHParams(config);
}

void TensorBoardTracker::log(const TrackerValues& values, int64_t step) {
  writer_.AddScalars(values, step);
}

void TensorBoardTracker::finish() {
  if (finished_) return;
  finished_ = true;
  writer_.EndSession(/*success=*/true);
  writer_.Close();
}

}  // namespace accel
