// A GPT-style causal language model (examples/gpt_model.h: a ModuleList of
// blocks and a hand-written forward(tokens, mask)) trained with accel on the
// State of the Union addresses (examples/sotu_corpus.h: bytes as tokens,
// every tenth year held out): any process count, DDP or ZeRO stages 1-3,
// mixed precision, activation checkpointing, checkpoints every
// --checkpointing_steps and resume, trackers (--report_to).
//
//   bazel run //examples:gpt -- --num_processes=2
//   bazel run //examples:gpt -- --num_processes=2 --zero_stage=3
//       --mixed_precision=bf16 --activation_checkpointing --max_steps=400
//   bazel run //examples:gpt -- --num_processes=3 --zero_stage=3
//       --resume_from=gpt_model/checkpoints/checkpoint_2
// (each command on one line)
//
// Every --print_every steps the main process prints a progress line:
//   step 50/200 | loss 2.4172 | 11.6k tokens/s | MFU 33.1% of 98.2 GFLOP/s
//   | memory 402 MiB RSS, 183 MiB tensors (peaks, largest process)
// tokens/s counts every process's tokens; MFU is the model's FLOPs
// (accel::TransformerTrainingFlopsPerToken: 6N + attention) at that rate
// over the matrix-multiply peak all processes measured together at start
// (or --peak_gflops, e.g. from //tools/bench:gemm_peak). The validation
// loss and perplexity follow each epoch, every --eval_every steps and the
// end; then a sample of text from --prompt.
//
// --text=markov trains on a synthetic Markov chain instead (no corpus
// needed; the tests' choice). At the end the main process prints the loss,
// the parameters' fingerprint (FNV-1a over their bytes, in state_dict
// order, so that runs compare bit for bit across process counts and
// stages) and their norm.
#include <sys/resource.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "accel/accelerator.h"
#include "accel/memory/host_memory_tracker.h"
#include "accel/throughput.h"
#include "examples/gpt_model.h"
#include "examples/gpt_text.h"
#include "examples/sotu_corpus.h"

DEFINE_string(text, "sotu",
              "What to train on: sotu (the State of the Union addresses, "
              "bytes as tokens) or markov (a synthetic chain).");
DEFINE_string(data_dir, "",
              "The corpus's data folder (default: $ACCEL_SOTU_DIR, else "
              "where tools/setup.sh installs it).");
DEFINE_int64(epochs, 0,
             "Passes over the training text (0: as many as --max_steps "
             "takes).");
DEFINE_int64(max_steps, 200,
             "Stop after this many optimizer steps in total, resumed ones "
             "included (0: when --epochs are done).");
DEFINE_int64(checkpointing_steps, 0,
             "save_state every this many steps (0: only at the end).");
DEFINE_string(output_dir, "gpt_model", "Where save_state writes.");
DEFINE_string(resume_from, "", "A checkpoint folder to continue from.");
DEFINE_bool(resume, false,
            "Continue from the newest checkpoint in <output_dir>/checkpoints.");
DEFINE_int32(total_limit, 0, "Checkpoints to keep (0: all).");
DEFINE_int64(seed, 42, "Seed of the data, the weights and the shuffling.");
DEFINE_int32(batch_size, 16,
             "Global batch size in sequences, split across processes.");
DEFINE_int64(samples, 96,
             "--text=markov: training sequences (of block_size tokens).");
DEFINE_double(lr, 1e-3, "AdamW's peak learning rate.");
DEFINE_int64(warmup_steps, 20,
             "Linear warm-up steps, then cosine decay to 0 at the last step.");
DEFINE_double(max_grad_norm, 0, "Clip the gradients' norm to this (0: no).");
DEFINE_int64(vocab_size, 64, "--text=markov: tokens in the vocabulary.");
DEFINE_int64(block_size, 128, "Tokens in a sequence.");
DEFINE_int64(n_layer, 4, "Blocks.");
DEFINE_int64(n_head, 4, "Attention heads per block.");
DEFINE_int64(n_embd, 128, "Width of the model.");
DEFINE_double(dropout, 0.0, "Dropout probability.");
DEFINE_bool(activation_checkpointing, false,
            "Recompute each block's activations in backward.");
DEFINE_int64(print_every, 10,
             "Print the progress line every this many steps (0: no).");
DEFINE_int64(eval_every, 0,
             "Validation loss every this many steps too (0: each epoch's end "
             "and the last step only).");
DEFINE_int64(eval_blocks, 256,
             "Validation blocks, spread over the held-out text (0: all).");
DEFINE_double(peak_gflops, 0,
              "The job's matrix-multiply peak for MFU, all processes "
              "together (0: measure it at start).");
DEFINE_string(prompt, "The state of the Union is",
              "--text=sotu: the start of the generated sample.");
DEFINE_int64(generate, 300, "Tokens to generate at the end (0: none).");
DEFINE_int64(top_k, 5, "Sample each generated token from the k likeliest.");

namespace {

void CheckFlags() {
  const auto require = [](bool ok, const std::string& message) {
    if (!ok) throw accel::UsageError(message);
  };
  require(FLAGS_text == "sotu" || FLAGS_text == "markov",
          "--text must be sotu or markov, not '" + FLAGS_text + "'");
  require(FLAGS_epochs > 0 || FLAGS_max_steps > 0,
          "--epochs and --max_steps are both 0: nothing says when to stop");
  require(FLAGS_epochs >= 0 && FLAGS_max_steps >= 0 &&
              FLAGS_checkpointing_steps >= 0 && FLAGS_warmup_steps >= 0 &&
              FLAGS_print_every >= 0 && FLAGS_eval_every >= 0 &&
              FLAGS_eval_blocks >= 0 && FLAGS_generate >= 0 &&
              FLAGS_peak_gflops >= 0,
          "--epochs, --max_steps, --checkpointing_steps, --warmup_steps, "
          "--print_every, --eval_every, --eval_blocks, --generate and "
          "--peak_gflops must not be negative");
  require(FLAGS_batch_size >= 1, "--batch_size must be at least 1");
  require(FLAGS_samples >= 1, "--samples must be at least 1");
  require(FLAGS_top_k >= 1, "--top_k must be at least 1");
  require(FLAGS_vocab_size >= 2 && FLAGS_block_size >= 1 &&
              FLAGS_n_layer >= 1 && FLAGS_n_head >= 1 && FLAGS_n_embd >= 1,
          "--vocab_size must be at least 2, and --block_size, --n_layer, "
          "--n_head and --n_embd at least 1");
  require(FLAGS_dropout >= 0 && FLAGS_dropout < 1,
          "--dropout must be in [0, 1)");
  require(!FLAGS_output_dir.empty(), "--output_dir is empty");
}

// Wall time of training alone: evaluation, checkpoints and printing pause
// it (Pause() ... Resume()).
class TrainingClock {
 public:
  void Resume() { start_ = std::chrono::steady_clock::now(); }
  void Pause() {
    seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
            .count();
  }
  double seconds() const { return seconds_; }

 private:
  std::chrono::steady_clock::time_point start_ =
      std::chrono::steady_clock::now();
  double seconds_ = 0;
};

// The job's matrix-multiply FLOP/s: every process measures at once, with
// its threads, and the peaks add up.
double JobPeak(accel::Accelerator& accelerator) {
  if (FLAGS_peak_gflops > 0) return FLAGS_peak_gflops * 1e9;
  accelerator.wait_for_everyone();
  const double mine =
      accel::MeasureMatmulPeak(
          {.min_size = 256, .max_size = 1024, .seconds_per_size = 0.1})
          .flops_per_second;
  return accelerator.reduce(torch::tensor({mine}, torch::kFloat64), "sum")
      .item<double>();
}

// Peak RSS and peak tensor bytes, in MiB, of the process holding the most.
std::pair<double, double> PeakMemory(accel::Accelerator& accelerator) {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  const torch::Tensor mine = torch::tensor(
      {usage.ru_maxrss / 1024.0,
       accel::HostMemoryTracker::Install().peak_bytes() / 1048576.0},
      torch::kFloat64);
  const torch::Tensor most = accelerator.reduce(mine, "max");
  return {most[0].item<double>(), most[1].item<double>()};
}

std::string Thousands(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), value >= 1e4 ? "%.1fk" : "%.0f",
                value >= 1e4 ? value / 1e3 : value);
  return text;
}

struct Progress {
  double flops_per_token = 0;
  double peak = 0;  // FLOP/s.
  int64_t tokens_per_step = 0;
  int64_t steps_timed = 0;  // Since the last line.
  double seconds_at_last_line = 0;
};

// Mean next-token loss over the validation loader (every process's blocks,
// padding dropped).
template <typename Model, typename Loader>
double ValidationLoss(accel::Accelerator& accelerator, Model& model,
                      Loader& loader, const torch::Tensor& mask) {
  model->eval();
  std::vector<torch::Tensor> losses;
  for (auto& batch : loader) {
    torch::Tensor per_block;
    {
      torch::NoGradGuard no_grad;
      auto autocast = accelerator.autocast();
      const torch::Tensor logits = model->forward(batch.data, mask);
      per_block =
          torch::nn::functional::cross_entropy(
              logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
              batch.target.reshape({-1}),
              torch::nn::functional::CrossEntropyFuncOptions().reduction(
                  torch::kNone))
              .view({batch.target.size(0), -1})
              .mean(1);
    }
    losses.push_back(accelerator.gather_for_metrics(per_block));
  }
  model->train();
  return torch::cat(losses).to(torch::kFloat64).mean().item<double>();
}

std::string Printable(const std::string& bytes) {
  std::string text = bytes;
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 32 && c != '\n') c = ' ';
  }
  return text;
}

int Main(int, char**) {
  CheckFlags();
  accel::HostMemoryTracker::Install();
  const auto start = std::chrono::steady_clock::now();
  accel::AcceleratorOptions options = accel::AcceleratorOptions::FromFlags();
  options.seed = static_cast<uint64_t>(FLAGS_seed);
  options.project_dir = FLAGS_output_dir;
  options.total_limit = FLAGS_total_limit;
  accel::Accelerator accelerator(options);
  if (FLAGS_batch_size % accelerator.num_processes() != 0) {
    throw accel::UsageError(
        "--batch_size (" + std::to_string(FLAGS_batch_size) +
        ") must be a multiple of the number of processes (" +
        std::to_string(accelerator.num_processes()) + ")");
  }
  const examples::GptText text =
      examples::LoadGptText({.kind = FLAGS_text,
                             .data_dir = FLAGS_data_dir,
                             .block_size = FLAGS_block_size,
                             .samples = FLAGS_samples,
                             .vocab_size = FLAGS_vocab_size},
                            *options.seed);

  examples::GptConfig config;
  config.vocab_size = text.vocab_size;
  config.block_size = FLAGS_block_size;
  config.n_layer = FLAGS_n_layer;
  config.n_head = FLAGS_n_head;
  config.n_embd = FLAGS_n_embd;
  config.dropout = FLAGS_dropout;
  config.activation_checkpointing = FLAGS_activation_checkpointing;
  examples::Gpt gpt(config);
  Progress progress;
  progress.flops_per_token = accel::TransformerTrainingFlopsPerToken(
      {.parameters = gpt->matmul_parameter_count(),
       .n_layer = config.n_layer,
       .n_embd = config.n_embd,
       .sequence_length = config.block_size});
  progress.tokens_per_step = int64_t{FLAGS_batch_size} * FLAGS_block_size;
  const int64_t parameters = gpt->parameter_count();
  torch::optim::AdamW adamw(gpt->parameters(),
                            torch::optim::AdamWOptions(FLAGS_lr));
  accel::DataLoaderOptions train_options;
  train_options.batch_size = static_cast<size_t>(FLAGS_batch_size);
  train_options.split_batches = true;
  train_options.shuffle = true;
  train_options.drop_last = true;
  train_options.seed = *options.seed;
  accel::DataLoaderOptions validation_options = train_options;
  validation_options.shuffle = false;
  validation_options.drop_last = false;
  accel::DataLoader<accel_examples::TextBlocks> train_data(
      accel_examples::TextBlocks(text.train, FLAGS_block_size), train_options);
  accel::DataLoader<accel_examples::TextBlocks> validation_data(
      accel_examples::TextBlocks(text.validation, FLAGS_block_size,
                                 FLAGS_eval_blocks),
      validation_options);
  if (train_data.batches_per_epoch() == 0) {
    throw accel::UsageError(
        "the training text holds fewer blocks than one "
        "global batch (--batch_size=" +
        std::to_string(FLAGS_batch_size) + ")");
  }
  const int64_t epoch_steps =
      static_cast<int64_t>(train_data.batches_per_epoch());
  // --max_steps, or --epochs' steps, whichever comes first.
  int64_t total_steps = FLAGS_epochs * epoch_steps;
  if (FLAGS_epochs == 0 ||
      (FLAGS_max_steps > 0 && FLAGS_max_steps < total_steps)) {
    total_steps = FLAGS_max_steps;
  }
  auto [model, optimizer, loader, validation, scheduler] = accelerator.prepare(
      gpt, adamw, train_data, validation_data,
      accel::get_cosine_schedule_with_warmup(
          adamw, std::min(FLAGS_warmup_steps, total_steps), total_steps));
  accelerator.print(text.description);
  accelerator.print("GPT:", parameters, "parameters,", config.n_layer,
                    "blocks of", config.n_embd, "on",
                    accelerator.num_processes(), "process(es), zero_stage",
                    options.zero_stage, "mixed_precision",
                    options.mixed_precision);
  accelerator.init_trackers("gpt",
                            {{"lr", FLAGS_lr},
                             {"batch_size", FLAGS_batch_size},
                             {"block_size", FLAGS_block_size},
                             {"n_layer", FLAGS_n_layer},
                             {"n_embd", FLAGS_n_embd},
                             {"num_processes", accelerator.num_processes()},
                             {"text", FLAGS_text}});

  std::string resumed = FLAGS_resume_from;
  if (!resumed.empty()) {
    accelerator.load_state(resumed);
  } else if (FLAGS_resume) {
    resumed = accelerator.load_state();
  }
  if (!resumed.empty()) {
    accelerator.print("Resumed from", resumed, "at step", accelerator.step());
  }
  progress.peak = JobPeak(accelerator);

  const torch::Tensor mask =
      examples::CausalMask(FLAGS_block_size).to(accelerator.device());
  double last_loss = std::nan("");
  const auto evaluate = [&](const std::string& when) {
    const double loss = ValidationLoss(accelerator, model, validation, mask);
    accelerator.log({{"val_loss", loss}, {"val_perplexity", std::exp(loss)}},
                    accelerator.step());
    char line[160];
    std::snprintf(line, sizeof(line),
                  "%s: validation loss %.4f, perplexity %.3f (%.3f bits "
                  "per token)",
                  when.c_str(), loss, std::exp(loss), loss / std::log(2.0));
    accelerator.print(line);
  };
  const auto print_progress = [&](int64_t step, double seconds) {
    const double tokens_per_s =
        progress.tokens_per_step * progress.steps_timed /
        std::max(seconds - progress.seconds_at_last_line, 1e-9);
    const double mfu = progress.flops_per_token * tokens_per_s / progress.peak;
    const auto [rss, tensors] = PeakMemory(accelerator);
    accelerator.log({{"tokens_per_s", tokens_per_s}, {"mfu", mfu}}, step);
    char line[256];
    std::snprintf(line, sizeof(line),
                  "step %lld/%lld | loss %.4f | %s tokens/s | MFU %.1f%% of "
                  "%.1f GFLOP/s | memory %.0f MiB RSS, %.0f MiB tensors "
                  "(peaks, largest process)",
                  static_cast<long long>(step),
                  static_cast<long long>(total_steps), last_loss,
                  Thousands(tokens_per_s).c_str(), 100 * mfu,
                  progress.peak / 1e9, rss, tensors);
    accelerator.print(line);
    progress.steps_timed = 0;
    progress.seconds_at_last_line = seconds;
  };

  TrainingClock clock;
  const int64_t first_step = accelerator.step();
  model->train();
  for (int64_t epoch = loader.epoch(); accelerator.step() < total_steps;
       ++epoch) {
    clock.Resume();
    for (auto& batch : loader) {
      // One slice, the batch, unless --invariant_micro_batches cuts it
      // (the same bits at any process count).
      const auto slices = accelerator.micro_batches(batch);
      torch::Tensor loss_sum = torch::zeros({}, torch::kFloat);
      for (const auto& slice : slices) {
        torch::Tensor loss;
        {
          auto autocast = accelerator.autocast();
          loss = examples::LanguageModelLoss(model->forward(slice.data, mask),
                                             slice.target);
        }
        accelerator.backward(loss);
        loss_sum += loss.detach().to(torch::kFloat) /
                    static_cast<double>(slices.size());
      }
      if (FLAGS_max_grad_norm > 0) {
        accelerator.clip_grad_norm_(model->parameters(), FLAGS_max_grad_norm);
      }
      optimizer.step();
      scheduler.step();
      optimizer.zero_grad();
      ++progress.steps_timed;
      const int64_t step = accelerator.step();
      const bool last = step >= total_steps;
      const bool print = FLAGS_print_every > 0 && step % FLAGS_print_every == 0;
      // This process's loss (no collective), as Accelerate's examples log.
      accelerator.log({{"loss", loss_sum.item<double>()}}, step);
      if (!print && !last &&
          !(FLAGS_checkpointing_steps > 0 &&
            step % FLAGS_checkpointing_steps == 0) &&
          !(FLAGS_eval_every > 0 && step % FLAGS_eval_every == 0)) {
        continue;
      }
      clock.Pause();
      if (print || last) {
        // The mean over every process's share of the batch.
        last_loss = accelerator.reduce(loss_sum, "mean").item<double>();
      }
      if (print) print_progress(step, clock.seconds());
      if (FLAGS_eval_every > 0 && step % FLAGS_eval_every == 0 && !last) {
        evaluate("step " + std::to_string(step));
      }
      if (FLAGS_checkpointing_steps > 0 &&
          step % FLAGS_checkpointing_steps == 0) {
        accelerator.print("saved", accelerator.save_state());
      }
      if (last) break;
      clock.Resume();
    }
    if (accelerator.step() < total_steps) {
      clock.Pause();
      evaluate("epoch " + std::to_string(epoch));
    }
  }
  evaluate("step " + std::to_string(accelerator.step()));
  accelerator.save_state(FLAGS_output_dir);
  const double trained_seconds = clock.seconds();
  const int64_t steps_this_run = accelerator.step() - first_step;

  if (FLAGS_generate > 0) {
    const torch::Tensor prompt = FLAGS_text == "sotu"
                                     ? accel_examples::EncodeBytes(FLAGS_prompt)
                                     : torch::zeros({1}, torch::kLong);
    auto generator = at::make_generator<at::CPUGeneratorImpl>(*options.seed);
    model->eval();
    torch::Tensor sample;
    {
      auto autocast = accelerator.autocast();
      sample = examples::Generate(model, prompt.to(accelerator.device()),
                                  FLAGS_generate, FLAGS_block_size, FLAGS_top_k,
                                  generator);
    }
    accelerator.print(
        "Sample (top_k " + std::to_string(FLAGS_top_k) + "):\n" +
        (FLAGS_text == "sotu"
             ? Printable(accel_examples::DecodeBytes(sample.cpu()))
             : sample.cpu().to(torch::kLong).toString()) +
        "\n");
  }

  // Every rank: under --zero_stage=3 the units are gathered one at a time.
  const std::map<std::string, torch::Tensor> weights =
      accelerator.get_state_dict(model);
  if (accelerator.is_main_process()) {
    examples::PrintFinalWeights(accelerator.step(), last_loss, weights);
    // This run's steps (a resumed run's own).
    const int64_t tokens = progress.tokens_per_step * steps_this_run;
    std::printf(
        "Trained %lld tokens in %.2f s of training steps: %.1f "
        "tokens/s\n",
        static_cast<long long>(tokens), trained_seconds,
        tokens / std::max(trained_seconds, 1e-9));
    std::printf(
        "Trained in %.2f s\n",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
  }
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
