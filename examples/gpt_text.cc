#include "examples/gpt_text.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <cstdio>

#include "accel/runtime/base/errors.h"
#include "examples/sotu_corpus.h"

namespace examples {
namespace {

// `length` tokens of a Markov chain whose next token is (5 * token + 1) %
// vocab, or a uniformly random one with probability 0.2.
torch::Tensor MarkovChain(uint64_t seed, int64_t length, int64_t vocab) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const torch::Tensor noise = torch::rand({length}, generator);
  const torch::Tensor random = torch::randint(0, vocab, {length}, generator);
  torch::Tensor tokens = torch::empty({length}, torch::kLong);
  auto t = tokens.accessor<int64_t, 1>();
  auto n = noise.accessor<float, 1>();
  auto r = random.accessor<int64_t, 1>();
  t[0] = r[0];
  for (int64_t j = 1; j < length; ++j) {
    t[j] = n[j] < 0.2 ? r[j] : (5 * t[j - 1] + 1) % vocab;
  }
  return tokens;
}

}  // namespace

GptText LoadGptText(const GptTextOptions& options, uint64_t seed) {
  if (options.kind == "markov") {
    const int64_t tokens = options.samples * options.block_size + 1;
    return {MarkovChain(seed, tokens, options.vocab_size),
            MarkovChain(seed + 1, tokens, options.vocab_size),
            options.vocab_size,
            "a Markov chain of " + std::to_string(tokens) + " tokens"};
  }
  if (options.kind != "sotu") {
    throw accel::UsageError("--text must be sotu or markov, not '" +
                            options.kind + "'");
  }
  const std::string dir = accel_examples::FindSotuCorpus(options.data_dir);
  const accel_examples::SotuText text =
      accel_examples::SplitByYear(accel_examples::ReadSotuCorpus(dir));
  return {text.train, text.validation, accel_examples::kByteVocabulary,
          "State of the Union: " + std::to_string(text.train_addresses) +
              " addresses, " + std::to_string(text.train.numel()) +
              " bytes to train on; " +
              std::to_string(text.validation_addresses) + " held out, " +
              std::to_string(text.validation.numel()) + " bytes"};
}

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

void PrintFinalWeights(int64_t step, double loss,
                       const std::map<std::string, torch::Tensor>& weights) {
  double squares = 0;
  for (const auto& [name, tensor] : weights) {
    squares += tensor.to(torch::kFloat64).pow(2).sum().item<double>();
  }
  std::printf("Step %lld loss %.6f\n", static_cast<long long>(step), loss);
  std::printf("Parameter fingerprint: %016llx\n",
              static_cast<unsigned long long>(Fingerprint(weights)));
  std::printf("Parameter norm: %.9e\n", std::sqrt(squares));
}

}  // namespace examples
