// Sharded state refused: every defect of the files found by Open (and by
// WriteShardIndex) before any data is used, or by Read when only the data is
// damaged; pieces a faulty sharder cut; wrong arguments. The round trips are
// in sharded_state_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "accel/checkpoint/safetensors.h"
#include "accel/checkpoint/sharded_state.h"
#include "accel/checkpoint/sharded_state_test_util.h"
#include "accel/runtime/base/errors.h"
#include "tests/subprocess.h"
#include "tests/tensor_files.h"

namespace accel {
namespace {

using sharded_state_testing::FileIn;
using sharded_state_testing::Named;
using sharded_state_testing::Originals;
using sharded_state_testing::PiecesOf;
using sharded_state_testing::WriteAll;
using ::testing::AllOf;
using ::testing::HasSubstr;
using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// What Open throws, or "" when it opens.
std::string OpenError(const std::string& dir) {
  try {
    ShardedStateReader::Open(dir);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

// ---- Files taken apart, independently of the library ------------------------

uint64_t Fnv1a(const std::string& bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (const unsigned char c : bytes) hash = (hash ^ c) * 0x100000001b3ull;
  return hash;
}

std::string HeaderText(const std::string& file_bytes) {
  uint64_t length;
  std::memcpy(&length, file_bytes.data(), 8);
  return file_bytes.substr(8, length);
}

// The index as the header comment specifies it, for files the library's
// own WriteShardIndex refuses: so that Open's checks are tested too.
void WriteIndexByHand(const std::string& dir, int world_size,
                      const std::string& run_id) {
  OrderedJson files = OrderedJson::array();
  for (int rank = 0; rank < world_size; ++rank) {
    const std::string bytes = testing::ReadBytes(FileIn(dir, rank, world_size));
    char hash[17];
    std::snprintf(hash, sizeof(hash), "%016llx",
                  static_cast<unsigned long long>(Fnv1a(HeaderText(bytes))));
    files.push_back({{"rank", rank},
                     {"name", ShardFileName(rank, world_size)},
                     {"bytes", bytes.size()},
                     {"header_fnv1a64", hash}});
  }
  const OrderedJson index = {{"format", "accel.sharded_state"},
                             {"version", 1},
                             {"run_id", run_id},
                             {"world_size", world_size},
                             {"files", files}};
  testing::WriteBytes(dir + "/" + kShardIndexName, index.dump());
}

// Rewrites a file's header through `edit(header, accel metadata)`, keeping
// its data.
void EditHeader(const std::string& path,
                const std::function<void(OrderedJson&, Json&)>& edit) {
  const std::string bytes = testing::ReadBytes(path);
  const std::string text = HeaderText(bytes);
  OrderedJson header = OrderedJson::parse(text);
  Json accel = Json::parse(
      header["__metadata__"]["accel_sharded_state"].get<std::string>());
  edit(header, accel);
  header["__metadata__"]["accel_sharded_state"] = accel.dump();
  const std::string edited = header.dump();
  const uint64_t length = edited.size();
  testing::WriteBytes(
      path, std::string(reinterpret_cast<const char*>(&length), 8) + edited +
                bytes.substr(8 + text.size()));
}

// The tensor whose bytes come last in a file (what a truncation cuts).
std::string LastTensorIn(const std::string& path) {
  const std::string bytes = testing::ReadBytes(path);
  const auto layout =
      safetensors::internal::ParseHeader(path, HeaderText(bytes), bytes.size());
  std::string last;
  uint64_t end = 0;
  for (const auto& [name, span] : layout.tensors) {
    if (span.end >= end && span.end > span.begin) {
      end = span.end;
      last = name;
    }
  }
  return last;
}

// ---- Defects, each found by Open before any data is used
// ---------------------

class ShardedStateDefectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("defect");
    WriteAll(dir_, tensors_, 4, "run-A");
    ASSERT_EQ(OpenError(dir_), "");
  }
  std::string File(int rank) const { return FileIn(dir_, rank, 4); }
  std::string Name(int rank) const { return ShardFileName(rank, 4); }

  const std::vector<Named> tensors_ = Originals();
  std::string dir_;
};

TEST_F(ShardedStateDefectTest, TruncatedFile) {
  const std::string lost = LastTensorIn(File(1));
  const auto size = std::filesystem::file_size(File(1));
  ASSERT_EQ(truncate(File(1).c_str(), static_cast<off_t>(size - 3)), 0);
  EXPECT_THAT(OpenError(dir_), AllOf(HasSubstr(Name(1)), HasSubstr("truncated"),
                                     HasSubstr("'" + lost + "'")));
  // Cut inside the header: still the file, and why.
  ASSERT_EQ(truncate(File(1).c_str(), 20), 0);
  EXPECT_THAT(OpenError(dir_), AllOf(HasSubstr(Name(1)), HasSubstr("truncated"),
                                     HasSubstr("header length")));
}

TEST_F(ShardedStateDefectTest, MissingFile) {
  ASSERT_EQ(unlink(File(2).c_str()), 0);
  EXPECT_THAT(OpenError(dir_), AllOf(HasSubstr(Name(2)), HasSubstr("missing"),
                                     HasSubstr("No such file")));
  // And the index is never written without it.
  try {
    WriteShardIndex(dir_, 4, "run-A");
    ADD_FAILURE() << "WriteShardIndex wrote an index without rank 2's file";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(Name(2)), HasSubstr("barrier")));
  }
}

TEST_F(ShardedStateDefectTest, MissingIndex) {
  ASSERT_EQ(unlink((dir_ + "/" + kShardIndexName).c_str()), 0);
  EXPECT_THAT(OpenError(dir_),
              AllOf(HasSubstr(kShardIndexName), HasSubstr("missing"),
                    HasSubstr("did not finish")));
}

TEST_F(ShardedStateDefectTest, FileOfAnotherRun) {
  const std::string other = testing::MakeTempDir("other_run");
  WriteAll(other, tensors_, 4, "run-B");  // Same tensors, same sizes.
  testing::WriteBytes(File(3), testing::ReadBytes(FileIn(other, 3, 4)));
  EXPECT_THAT(OpenError(dir_),
              AllOf(HasSubstr(Name(3)), HasSubstr("\"run-B\""),
                    HasSubstr("\"run-A\""), HasSubstr("another save")));
  // Nor does an index get written over such a file.
  ASSERT_EQ(unlink((dir_ + "/" + kShardIndexName).c_str()), 0);
  EXPECT_THROW(WriteShardIndex(dir_, 4, "run-A"), CheckpointError);
}

TEST_F(ShardedStateDefectTest, FileOfAnotherWorldSize) {
  const std::string other = testing::MakeTempDir("other_world");
  WriteAll(other, tensors_, 2, "run-A");  // Same run id, 2 ranks.
  testing::WriteBytes(File(1), testing::ReadBytes(FileIn(other, 1, 2)));
  EXPECT_THAT(OpenError(dir_),
              AllOf(HasSubstr(Name(1)), HasSubstr("world size 2"),
                    HasSubstr("checkpoint's 4")));
}

// A piece of rank 1's that starts inside a tensor (so rank 0 holds the
// elements before it).
ShardPiece CutPiece(const std::vector<Named>& tensors) {
  for (const ShardPiece& piece : PiecesOf(tensors, 4, 1)) {
    if (piece.offset > 0 && piece.data.numel() > 0) return piece;
  }
  ADD_FAILURE() << "no tensor is cut between ranks 0 and 1";
  return {};
}

TEST_F(ShardedStateDefectTest, CorruptedHeaderOffset) {
  const ShardPiece cut = CutPiece(tensors_);
  EditHeader(File(1), [&](OrderedJson&, Json& accel) {
    accel["pieces"][cut.name]["offset"] = cut.offset - 1;
  });
  // After the save: the header is not the one the index recorded.
  EXPECT_THAT(OpenError(dir_),
              AllOf(HasSubstr(Name(1)), HasSubstr("not the one the index "
                                                  "recorded")));
  // Before the index (a faulty writer): the overlap, with both files.
  EXPECT_THROW(WriteShardIndex(dir_, 4, "run-A"), CheckpointError);
  WriteIndexByHand(dir_, 4, "run-A");
  EXPECT_THAT(OpenError(dir_),
              AllOf(HasSubstr("tensor '" + cut.name + "'"), HasSubstr(Name(0)),
                    HasSubstr(Name(1)), HasSubstr("in two files")));
  // An offset past the tensor's end.
  EditHeader(File(1), [&](OrderedJson&, Json& accel) {
    accel["pieces"][cut.name]["offset"] = 1 << 20;
  });
  WriteIndexByHand(dir_, 4, "run-A");
  EXPECT_THAT(OpenError(dir_),
              AllOf(HasSubstr(Name(1)), HasSubstr("tensor '" + cut.name + "'"),
                    HasSubstr("beyond")));
}

TEST_F(ShardedStateDefectTest, DamagedDataFailsTheChecksumOnRead) {
  const ShardPiece cut = CutPiece(tensors_);
  const std::string bytes = testing::ReadBytes(File(1));
  const auto layout = safetensors::internal::ParseHeader(
      File(1), HeaderText(bytes), bytes.size());
  std::string damaged = bytes;
  damaged[layout.tensors.at(cut.name).begin] ^= 0x40;
  testing::WriteBytes(File(1), damaged);
  // Same size, same header: Open cannot tell; reading the piece does.
  const auto reader = ShardedStateReader::Open(dir_);
  try {
    reader.ReadWhole(cut.name);
    ADD_FAILURE() << "damaged data was read without an error";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(Name(1)), HasSubstr(cut.name),
                                HasSubstr("checksum")));
  }
}

// VerifyFile reads one file's pieces for their checksums: the damaged file
// fails it, naming the tensor; the others pass, and a wrong rank is a
// usage error.
TEST_F(ShardedStateDefectTest, VerifyFileFindsDamagedDataBeforeAnyRead) {
  const ShardPiece cut = CutPiece(tensors_);
  const std::string bytes = testing::ReadBytes(File(1));
  const auto layout = safetensors::internal::ParseHeader(
      File(1), HeaderText(bytes), bytes.size());
  std::string damaged = bytes;
  damaged[layout.tensors.at(cut.name).begin + 1] ^= 0x01;
  testing::WriteBytes(File(1), damaged);
  const auto reader = ShardedStateReader::Open(dir_);
  reader.VerifyFile(0);
  EXPECT_GT(reader.io_counts().data_bytes, 0u);
  try {
    reader.VerifyFile(1);
    ADD_FAILURE() << "damaged data verified";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(Name(1)), HasSubstr(cut.name),
                                HasSubstr("checksum")));
  }
  EXPECT_THROW(reader.VerifyFile(reader.world_size()), UsageError);
}

// A reshard reads parts of pieces: the damage outside the part read fails
// it all the same (the rest of the piece is read for its checksum).
TEST_F(ShardedStateDefectTest, DamageOutsideAPartialReadFailsIt) {
  const ShardPiece cut = CutPiece(tensors_);
  ASSERT_GE(cut.data.numel(), 2);
  const std::string bytes = testing::ReadBytes(File(1));
  const auto layout = safetensors::internal::ParseHeader(
      File(1), HeaderText(bytes), bytes.size());
  std::string damaged = bytes;
  damaged[layout.tensors.at(cut.name).begin] ^= 0x40;  // Its first element.
  testing::WriteBytes(File(1), damaged);
  const auto reader = ShardedStateReader::Open(dir_);
  // Only the piece's last element, which is intact.
  torch::Tensor last = torch::empty({1}, reader.info(cut.name).dtype);
  EXPECT_THAT(
      [&] { reader.Read(cut.name, cut.offset + cut.data.numel() - 1, last); },
      ::testing::ThrowsMessage<CheckpointError>(AllOf(
          HasSubstr(Name(1)), HasSubstr(cut.name), HasSubstr("checksum"))));
}

TEST_F(ShardedStateDefectTest, FileReplacedAfterOpen) {
  const auto reader = ShardedStateReader::Open(dir_);
  const std::string bytes = testing::ReadBytes(File(0));
  // Same bytes, another file (renamed into place, as a new save would).
  testing::WriteBytes(File(0) + ".new", bytes);
  ASSERT_EQ(std::rename((File(0) + ".new").c_str(), File(0).c_str()), 0);
  EXPECT_THAT([&] { reader.ReadWhole(tensors_[0].name); },
              ::testing::ThrowsMessage<CheckpointError>(
                  AllOf(HasSubstr(Name(0)), HasSubstr(tensors_[0].name),
                        HasSubstr("replaced"))));
}

// ---- OpenIndex: the index alone, each file checked where it is read -------

// Rewrites the index through `edit`.
void EditIndex(const std::string& dir, const std::function<void(Json&)>& edit) {
  const std::string path = dir + "/" + kShardIndexName;
  Json index = Json::parse(testing::ReadBytes(path));
  edit(index);
  testing::WriteBytes(path, index.dump());
}

// A non-empty piece that rank `rank`'s file holds.
ShardPiece PieceIn(const std::vector<Named>& tensors, int rank) {
  for (const ShardPiece& piece : PiecesOf(tensors, 4, rank)) {
    if (piece.data.numel() > 0) return piece;
  }
  ADD_FAILURE() << "rank " << rank << " holds no piece";
  return {};
}

TEST_F(ShardedStateDefectTest, OpenIndexMeetsAMissingFileWhereItReadsIt) {
  ASSERT_EQ(std::remove(File(3).c_str()), 0);
  EXPECT_THAT(OpenError(dir_), AllOf(HasSubstr(Name(3)), HasSubstr("missing")));
  const auto reader = ShardedStateReader::OpenIndex(dir_);  // The index only.
  reader.VerifyFile(0);  // The others are read as ever.
  const ShardPiece lost = PieceIn(tensors_, 3);
  torch::Tensor out = torch::empty({lost.data.numel()}, lost.data.dtype());
  EXPECT_THAT([&] { reader.Read(lost.name, lost.offset, out); },
              ::testing::ThrowsMessage<CheckpointError>(
                  AllOf(HasSubstr(Name(3)), HasSubstr("missing"),
                        HasSubstr("reading tensor '" + lost.name + "'"))));
  EXPECT_THAT([&] { reader.VerifyFile(3); },
              ::testing::ThrowsMessage<CheckpointError>(
                  AllOf(HasSubstr(Name(3)), HasSubstr("missing"))));
}

// The piece table and the headers are compared for each file before its
// data is used: an index edited after the save is refused, naming the file
// and the tensor, by Open and by a Read after OpenIndex.
TEST_F(ShardedStateDefectTest, AnIndexChangedAfterTheSaveIsRefused) {
  const ShardPiece piece = PieceIn(tensors_, 1);
  const std::string original = testing::ReadBytes(dir_ + "/" + kShardIndexName);
  // `file`: the first file checked that holds the tensor.
  const auto expect_refused = [&](const std::string& what,
                                  const std::string& file) {
    SCOPED_TRACE(what);
    const std::vector<std::string> words = {file, "'" + piece.name + "'",
                                            "the index was changed"};
    EXPECT_THAT(OpenError(dir_), AllOf(HasSubstr(words[0]), HasSubstr(words[1]),
                                       HasSubstr(words[2])));
    const auto reader = ShardedStateReader::OpenIndex(dir_);
    EXPECT_THAT(
        [&] { reader.ReadWhole(piece.name); },
        ::testing::ThrowsMessage<CheckpointError>(AllOf(
            HasSubstr(words[0]), HasSubstr(words[1]), HasSubstr(words[2]))));
    testing::WriteBytes(dir_ + "/" + kShardIndexName, original);
  };
  EditIndex(dir_, [&](Json& index) {
    for (Json& listed : index["tensors"][piece.name]["pieces"]) {
      if (listed[0] == 1) listed[3] = listed[3].get<uint64_t>() + 4;
    }
  });
  expect_refused("a piece's byte moved", Name(1));
  EditIndex(dir_, [&](Json& index) {
    for (Json& listed : index["tensors"][piece.name]["pieces"]) {
      if (listed[0] == 1) listed[4] = "0123456789abcdef";
    }
  });
  expect_refused("a piece's checksum", Name(1));
  EditIndex(dir_, [&](Json& index) {
    index["tensors"][piece.name]["dtype"] =
        piece.data.scalar_type() == torch::kDouble ? "I64" : "F64";
  });
  // Rank 0's file, checked first, lists that tensor too.
  expect_refused("the tensor's dtype", Name(0));
  EXPECT_EQ(OpenError(dir_), "");  // Restored, it opens.
}

// An index written before the piece table (version 1) loads from the
// headers, metadata included.
TEST_F(ShardedStateDefectTest, AVersion1IndexStillLoads) {
  EditIndex(dir_, [](Json& index) {
    index["version"] = 1;
    index.erase("tensors");
    for (Json& file : index["files"]) file.erase("metadata");
  });
  const auto reader = ShardedStateReader::OpenIndex(dir_);
  EXPECT_EQ(reader.metadata(2).at("rank_note"), "written by 2");
  for (const Named& t : tensors_) {
    EXPECT_TRUE(testing::SameBytes(reader.ReadWhole(t.name), t.tensor))
        << t.name;
  }
  EditIndex(dir_, [](Json& index) { index["version"] = 3; });
  EXPECT_THAT(OpenError(dir_), HasSubstr("reads versions 1 to 2"));
}

// Pieces of a {7, 5} tensor "w" cut by a faulty sharder.
std::string WriteFaulty(const std::vector<std::vector<ShardPiece>>& ranks) {
  const std::string dir = testing::MakeTempDir("faulty");
  const int world = static_cast<int>(ranks.size());
  for (int rank = 0; rank < world; ++rank) {
    WriteShardFile(dir, rank, world, "faulty", ranks[rank]);
  }
  return dir;
}

ShardPiece PieceOfW(int64_t begin, int64_t end,
                    torch::ScalarType dtype = torch::kFloat,
                    std::vector<int64_t> shape = {7, 5}) {
  return {"w", shape, begin,
          torch::arange(35, dtype).narrow(0, begin, end - begin)};
}

// WriteShardIndex refuses the files, and Open refuses them under an index
// written by hand; both with the same words.
void ExpectRefused(const std::string& dir, int world,
                   const std::vector<std::string>& words) {
  std::string refused;
  try {
    WriteShardIndex(dir, world, "faulty");
  } catch (const CheckpointError& e) {
    refused = e.what();
  }
  WriteIndexByHand(dir, world, "faulty");
  const std::string opened = OpenError(dir);
  for (const std::string& word : words) {
    EXPECT_THAT(refused, HasSubstr(word));
    EXPECT_THAT(opened, HasSubstr(word));
  }
}

TEST(ShardedStateFaultyPiecesTest, Overlap) {
  const std::string dir = WriteFaulty({{PieceOfW(0, 20)}, {PieceOfW(18, 35)}});
  ExpectRefused(dir, 2,
                {"tensor 'w'", "elements [18, 20) are in two files",
                 ShardFileName(0, 2), ShardFileName(1, 2)});
}

TEST(ShardedStateFaultyPiecesTest, Gap) {
  const std::string dir =
      WriteFaulty({{PieceOfW(0, 10)}, {PieceOfW(12, 35)}, {}});
  ExpectRefused(dir, 3,
                {"tensor 'w'", "elements [10, 12) are in no file",
                 ShardFileName(0, 3), ShardFileName(1, 3)});
  const std::string end = WriteFaulty({{PieceOfW(0, 10)}, {PieceOfW(10, 30)}});
  ExpectRefused(
      end, 2,
      {"tensor 'w'", "elements [30, 35) are in no file", ShardFileName(1, 2)});
}

TEST(ShardedStateFaultyPiecesTest, DtypeOrShapeDisagreement) {
  const std::string dtype =
      WriteFaulty({{PieceOfW(0, 20)}, {PieceOfW(20, 35, torch::kDouble)}});
  ExpectRefused(dtype, 2,
                {"tensor 'w'", "Double [7, 5] here, but Float",
                 ShardFileName(0, 2), ShardFileName(1, 2)});
  const std::string shape = WriteFaulty(
      {{PieceOfW(0, 20)}, {PieceOfW(20, 35, torch::kFloat, {5, 7})}});
  ExpectRefused(shape, 2,
                {"tensor 'w'", "Float [5, 7] here, but Float [7, 5]",
                 ShardFileName(0, 2), ShardFileName(1, 2)});
}

// ---- Wrong arguments
// ---------------------------------------------------------

TEST(ShardedStateUsageTest, ReadNamesTheTensorOfAWrongRequest) {
  const std::string dir = testing::MakeTempDir("usage");
  WriteAll(dir, Originals(), 2, "usage");
  const auto reader = ShardedStateReader::Open(dir);
  EXPECT_THAT(
      [&] { reader.ReadWhole("nope"); },
      ::testing::ThrowsMessage<CheckpointError>(HasSubstr("no tensor 'nope'")));
  EXPECT_THAT([&] { reader.Read("layers.0.bias", 10, torch::empty({4})); },
              ::testing::ThrowsMessage<CheckpointError>(
                  AllOf(HasSubstr("'layers.0.bias' has 13 elements"),
                        HasSubstr("[10, 14)"))));
  EXPECT_THROW(reader.Read("layers.0.bias", -1, torch::empty({4})), UsageError);
  EXPECT_THROW(reader.Read("layers.0.bias", 0, torch::empty({4, 2}).t()),
               UsageError);
  EXPECT_THROW(reader.metadata(2), UsageError);
}

TEST(ShardedStateUsageTest, WriteShardFileRefusesWrongPieces) {
  const std::string dir = testing::MakeTempDir("usage_write");
  const auto write = [&](std::vector<ShardPiece> pieces) {
    WriteShardFile(dir, 0, 1, "usage", pieces);
  };
  EXPECT_THAT(
      [&] {
        write({PieceOfW(0, 5), PieceOfW(5, 10)});
      },
      ::testing::ThrowsMessage<UsageError>(
          HasSubstr("two pieces of tensor 'w'")));
  EXPECT_THAT(
      [&] {
        write({{"w", {7, 5}, 30, torch::zeros({6})}});
      },
      ::testing::ThrowsMessage<UsageError>(
          HasSubstr("elements [30, 36) do not lie within its 35")));
  EXPECT_THAT(
      [&] {
        write({{"w", {7, 5}, 0, torch::zeros({7, 5})}});
      },
      ::testing::ThrowsMessage<UsageError>(HasSubstr("must be 1-D")));
  EXPECT_THROW(WriteShardFile(dir, 1, 1, "usage", {}), UsageError);
  EXPECT_THROW(WriteShardFile(dir, 0, 1, "", {}), UsageError);
  EXPECT_THROW(
      WriteShardFile(dir, 0, 1, "usage", {}, {{"accel_sharded_state", "x"}}),
      UsageError);
}

}  // namespace
}  // namespace accel
