#include "examples/sotu_corpus.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <sstream>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"
#include "examples/npm_dataset.h"

namespace accel_examples {
namespace {

bool IsAddressFile(const std::string& name) {
  return name.size() > 9 && std::isdigit(static_cast<unsigned char>(name[0])) &&
         name.compare(name.size() - 4, 4, ".txt") == 0;
}

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw accel::UsageError("cannot read address " + path + ": " +
                            accel::ErrnoText(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int YearOf(const std::string& dir, const std::string& name) {
  int year = 0;
  size_t i = 0;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]));
       ++i) {
    year = year * 10 + (name[i] - '0');
  }
  if (i != 4 || i >= name.size() || name[i] != '_') {
    throw accel::UsageError(dir + "/" + name +
                            ": expected a name YEAR_president_party.txt");
  }
  return year;
}

torch::Tensor Concatenate(const std::vector<const Address*>& addresses) {
  size_t bytes = 0;
  for (const Address* address : addresses) bytes += address->text.size() + 2;
  torch::Tensor text =
      torch::empty({static_cast<int64_t>(bytes)}, torch::kByte);
  auto* out = text.data_ptr<uint8_t>();
  for (const Address* address : addresses) {
    std::memcpy(out, address->text.data(), address->text.size());
    out += address->text.size();
    *out++ = '\n';
    *out++ = '\n';
  }
  return text;
}

}  // namespace

std::string FindSotuCorpus(const std::string& dir) {
  static constexpr NpmDataset kSotu{"State of the Union corpus", kSotuPackage,
                                    "0.2.3", "1790_george_washington_n.txt",
                                    "ACCEL_SOTU_DIR"};
  return FindNpmDataset(kSotu, dir);
}

std::vector<Address> ReadSotuCorpus(const std::string& dir) {
  std::vector<Address> addresses;
  for (const std::string& name : accel::ListFolder(dir)) {
    if (!IsAddressFile(name)) continue;
    addresses.push_back({YearOf(dir, name), name, ReadWhole(dir + "/" + name)});
  }
  if (addresses.empty()) {
    throw accel::UsageError(dir + " holds no YEAR_*.txt addresses");
  }
  return addresses;
}

SotuText SplitByYear(const std::vector<Address>& addresses) {
  std::vector<const Address*> train, validation;
  for (const Address& address : addresses) {
    (address.year % kValidationEveryYears == 0 ? validation : train)
        .push_back(&address);
  }
  if (train.empty() || validation.empty()) {
    throw accel::UsageError(
        "the corpus needs addresses of years divisible by " +
        std::to_string(kValidationEveryYears) +
        " (validation) and of other years (training); it has " +
        std::to_string(validation.size()) + " and " +
        std::to_string(train.size()));
  }
  return {Concatenate(train), Concatenate(validation),
          static_cast<int64_t>(train.size()),
          static_cast<int64_t>(validation.size())};
}

TextBlocks::TextBlocks(torch::Tensor text, int64_t block_size,
                       int64_t max_blocks)
    : text_(std::move(text)), block_size_(block_size) {
  if (block_size < 1 || text_.dim() != 1 || text_.size(0) < block_size + 1) {
    throw accel::UsageError("a text of " + std::to_string(text_.numel()) +
                            " bytes holds no block of " +
                            std::to_string(block_size) +
                            " bytes and the next one");
  }
  available_ = (text_.size(0) - 1) / block_size;
  blocks_ = max_blocks > 0 ? std::min(max_blocks, available_) : available_;
}

torch::data::Example<> TextBlocks::get(size_t index) {
  const int64_t i = static_cast<int64_t>(index);
  // Evenly spread when serving fewer blocks than the text holds.
  const int64_t block = blocks_ == available_ ? i : i * available_ / blocks_;
  const torch::Tensor bytes =
      text_.narrow(0, block * block_size_, block_size_ + 1).to(torch::kLong);
  return {bytes.narrow(0, 0, block_size_), bytes.narrow(0, 1, block_size_)};
}

torch::Tensor EncodeBytes(const std::string& text) {
  torch::Tensor bytes =
      torch::empty({static_cast<int64_t>(text.size())}, torch::kByte);
  std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
  return bytes.to(torch::kLong);
}

std::string DecodeBytes(const torch::Tensor& tokens) {
  const torch::Tensor ids = tokens.to(torch::kLong).contiguous().flatten();
  if (ids.numel() > 0 && (ids.min().item<int64_t>() < 0 ||
                          ids.max().item<int64_t>() >= kByteVocabulary)) {
    throw accel::UsageError("DecodeBytes: a token outside 0..255");
  }
  const torch::Tensor bytes = ids.to(torch::kByte);
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
                     static_cast<size_t>(bytes.numel()));
}

}  // namespace accel_examples
