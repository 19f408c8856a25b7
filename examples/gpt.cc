// A GPT-style causal language model (examples/gpt_model.h: a ModuleList of
// blocks and a hand-written forward(tokens, mask)) trained with accel: any
// process count, DDP or ZeRO stages 1-3, mixed precision, activation
// checkpointing, checkpoints every --checkpointing_steps and resume. The
// text is synthetic here: sequences from a fixed random Markov chain, which
// the model learns (the loss falls from ln(vocab) towards the chain's
// entropy).
//
//   bazel run //examples:gpt -- --num_processes=2 --zero_stage=3
//       --mixed_precision=bf16 --activation_checkpointing --max_steps=200
//   bazel run //examples:gpt -- --num_processes=3 --zero_stage=3
//       --resume_from=gpt_model/checkpoints/checkpoint_2
// (each command on one line)
//
// At the end the main process prints the loss, the parameters' fingerprint
// (FNV-1a over their bytes, in state_dict order, so that runs compare bit
// for bit across process counts and stages) and their norm.
#include <torch/optim/adamw.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "accel/accelerator.h"
#include "examples/gpt_model.h"

DEFINE_int64(max_steps, 30, "Optimizer steps to train (in total, resumed).");
DEFINE_int64(checkpointing_steps, 0,
             "save_state every this many steps (0: only at the end).");
DEFINE_string(output_dir, "gpt_model", "Where save_state writes.");
DEFINE_string(resume_from, "", "A checkpoint folder to continue from.");
DEFINE_bool(resume, false,
            "Continue from the newest checkpoint in <output_dir>/checkpoints.");
DEFINE_int32(total_limit, 0, "Checkpoints to keep (0: all).");
DEFINE_int64(seed, 42, "Seed of the data, the weights and the shuffling.");
DEFINE_int32(batch_size, 8, "Global batch size, split across processes.");
DEFINE_int64(samples, 96, "Sequences in the synthetic data set.");
DEFINE_double(lr, 1e-3, "AdamW's learning rate.");
DEFINE_double(max_grad_norm, 0, "Clip the gradients' norm to this (0: no).");
DEFINE_int64(vocab_size, 64, "Tokens in the vocabulary.");
DEFINE_int64(block_size, 32, "Tokens in a sequence.");
DEFINE_int64(n_layer, 4, "Blocks.");
DEFINE_int64(n_head, 4, "Attention heads per block.");
DEFINE_int64(n_embd, 64, "Width of the model.");
DEFINE_double(dropout, 0.1, "Dropout probability.");
DEFINE_bool(activation_checkpointing, false,
            "Recompute each block's activations in backward.");
DEFINE_int64(print_every, 0, "Print the loss every this many steps (0: no).");

namespace {

// `samples` sequences of block_size + 1 tokens from a Markov chain whose
// next token is (5 * token + 1) % vocab, or a uniformly random one with
// probability 0.2; the same on every rank.
class MarkovText : public torch::data::datasets::Dataset<MarkovText> {
 public:
  MarkovText(uint64_t seed, int64_t samples, int64_t length, int64_t vocab) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    tokens_ = torch::empty({samples, length + 1}, torch::kLong);
    const torch::Tensor noise = torch::rand({samples, length + 1}, generator);
    const torch::Tensor random =
        torch::randint(0, vocab, {samples, length + 1}, generator);
    auto t = tokens_.accessor<int64_t, 2>();
    auto n = noise.accessor<float, 2>();
    auto r = random.accessor<int64_t, 2>();
    for (int64_t i = 0; i < samples; ++i) {
      t[i][0] = r[i][0];
      for (int64_t j = 1; j <= length; ++j) {
        t[i][j] = n[i][j] < 0.2 ? r[i][j] : (5 * t[i][j - 1] + 1) % vocab;
      }
    }
  }
  torch::data::Example<> get(size_t index) override {
    const torch::Tensor row = tokens_[static_cast<int64_t>(index)];
    const int64_t length = row.size(0) - 1;
    return {row.narrow(0, 0, length), row.narrow(0, 1, length)};
  }
  torch::optional<size_t> size() const override { return tokens_.size(0); }

 private:
  torch::Tensor tokens_;
};

uint64_t Fingerprint(const std::map<std::string, torch::Tensor>& state) {
  uint64_t hash = 1469598103934665603ull;
  for (const auto& [name, tensor] : state) {
    const torch::Tensor data = tensor.detach().cpu().contiguous();
    const auto* bytes = static_cast<const unsigned char*>(data.data_ptr());
    for (int64_t i = 0; i < data.numel() * data.element_size(); ++i) {
      hash = (hash ^ bytes[i]) * 1099511628211ull;
    }
  }
  return hash;
}

void CheckFlags() {
  const auto require = [](bool ok, const std::string& message) {
    if (!ok) throw accel::UsageError(message);
  };
  require(FLAGS_max_steps >= 0, "--max_steps must not be negative");
  require(FLAGS_checkpointing_steps >= 0,
          "--checkpointing_steps must not be negative");
  require(FLAGS_batch_size >= 1, "--batch_size must be at least 1");
  require(FLAGS_samples >= 1, "--samples must be at least 1");
  require(FLAGS_vocab_size >= 2 && FLAGS_block_size >= 1 &&
              FLAGS_n_layer >= 1 && FLAGS_n_head >= 1 && FLAGS_n_embd >= 1,
          "--vocab_size must be at least 2, and --block_size, --n_layer, "
          "--n_head and --n_embd at least 1");
  require(FLAGS_dropout >= 0 && FLAGS_dropout < 1,
          "--dropout must be in [0, 1)");
  require(!FLAGS_output_dir.empty(), "--output_dir is empty");
}

int Main(int, char**) {
  CheckFlags();
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

  examples::GptConfig config;
  config.vocab_size = FLAGS_vocab_size;
  config.block_size = FLAGS_block_size;
  config.n_layer = FLAGS_n_layer;
  config.n_head = FLAGS_n_head;
  config.n_embd = FLAGS_n_embd;
  config.dropout = FLAGS_dropout;
  config.activation_checkpointing = FLAGS_activation_checkpointing;
  examples::Gpt gpt(config);
  torch::optim::AdamW adamw(gpt->parameters(),
                            torch::optim::AdamWOptions(FLAGS_lr));
  accel::DataLoaderOptions loader_options;
  loader_options.batch_size = static_cast<size_t>(FLAGS_batch_size);
  loader_options.split_batches = true;
  loader_options.shuffle = true;
  loader_options.seed = *options.seed;
  accel::DataLoader<MarkovText> data(
      MarkovText(*options.seed, FLAGS_samples, FLAGS_block_size,
                 FLAGS_vocab_size),
      loader_options);
  auto [model, optimizer, loader] = accelerator.prepare(gpt, adamw, data);
  accelerator.print("GPT:", model->parameter_count(), "parameters,",
                    config.n_layer, "blocks, on", accelerator.num_processes(),
                    "process(es), zero_stage", options.zero_stage,
                    "mixed_precision", options.mixed_precision);

  std::string resumed = FLAGS_resume_from;
  if (!resumed.empty()) {
    accelerator.load_state(resumed);
  } else if (FLAGS_resume) {
    resumed = accelerator.load_state();
  }
  if (!resumed.empty()) {
    accelerator.print("Resumed from", resumed, "at step", accelerator.step());
  }

  const torch::Tensor mask =
      examples::CausalMask(FLAGS_block_size).to(accelerator.device());
  double last_loss = std::nan("");
  model->train();
  while (accelerator.step() < FLAGS_max_steps) {
    for (auto& batch : loader) {
      const torch::Tensor loss = examples::LanguageModelLoss(
          model->forward(batch.data, mask), batch.target);
      accelerator.backward(loss);
      if (FLAGS_max_grad_norm > 0) {
        accelerator.clip_grad_norm_(model->parameters(), FLAGS_max_grad_norm);
      }
      optimizer.step();
      optimizer.zero_grad();
      // The mean over every rank's share of the batch.
      last_loss = accelerator.reduce(loss.detach().to(torch::kFloat), "mean")
                      .item<double>();
      const int64_t step = accelerator.step();
      if (FLAGS_print_every > 0 && step % FLAGS_print_every == 0) {
        accelerator.print("step", step, "loss", std::to_string(last_loss));
      }
      if (FLAGS_checkpointing_steps > 0 &&
          step % FLAGS_checkpointing_steps == 0) {
        accelerator.print("saved", accelerator.save_state());
      }
      if (step >= FLAGS_max_steps) break;
    }
  }
  accelerator.save_state(FLAGS_output_dir);
  // Every rank: under --zero_stage=3 the units are gathered one at a time.
  const std::map<std::string, torch::Tensor> weights =
      accelerator.get_state_dict(model);
  if (accelerator.is_main_process()) {
    double squares = 0;
    for (const auto& entry : weights) {
      squares += entry.second.to(torch::kFloat64).pow(2).sum().item<double>();
    }
    if (FLAGS_print_every <= 0 || accelerator.step() % FLAGS_print_every) {
      std::printf("Step %lld loss %.6f\n",
                  static_cast<long long>(accelerator.step()), last_loss);
    }
    std::printf("Parameter fingerprint: %016llx\n",
                static_cast<unsigned long long>(Fingerprint(weights)));
    std::printf("Parameter norm: %.9e\n", std::sqrt(squares));
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
