#include "examples/spam_corpus.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"
#include "examples/npm_dataset.h"

namespace accel_examples {
namespace {

constexpr size_t kMaxWordLength = 24;
constexpr int64_t kTestEvery = 5;  // Every fifth mail is a test mail.

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw accel::UsageError("cannot read mail " + path + ": " +
                            accel::ErrnoText(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool EndsWith(const std::string& text, const std::string& end) {
  return text.size() >= end.size() &&
         text.compare(text.size() - end.size(), end.size(), end) == 0;
}

// Appends the words of text[begin, end) to `words`.
void AppendWords(const std::string& text, size_t begin, size_t end,
                 std::vector<std::string>& words) {
  std::string word;
  for (size_t i = begin; i <= end; ++i) {
    const unsigned char c = i < end ? static_cast<unsigned char>(text[i]) : ' ';
    if (std::isalnum(c)) {
      if (word.size() < kMaxWordLength) {
        word.push_back(static_cast<char>(std::tolower(c)));
      }
    } else if (!word.empty()) {
      words.push_back(std::move(word));
      word.clear();
    }
  }
}

}  // namespace

std::string FindSpamCorpus(const std::string& dir) {
  static constexpr NpmDataset kSpamAssassin{"SpamAssassin corpus",
                                            kSpamCorpusPackage, "0.2.3",
                                            "file_list.json", "ACCEL_DATA_DIR"};
  return FindNpmDataset(kSpamAssassin, dir);
}

int64_t SpamCorpusFingerprint(const std::string& dir) {
  std::string names = dir;
  for (const std::string& group : accel::ListFolder(dir)) {
    names += "\n" + group;
    struct stat info;
    if (stat((dir + "/" + group).c_str(), &info) == 0 &&
        S_ISDIR(info.st_mode)) {
      for (const std::string& name : accel::ListFolder(dir + "/" + group)) {
        names += "/" + name;
      }
    }
  }
  // FNV-1a, kept positive for a tensor of int64.
  uint64_t hash = 1469598103934665603ull;
  for (const char c : names) {
    hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  }
  return static_cast<int64_t>(hash >> 1);
}

SpamCorpus ReadSpamCorpus(const std::string& dir) {
  SpamCorpus corpus;
  int groups = 0;
  for (const std::string& group : accel::ListFolder(dir)) {
    const bool spam = group.rfind("spam", 0) == 0;
    if (!spam && group.find("ham") == std::string::npos) continue;
    ++groups;
    int64_t index = 0;
    for (const std::string& name : accel::ListFolder(dir + "/" + group)) {
      if (!EndsWith(name, ".txt")) continue;
      Mail mail{group, ReadWhole(dir + "/" + group + "/" + name), spam};
      auto& split = index++ % kTestEvery == 0 ? corpus.test : corpus.train;
      split.push_back(std::move(mail));
    }
  }
  if (groups == 0 || corpus.test.empty()) {
    throw accel::UsageError(dir +
                            " has no spam-* or *ham-* folders of .txt mails");
  }
  return corpus;
}

std::vector<std::string> MailWords(const std::string& text) {
  std::vector<std::string> words;
  size_t body = text.find("\n\n");
  if (body == std::string::npos) body = text.size();
  // The Subject header, when the headers have one.
  for (size_t line = 0; line < body;) {
    size_t end = text.find('\n', line);
    if (end == std::string::npos || end > body) end = body;
    if (text.compare(line, 8, "Subject:") == 0) {
      AppendWords(text, line + 8, end, words);
      break;
    }
    line = end + 1;
  }
  AppendWords(text, std::min(body, text.size()), text.size(), words);
  return words;
}

Tokenizer::Tokenizer(const std::vector<Mail>& mails, int64_t vocab_size) {
  std::map<std::string, int64_t> counts;
  for (const Mail& mail : mails) {
    for (std::string& word : MailWords(mail.text)) ++counts[std::move(word)];
  }
  std::vector<std::pair<int64_t, std::string>> ranked;
  for (auto& [word, count] : counts) {
    if (count >= 2) ranked.emplace_back(-count, word);
  }
  std::sort(ranked.begin(), ranked.end());
  const size_t keep = static_cast<size_t>(std::max<int64_t>(vocab_size - 2, 0));
  if (ranked.size() > keep) ranked.resize(keep);
  for (size_t i = 0; i < ranked.size(); ++i) {
    ids_[ranked[i].second] = static_cast<int64_t>(i) + 2;
  }
}

TokenSet Tokenizer::Encode(const std::vector<Mail>& mails,
                           int64_t length) const {
  const int64_t count = static_cast<int64_t>(mails.size());
  TokenSet set{torch::full({count, length}, kPad, torch::kLong),
               torch::empty({count}, torch::kLong)};
  auto tokens = set.tokens.accessor<int64_t, 2>();
  auto labels = set.labels.accessor<int64_t, 1>();
  for (int64_t i = 0; i < count; ++i) {
    const std::vector<std::string> words = MailWords(mails[i].text);
    const int64_t used = std::min<int64_t>(length, words.size());
    for (int64_t t = 0; t < used; ++t) {
      const auto id = ids_.find(words[t]);
      tokens[i][t] = id == ids_.end() ? kUnknown : id->second;
    }
    if (used == 0) tokens[i][0] = kUnknown;
    labels[i] = mails[i].label;
  }
  return set;
}

}  // namespace accel_examples
