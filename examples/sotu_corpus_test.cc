// The State of the Union reader on a made-up folder: the split by year,
// blocks and their next bytes, the evenly spread subset, byte round trips,
// and the errors that name the folder or file.
#include "examples/sotu_corpus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "accel/runtime/base/errors.h"

namespace accel_examples {
namespace {

using ::testing::HasSubstr;

std::string MakeFolder(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/" + name;
  mkdir(dir.c_str(), 0755);
  return dir;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string Bytes(const torch::Tensor& text) { return DecodeBytes(text); }

TEST(SotuCorpusTest, SplitsByYearInFileOrder) {
  const std::string dir = MakeFolder("sotu_split");
  Write(dir + "/1792_b_n.txt", "Second.");
  Write(dir + "/1791_a_n.txt", "First.");
  Write(dir + "/1800_c_f.txt", "Held out.");  // A year divisible by 10.
  Write(dir + "/1791_a_n.json", "{}");        // Not an address.
  const std::vector<Address> addresses = ReadSotuCorpus(dir);
  ASSERT_EQ(addresses.size(), 3u);
  EXPECT_EQ(addresses[0].year, 1791);
  EXPECT_EQ(addresses[0].name, "1791_a_n.txt");
  const SotuText text = SplitByYear(addresses);
  EXPECT_EQ(Bytes(text.train), "First.\n\nSecond.\n\n");
  EXPECT_EQ(Bytes(text.validation), "Held out.\n\n");
  EXPECT_EQ(text.train_addresses, 2);
  EXPECT_EQ(text.validation_addresses, 1);
  EXPECT_EQ(text.train.scalar_type(), torch::kByte);
}

TEST(SotuCorpusTest, BlocksAreInputsAndTheirNextBytes) {
  TextBlocks blocks(EncodeBytes("abcdefghij").to(torch::kByte), 3);
  ASSERT_EQ(*blocks.size(), 3u);  // (10 - 1) / 3: the last needs byte 10.
  const auto second = blocks.get(1);
  EXPECT_EQ(DecodeBytes(second.data), "def");
  EXPECT_EQ(DecodeBytes(second.target), "efg");
  EXPECT_EQ(second.data.scalar_type(), torch::kLong);
  EXPECT_EQ(DecodeBytes(blocks.get(2).target), "hij");
}

TEST(SotuCorpusTest, FewerBlocksAreSpreadOverTheText) {
  // 100 blocks of 2; 4 of them: blocks 0, 25, 50, 75.
  torch::Tensor text = torch::arange(201, torch::kLong);
  TextBlocks spread(text, 2, 4);
  ASSERT_EQ(*spread.size(), 4u);
  EXPECT_EQ(spread.get(1).data[0].item<int64_t>(), 50);
  EXPECT_EQ(spread.get(3).data[0].item<int64_t>(), 150);
  EXPECT_EQ(*TextBlocks(text, 2, 1000).size(),
            100u);  // No more than there are.
}

TEST(SotuCorpusTest, BytesRoundTripAndOutOfRangeIdsThrow) {
  const std::string text = "caf\xc3\xa9 \x01\xff";
  EXPECT_EQ(DecodeBytes(EncodeBytes(text)), text);
  EXPECT_EQ(EncodeBytes("\xff")[0].item<int64_t>(), 255);
  EXPECT_THROW(DecodeBytes(torch::tensor({256}, torch::kLong)),
               accel::UsageError);
}

TEST(SotuCorpusTest, ErrorsNameTheFolderOrFile) {
  const std::string empty = MakeFolder("sotu_empty");
  try {
    ReadSotuCorpus(empty);
    ADD_FAILURE() << "an empty folder was read";
  } catch (const accel::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr(empty + " holds no YEAR_*.txt"));
  }
  const std::string odd = MakeFolder("sotu_odd");
  Write(odd + "/17_short.txt", "x");
  try {
    ReadSotuCorpus(odd);
    ADD_FAILURE() << "a name without a year was read";
  } catch (const accel::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr(odd + "/17_short.txt: expected a name "
                                          "YEAR_president_party.txt"));
  }
  const std::string only_train = MakeFolder("sotu_train_only");
  Write(only_train + "/1791_b_n.txt", "x");
  EXPECT_THROW(SplitByYear(ReadSotuCorpus(only_train)), accel::UsageError);
  EXPECT_THROW(TextBlocks(EncodeBytes("ab"), 2), accel::UsageError);
  try {
    FindSotuCorpus(odd);
    ADD_FAILURE() << "a folder without the marker was taken";
  } catch (const accel::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("--data_dir=" + odd +
                                    " holds no State of the Union corpus"));
  }
}

}  // namespace
}  // namespace accel_examples
