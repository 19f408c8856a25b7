// Accelerate's examples/by_feature/checkpointing.py in C++: save_state
// after every epoch (--checkpointing_steps=epoch, into epoch_<n>) or every
// N optimizer steps (--checkpointing_steps=N, into step_<n>), and
// --resume_from_checkpoint=<folder> continues from one, skipping the
// batches of the epoch it had trained with skip_first_batches.
//
//   bazel run //examples/by_feature:checkpointing -- --num_processes=2
//       --checkpointing_steps=epoch --output_dir=/tmp/run
//   bazel run //examples/by_feature:checkpointing -- --num_processes=2
//       --resume_from_checkpoint=/tmp/run/epoch_0
//
// One difference: the Python script counts overall_step from the resumed
// epoch's first batch, so step folders after a resume in a later epoch
// are misnamed; here it counts from the run's first batch.
#include <string>

#include "examples/by_feature/common.h"

DEFINE_string(checkpointing_steps, "",
              "Save the state every N optimizer steps (a number), or "
              "\"epoch\" after every epoch; empty: never.");
DEFINE_string(resume_from_checkpoint, "",
              "A checkpoint folder (epoch_<n> or step_<n>) to continue from.");
DEFINE_string(output_dir, ".", "Where the checkpoint folders go.");

namespace {

// The folder's name without its parents: epoch_<n> or step_<n>.
std::string TrainingDifference(const std::string& folder) {
  std::string path = folder;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The number after `prefix` in `name` (up to 9 digits), or -1 when `name`
// is not one.
int64_t NumberAfter(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0) return -1;
  const std::string number = name.substr(prefix.size());
  if (number.empty() || number.size() > 9 ||
      number.find_first_not_of("0123456789") != std::string::npos) {
    return -1;
  }
  return std::stoll(number);
}

// Python's `checkpointing_steps.isdigit()`: the number, or 0 for "epoch"
// and "" (a UsageError for anything else).
int64_t StepsBetweenCheckpoints(const std::string& text) {
  if (text.empty() || text == "epoch") return 0;
  const int64_t steps = NumberAfter(text, "");
  if (steps < 1) {
    throw accel::UsageError(
        "--checkpointing_steps must be \"epoch\" or a positive number of "
        "steps (up to 9 digits), found '" +
        text + "'");
  }
  return steps;
}

// Not in the Python script, which trusts the name: the checkpoint itself
// must say the same (the loader's epoch, and for step_<n> the steps). A
// renamed folder, or a step_<n> written at another process count or batch
// size (where an epoch has another number of batches), would resume
// somewhere else than the name says.
void CheckTheNameAgrees(const accel::Accelerator& accelerator,
                        const by_feature::Loader& train_loader,
                        const std::string& name, int64_t step,
                        int64_t starting_epoch, int64_t resume_step) {
  // The loader's epoch is the one under way when the state was saved; a
  // step folder at an epoch's end was saved before that epoch ended.
  const int64_t epoch = train_loader.epoch();
  const bool epochs_agree =
      epoch == starting_epoch ||
      (step > 0 && resume_step == 0 && epoch == starting_epoch - 1);
  const bool steps_agree = step < 0 || accelerator.step() == step;
  if (epochs_agree && steps_agree) return;
  throw accel::UsageError(
      "--resume_from_checkpoint: '" + name + "' holds a run after " +
      std::to_string(accelerator.step()) + " steps, in epoch " +
      std::to_string(epoch) + ", not what its name says here (" +
      std::to_string(train_loader.batches_per_epoch()) +
      " batches an epoch): a renamed folder, or a step folder from another "
      "process count or batch size");
}

int Main(int, char**) {
  const int64_t checkpointing_steps =
      StepsBetweenCheckpoints(FLAGS_checkpointing_steps);
  accel::Accelerator accelerator(accel::AcceleratorOptions::FromFlags());
  const by_feature::Config config;
  by_feature::Training training(accelerator, config);
  auto& [model, optimizer, train_loader, eval_loader, lr_scheduler] =
      training.prepared;
  const int64_t batches_per_epoch = static_cast<int64_t>(train_loader.size());

  // New code: where a checkpoint's name says the run was.
  int64_t overall_step = 0;
  int64_t starting_epoch = 0;
  int64_t resume_step = -1;  // Python's None.
  if (!FLAGS_resume_from_checkpoint.empty()) {
    const std::string name = TrainingDifference(FLAGS_resume_from_checkpoint);
    const int64_t epoch = NumberAfter(name, "epoch_");
    const int64_t step = NumberAfter(name, "step_");
    if (epoch < 0 && step < 0) {
      throw accel::UsageError(
          "--resume_from_checkpoint: the folder's name must be epoch_<n> or "
          "step_<n> (this script's names), found '" +
          name + "'");
    }
    accelerator.print("Resumed from checkpoint:", FLAGS_resume_from_checkpoint);
    accelerator.load_state(FLAGS_resume_from_checkpoint);
    if (epoch >= 0) {
      starting_epoch = epoch + 1;
    } else {
      starting_epoch = step / batches_per_epoch;
      resume_step = step - starting_epoch * batches_per_epoch;
    }
    CheckTheNameAgrees(accelerator, train_loader, name, step, starting_epoch,
                       resume_step);
    overall_step = starting_epoch * batches_per_epoch;
  }

  for (int64_t epoch = starting_epoch; epoch < config.num_epochs; ++epoch) {
    model->train();
    by_feature::Loader active_dataloader = train_loader;
    if (epoch == starting_epoch && resume_step >= 0) {
      // New code: the batches this epoch had trained before the save.
      active_dataloader =
          accelerator.skip_first_batches(train_loader, resume_step);
      overall_step += resume_step;
    }
    for (auto& batch : active_dataloader) {
      by_feature::TrainStep(accelerator, training, batch);
      ++overall_step;
      if (checkpointing_steps > 0 && overall_step % checkpointing_steps == 0) {
        accelerator.save_state(FLAGS_output_dir + "/step_" +
                               std::to_string(overall_step));
      }
    }
    by_feature::PrintEpoch(accelerator, epoch,
                           by_feature::Evaluate(accelerator, training));
    if (FLAGS_checkpointing_steps == "epoch") {
      accelerator.save_state(FLAGS_output_dir + "/epoch_" +
                             std::to_string(epoch));
    }
  }
  // Not in the Python script: what the test compares with a resumed run.
  accelerator.print("parameter checksum:",
                    by_feature::ParameterChecksum(model));
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return by_feature::RunScript(argc, argv, Main);
}
