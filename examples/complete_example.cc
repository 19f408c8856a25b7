// Accelerate's complete_nlp_example.py, ported line by line to accel, on a
// small synthetic classification task: AdamW with a linear warmup schedule,
// --mixed_precision, --gradient_accumulation_steps, accuracy through
// gather_for_metrics, the data set built under main_process_first, a
// checkpoint every epoch (or every N steps) and --resume, also from the
// middle of an epoch; with --report_to=jsonl,tensorboard (or all) it tracks
// the run as Accelerate's example does with --with_tracking: the loss,
// learning rate and samples per second of every optimizer step and the
// evaluation accuracy of every epoch, in <output_dir>/complete_example/.
//
//   bazel run //examples:complete_example -- --num_processes=2
//   bazel run //examples:complete_example -- --num_processes=2
//       --gradient_accumulation_steps=2 --mixed_precision=bf16
//   bazel run //examples:complete_example -- --checkpointing_steps=5 --resume
//   bazel run //examples:complete_example -- --report_to=all
//   bazel run //tools:plot_metrics -- complete_example_output/complete_example
//
// The global batch is split across processes (split_batches), so in fp32 the
// results at 1, 2 and 3 processes agree to about 1e-6.
#include <sys/stat.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "accel/accelerator.h"
#include "accel/runtime/launch/program.h"
#include "examples/blobs.h"

DEFINE_int32(epochs, 3, "Epochs to train (in total, when resuming).");
DEFINE_int32(batch_size, 12, "Global batch size, split across processes.");
DEFINE_double(lr, 2e-3, "Peak learning rate of AdamW.");
DEFINE_int32(num_warmup_steps, 10, "Linear warmup steps of the schedule.");
DEFINE_int64(seed, 42, "Seed of the data set, the weights and the shuffling.");
DEFINE_string(output_dir, "complete_example_output",
              "Checkpoints (output_dir/checkpoints) and the final weights.");
DEFINE_string(checkpointing_steps, "epoch",
              "\"epoch\" to save after every epoch, N to save every N "
              "optimizer steps, \"no\" for neither.");
DEFINE_bool(resume, false,
            "Continue from the newest checkpoint in output_dir/checkpoints, "
            "when there is one.");
DEFINE_int32(stop_after_steps, 0,
             "Stop (as if interrupted) after this many optimizer steps of "
             "this run; 0 runs to the end. For trying --resume.");

namespace {

using accel_examples::Blobs;

// Makes the data set once and caches it in `path`; what Accelerate's
// example does with datasets' map() and its cache.
std::pair<Blobs, Blobs> LoadOrMakeData(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) == 0) {
    std::vector<torch::Tensor> tensors;
    torch::load(tensors, path);
    return {Blobs(tensors[0], tensors[1]), Blobs(tensors[2], tensors[3])};
  }
  auto sets = accel_examples::MakeBlobs(static_cast<uint64_t>(FLAGS_seed));
  torch::save(
      std::vector<torch::Tensor>{sets.first.inputs(), sets.first.labels(),
                                 sets.second.inputs(), sets.second.labels()},
      path);
  return sets;
}

void CheckFlags() {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw accel::UsageError(message);
  };
  require(FLAGS_epochs >= 0, "--epochs must not be negative, found " +
                                 std::to_string(FLAGS_epochs));
  require(FLAGS_batch_size >= 1, "--batch_size must be at least 1, found " +
                                     std::to_string(FLAGS_batch_size));
  require(FLAGS_lr > 0,
          "--lr must be positive, found " + std::to_string(FLAGS_lr));
  require(FLAGS_num_warmup_steps >= 0,
          "--num_warmup_steps must not be negative, found " +
              std::to_string(FLAGS_num_warmup_steps));
  require(FLAGS_stop_after_steps >= 0,
          "--stop_after_steps must not be negative, found " +
              std::to_string(FLAGS_stop_after_steps));
  require(!FLAGS_output_dir.empty(),
          "--output_dir is empty; name the folder for checkpoints");
}

// Optimizer steps between checkpoints, or 0 (--checkpointing_steps=epoch
// or no).
int CheckpointEvery() {
  const std::string& text = FLAGS_checkpointing_steps;
  if (text == "epoch" || text == "no") return 0;
  char* end = nullptr;
  const long steps = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || steps < 1 || steps > 1000000000) {
    throw accel::UsageError(
        "--checkpointing_steps must be epoch, no or a positive number, "
        "found '" +
        text + "'");
  }
  return static_cast<int>(steps);
}

int Main(int argc, char** argv) {
  CheckFlags();
  const int checkpoint_every = CheckpointEvery();
  accel::AcceleratorOptions options = accel::AcceleratorOptions::FromFlags();
  options.seed = static_cast<uint64_t>(FLAGS_seed);
  options.project_dir = FLAGS_output_dir;
  options.total_limit = 3;
  accel::Accelerator accelerator(options);

  // The main process makes (and caches) the data set; the others then load
  // its cache instead of making their own.
  ::mkdir(FLAGS_output_dir.c_str(), 0755);
  std::optional<std::pair<Blobs, Blobs>> datasets;
  {
    auto first = accelerator.main_process_first();
    datasets = LoadOrMakeData(FLAGS_output_dir + "/data_cache.pt");
  }

  accel::DataLoaderOptions train_options;
  train_options.batch_size = static_cast<size_t>(FLAGS_batch_size);
  train_options.split_batches = true;
  train_options.shuffle = true;
  train_options.seed = static_cast<uint64_t>(FLAGS_seed);
  accel::DataLoader<Blobs> train_data(datasets->first, train_options);
  accel::DataLoaderOptions eval_options = train_options;
  eval_options.shuffle = false;
  accel::DataLoader<Blobs> eval_data(datasets->second, eval_options);

  const accel_examples::BlobsShape shape;
  torch::nn::Sequential net(torch::nn::Linear(shape.features, 64),
                            torch::nn::ReLU(),
                            torch::nn::Linear(64, shape.classes));
  torch::optim::AdamW adamw(net->parameters(),
                            torch::optim::AdamWOptions(FLAGS_lr));
  // Steps of one process over the whole run, as the schedule counts them.
  const int64_t training_steps = static_cast<int64_t>(train_data.size()) *
                                 FLAGS_epochs /
                                 accelerator.gradient_accumulation_steps();
  auto [model, optimizer, train_loader, eval_loader, lr_scheduler] =
      accelerator.prepare(net, adamw, train_data, eval_data,
                          accel::get_linear_schedule_with_warmup(
                              adamw, FLAGS_num_warmup_steps, training_steps));

  if (FLAGS_resume) {
    if (const std::string resumed = accelerator.load_state();
        !resumed.empty()) {
      accelerator.print("Resumed from", resumed, "at epoch",
                        train_loader.epoch() + 1, "after",
                        train_loader.state()->resume_samples, "samples");
    }
  }

  // Every process calls it; the trackers run on the main process.
  accelerator.init_trackers("complete_example",
                            {{"lr", FLAGS_lr},
                             {"epochs", FLAGS_epochs},
                             {"batch_size", FLAGS_batch_size},
                             {"num_warmup_steps", FLAGS_num_warmup_steps},
                             {"seed", FLAGS_seed},
                             {"num_processes", accelerator.num_processes()},
                             {"mixed_precision", accelerator.mixed_precision()},
                             {"gradient_accumulation_steps",
                              accelerator.gradient_accumulation_steps()}});

  int steps_this_run = 0;
  using Clock = std::chrono::steady_clock;
  for (int64_t epoch = train_loader.epoch(); epoch < FLAGS_epochs; ++epoch) {
    model->train();
    Clock::time_point step_start = Clock::now();
    int64_t samples_since_step = 0;
    for (auto& batch : train_loader) {
      auto accumulate = accelerator.accumulate(model);
      torch::Tensor loss;
      {
        auto autocast = accelerator.autocast();
        loss = torch::nn::functional::cross_entropy(model->forward(batch.data),
                                                    batch.target);
      }
      accelerator.backward(loss);
      if (accelerator.sync_gradients()) {
        accelerator.clip_grad_norm_(model->parameters(), 1.0);
      }
      optimizer.step();
      lr_scheduler.step();
      optimizer.zero_grad();
      // This process's share of a global batch of batch_size samples.
      samples_since_step += batch.data.size(0) * accelerator.num_processes();
      if (!accelerator.sync_gradients()) continue;
      ++steps_this_run;
      const double seconds =
          std::chrono::duration<double>(Clock::now() - step_start).count();
      // The main process's loss (no extra collective), as Accelerate's
      // example logs it; the step counts backward passes over the whole run.
      accelerator.log(
          {{"loss", loss.item<double>()},
           {"learning_rate", lr_scheduler.get_last_lr()[0]},
           {"samples_per_second", samples_since_step / std::max(seconds, 1e-9)},
           {"epoch", epoch}},
          accelerator.step());
      step_start = Clock::now();
      samples_since_step = 0;
      if (checkpoint_every > 0 && steps_this_run % checkpoint_every == 0) {
        accelerator.save_state();
      }
      // A cluster's warning before it kills the job (SIGTERM, SLURM's
      // --signal=USR1@60): save between optimizer steps, leave, and let
      // --resume continue from there.
      if (accelerator.check_preemption()) {
        const std::string saved = accelerator.save_state();
        accelerator.print("Preempted by",
                          accel::SignalName(accelerator.preemption_signal()),
                          "at epoch", epoch + 1, "- saved", saved,
                          "(continue with --resume)");
        accelerator.end_training();
        return accel::kPreemptedExitCode;
      }
      if (FLAGS_stop_after_steps > 0 &&
          steps_this_run >= FLAGS_stop_after_steps) {
        accelerator.print("Stopped after", steps_this_run, "steps");
        accelerator.end_training();
        return 0;
      }
    }

    model->eval();
    int64_t correct = 0;
    int64_t total = 0;
    for (auto& batch : eval_loader) {
      torch::Tensor predictions;
      {
        torch::NoGradGuard no_grad;
        auto autocast = accelerator.autocast();
        predictions = model->forward(batch.data).argmax(-1);
      }
      torch::Tensor all_predictions =
          accelerator.gather_for_metrics(predictions);
      torch::Tensor references = accelerator.gather_for_metrics(batch.target);
      correct += all_predictions.eq(references).sum().item<int64_t>();
      total += references.numel();
    }
    const double accuracy = static_cast<double>(correct) / total;
    accelerator.log({{"accuracy", accuracy}, {"epoch", epoch}},
                    accelerator.step());
    accelerator.print("Epoch", epoch + 1, "- accuracy",
                      std::to_string(accuracy), "on", total,
                      "samples, learning rate", lr_scheduler.get_last_lr()[0]);
    if (FLAGS_checkpointing_steps == "epoch") accelerator.save_state();
  }

  accelerator.wait_for_everyone();
  accelerator.save_model(model, FLAGS_output_dir + "/model");
  accelerator.print("Saved the weights to", FLAGS_output_dir + "/model");
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
