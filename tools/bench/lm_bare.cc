// The floor of //tools/bench:lm: //examples:gpt's training without accel.
// One process, plain LibTorch: the same model (examples/gpt_model.h, whose
// blocks' accel::forward calls pass straight through outside a prepared
// model), text and blocks (examples/sotu_corpus.h), batch order (the
// permutation accel's DataLoader draws: torch::randperm seeded with seed +
// epoch), AdamW and cosine schedule; forward, backward, step, zero_grad.
// What accel's 1-process step costs above this is its overhead.
//
//   bazel run -c opt //tools/bench:lm_bare -- --max_steps=200
//
// Prints what //examples:gpt prints for the bench to read: "Trained N
// tokens in S s of training steps: R tokens/s" and the validation loss at
// the last step (the same --eval_blocks blocks).
#include <gflags/gflags.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "accel/optim/scheduler.h"
#include "examples/gpt_model.h"
#include "examples/sotu_corpus.h"

DEFINE_string(data_dir, "", "The corpus's data folder.");
DEFINE_int64(max_steps, 200, "Optimizer steps.");
DEFINE_int64(seed, 42, "Seed of the weights and the batch order.");
DEFINE_int32(batch_size, 16, "Sequences per batch.");
DEFINE_double(lr, 1e-3, "AdamW's peak learning rate.");
DEFINE_int64(warmup_steps, 20, "Linear warm-up steps, then cosine decay.");
DEFINE_int64(block_size, 128, "Tokens in a sequence.");
DEFINE_int64(n_layer, 4, "Blocks.");
DEFINE_int64(n_head, 4, "Attention heads per block.");
DEFINE_int64(n_embd, 128, "Width of the model.");
DEFINE_int64(eval_blocks, 256, "Validation blocks (0: all).");

namespace {

torch::Tensor Stack(accel_examples::TextBlocks& blocks,
                    const std::vector<int64_t>& ids, bool targets) {
  std::vector<torch::Tensor> rows;
  for (int64_t id : ids) {
    auto example = blocks.get(static_cast<size_t>(id));
    rows.push_back(targets ? example.target : example.data);
  }
  return torch::stack(rows);
}

double ValidationLoss(examples::Gpt& gpt, accel_examples::TextBlocks& blocks,
                      const torch::Tensor& mask) {
  torch::NoGradGuard no_grad;
  gpt->eval();
  double sum = 0;
  const int64_t count = static_cast<int64_t>(*blocks.size());
  for (int64_t start = 0; start < count; start += FLAGS_batch_size) {
    std::vector<int64_t> ids;
    for (int64_t i = start; i < std::min(count, start + FLAGS_batch_size);
         ++i) {
      ids.push_back(i);
    }
    const torch::Tensor logits = gpt->forward(Stack(blocks, ids, false), mask);
    sum += torch::nn::functional::cross_entropy(
               logits.reshape({-1, logits.size(-1)}),
               Stack(blocks, ids, true).reshape({-1}))
               .item<double>() *
           static_cast<double>(ids.size());
  }
  gpt->train();
  return sum / static_cast<double>(count);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  torch::manual_seed(static_cast<uint64_t>(FLAGS_seed));
  const accel_examples::SotuText text =
      accel_examples::SplitByYear(accel_examples::ReadSotuCorpus(
          accel_examples::FindSotuCorpus(FLAGS_data_dir)));
  accel_examples::TextBlocks train(text.train, FLAGS_block_size);
  accel_examples::TextBlocks validation(text.validation, FLAGS_block_size,
                                        FLAGS_eval_blocks);
  examples::GptConfig config;
  config.vocab_size = accel_examples::kByteVocabulary;
  config.block_size = FLAGS_block_size;
  config.n_layer = FLAGS_n_layer;
  config.n_head = FLAGS_n_head;
  config.n_embd = FLAGS_n_embd;
  config.dropout = 0;
  examples::Gpt gpt(config);
  torch::optim::AdamW adamw(gpt->parameters(),
                            torch::optim::AdamWOptions(FLAGS_lr));
  auto scheduler = accel::get_cosine_schedule_with_warmup(
      adamw, std::min(FLAGS_warmup_steps, FLAGS_max_steps), FLAGS_max_steps);
  const torch::Tensor mask = examples::CausalMask(FLAGS_block_size);
  const int64_t blocks = static_cast<int64_t>(*train.size());
  const int64_t batches = blocks / FLAGS_batch_size;

  double seconds = 0;
  int64_t step = 0;
  for (int64_t epoch = 0; step < FLAGS_max_steps; ++epoch) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(
        static_cast<uint64_t>(FLAGS_seed + epoch));
    const torch::Tensor order = torch::randperm(blocks, generator);
    const auto start = std::chrono::steady_clock::now();
    for (int64_t b = 0; b < batches && step < FLAGS_max_steps; ++b, ++step) {
      const torch::Tensor ids =
          order.narrow(0, b * FLAGS_batch_size, FLAGS_batch_size);
      const std::vector<int64_t> list(ids.data_ptr<int64_t>(),
                                      ids.data_ptr<int64_t>() + ids.numel());
      const torch::Tensor loss = examples::LanguageModelLoss(
          gpt->forward(Stack(train, list, false), mask),
          Stack(train, list, true));
      loss.backward();
      adamw.step();
      scheduler->step();
      adamw.zero_grad();
    }
    seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
  }
  const double loss = ValidationLoss(gpt, validation, mask);
  const int64_t tokens = step * FLAGS_batch_size * FLAGS_block_size;
  std::printf("step %lld: validation loss %.4f, perplexity %.3f\n",
              static_cast<long long>(step), loss, std::exp(loss));
  std::printf(
      "Trained %lld tokens in %.2f s of training steps: %.1f "
      "tokens/s\n",
      static_cast<long long>(tokens), seconds, tokens / seconds);
  return 0;
}
