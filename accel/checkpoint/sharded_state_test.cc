// Sharded state that works: tensors split as ZeRO splits them over W ranks,
// read back at every other world size and converted to another dtype; Read
// touching only the bytes of its range; Python reading a rank file; and
// (informative) write and read times of 64 MiB. What is refused is in
// sharded_state_defect_test.cc.
#include "accel/checkpoint/sharded_state.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "accel/checkpoint/sharded_state_test_util.h"
#include "tests/subprocess.h"
#include "tests/tensor_files.h"

namespace accel {
namespace {

using sharded_state_testing::FileIn;
using sharded_state_testing::ForEachPart;
using sharded_state_testing::Named;
using sharded_state_testing::Originals;
using sharded_state_testing::PiecesOf;
using sharded_state_testing::TotalElements;
using sharded_state_testing::WriteAll;
using Json = nlohmann::json;

// ---- Round trips ------------------------------------------------------------

TEST(ShardedStateTest, ReadsBackEverySplitAtEveryOtherWorldSize) {
  const std::vector<Named> tensors = Originals();
  const int64_t total = TotalElements(tensors);
  for (const int saved : {1, 2, 3, 4, 8}) {
    SCOPED_TRACE("saved by " + std::to_string(saved) + " ranks");
    const std::string dir =
        testing::MakeTempDir("roundtrip" + std::to_string(saved));
    WriteAll(dir, tensors, saved, "run-" + std::to_string(saved));
    const auto reader = ShardedStateReader::Open(dir);
    EXPECT_EQ(reader.world_size(), saved);
    EXPECT_EQ(reader.run_id(), "run-" + std::to_string(saved));
    EXPECT_EQ(reader.metadata(saved - 1).at("rank_note"),
              "written by " + std::to_string(saved - 1));
    EXPECT_EQ(reader.io_counts().data_bytes, 0u);  // Open read headers only.
    ASSERT_EQ(reader.names().size(), tensors.size());

    for (const Named& t : tensors) {
      EXPECT_EQ(reader.info(t.name).dtype, t.tensor.scalar_type()) << t.name;
      EXPECT_EQ(reader.info(t.name).shape, t.tensor.sizes().vec()) << t.name;
      const torch::Tensor whole = reader.ReadWhole(t.name);
      EXPECT_TRUE(testing::SameBytes(whole, t.tensor)) << t.name;
    }
    for (int world = 1; world <= 8; ++world) {
      int64_t elements = 0;
      for (int rank = 0; rank < world; ++rank) {
        ForEachPart(tensors, world, rank,
                    [&](size_t i, int64_t offset, int64_t length) {
                      const torch::Tensor& original = tensors[i].tensor;
                      torch::Tensor out =
                          torch::empty({length}, original.scalar_type());
                      reader.Read(tensors[i].name, offset, out);
                      const torch::Tensor expected =
                          original.reshape({-1}).narrow(0, offset, length);
                      EXPECT_TRUE(torch::equal(out, expected))
                          << tensors[i].name << " at " << world << " ranks, "
                          << "rank " << rank;
                      elements += length;
                    });
      }
      EXPECT_EQ(elements, total) << world << " ranks";
    }
  }
}

TEST(ShardedStateTest, ConvertsToTheDtypeOfOut) {
  const std::vector<Named> tensors = Originals();
  const std::string dir = testing::MakeTempDir("convert");
  WriteAll(dir, tensors, 3, "convert");
  const auto reader = ShardedStateReader::Open(dir);
  // Spans the pieces of all three ranks' files.
  torch::Tensor as_double = torch::empty({7, 5}, torch::kDouble);
  reader.Read("layers.0.weight", 0, as_double);
  EXPECT_TRUE(torch::equal(as_double, tensors[0].tensor.to(torch::kDouble)));
  torch::Tensor as_float = torch::empty({20}, torch::kFloat);
  reader.Read("embedding", 10, as_float);
  EXPECT_TRUE(torch::equal(
      as_float,
      tensors[4].tensor.reshape({-1}).narrow(0, 10, 20).to(torch::kFloat)));
}

TEST(ShardedStateTest, ReadOfOneRanksShareReadsOnlyThatShare) {
  // Big enough that headers are a small part of what is read.
  torch::manual_seed(1);
  const std::vector<Named> tensors = {
      {"a", torch::randn({300, 257})},
      {"b", torch::randn({100001})},
      {"c", torch::randn({64, 64}).to(torch::kBFloat16)},
  };
  uint64_t data_bytes = 0;
  for (const Named& t : tensors) data_bytes += t.tensor.nbytes();
  const std::string dir = testing::MakeTempDir("bytes");
  WriteAll(dir, tensors, 8, "bytes");

  for (int rank = 0; rank < 4; ++rank) {
    const auto reader = ShardedStateReader::Open(dir);
    const auto opened = reader.io_counts();
    EXPECT_EQ(opened.data_bytes, 0u);
    EXPECT_LT(opened.index_and_header_bytes, data_bytes / 100);
    uint64_t share_bytes = 0;
    ForEachPart(
        tensors, 4, rank, [&](size_t i, int64_t offset, int64_t length) {
          torch::Tensor out = torch::empty({length}, tensors[i].tensor.dtype());
          reader.Read(tensors[i].name, offset, out);
          EXPECT_TRUE(torch::equal(
              out, tensors[i].tensor.reshape({-1}).narrow(0, offset, length)));
          share_bytes += out.nbytes();
        });
    const auto counts = reader.io_counts();
    EXPECT_EQ(counts.data_bytes, share_bytes);  // Not one byte more.
    const double fraction = static_cast<double>(counts.data_bytes) /
                            static_cast<double>(data_bytes);
    EXPECT_NEAR(fraction, 0.25, 0.02);
    std::printf(
        "[ bytes    ] rank %d of 4 (saved by 8): read %llu of %llu data "
        "bytes (%.4f) in %llu preads, %llu header and index bytes on Open\n",
        rank, static_cast<unsigned long long>(counts.data_bytes),
        static_cast<unsigned long long>(data_bytes), fraction,
        static_cast<unsigned long long>(counts.reads),
        static_cast<unsigned long long>(opened.index_and_header_bytes));
  }
}

// OpenIndex reads the index alone; a Read then parses the header of the file
// it reads and of no other: what keeps a load's cost per rank to its bytes.
TEST(ShardedStateTest, OpenIndexReadsTheHeadersOfOnlyTheFilesItReads) {
  const std::vector<Named> tensors = Originals();
  const std::string dir = testing::MakeTempDir("lazy");
  WriteAll(dir, tensors, 4, "lazy");
  const auto reader = ShardedStateReader::OpenIndex(dir);
  const uint64_t index_bytes =
      testing::ReadBytes(dir + "/" + kShardIndexName).size();
  EXPECT_EQ(reader.io_counts().index_and_header_bytes, index_bytes);
  EXPECT_EQ(reader.metadata(3).at("rank_note"), "written by 3");  // Indexed.
  const std::string file = testing::ReadBytes(FileIn(dir, 2, 4));
  uint64_t header_length = 0;
  std::memcpy(&header_length, file.data(), 8);
  int pieces = 0;
  for (const ShardPiece& piece : PiecesOf(tensors, 4, 2)) {
    if (piece.data.numel() == 0) continue;
    torch::Tensor out = torch::empty({piece.data.numel()}, piece.data.dtype());
    reader.Read(piece.name, piece.offset, out);  // Held by rank 2's file.
    EXPECT_TRUE(testing::SameBytes(out, piece.data)) << piece.name;
    ++pieces;
  }
  ASSERT_GT(pieces, 0);
  // Rank 2's header, once, however many of its pieces were read.
  EXPECT_EQ(reader.io_counts().index_and_header_bytes,
            index_bytes + 8 + header_length);
}

TEST(ShardedStateTest, PythonReadsARankFileWithJsonAndStruct) {
  const std::vector<Named> tensors = Originals();
  const std::string dir = testing::MakeTempDir("python");
  WriteAll(dir, tensors, 3, "python");
  // Reassembles layers.0.weight from every rank file, by the format alone.
  const char* kScript = R"(
import json, struct, sys
values = {}
for path in sys.argv[1:]:
    data = open(path, 'rb').read()
    (n,) = struct.unpack('<Q', data[:8])
    header = json.loads(data[8:8 + n])
    pieces = json.loads(header['__metadata__']['accel_sharded_state'])['pieces']
    entry = header.get('layers.0.weight')
    if entry is None:
        continue
    begin, end = entry['data_offsets']
    piece = struct.unpack('<%df' % ((end - begin) // 4),
                          data[8 + n + begin:8 + n + end])
    offset = pieces['layers.0.weight']['offset']
    for i, v in enumerate(piece):
        values[offset + i] = v
print(json.dumps([values[i] for i in range(len(values))]))
)";
  std::vector<std::string> argv = {"/usr/bin/python3", "-c", kScript};
  for (int rank = 0; rank < 3; ++rank) argv.push_back(FileIn(dir, rank, 3));
  const testing::ProcessResult python =
      testing::RunProcess(argv, {}, std::chrono::seconds(60));
  ASSERT_EQ(python.exit_code, 0) << python.output;
  const auto values = Json::parse(python.output).get<std::vector<float>>();
  EXPECT_TRUE(
      torch::equal(torch::tensor(values).reshape({7, 5}), tensors[0].tensor));
}

// ---- Times (informative)
// -----------------------------------------------------

TEST(ShardedStateTest, TimesOf64MiB) {
  torch::manual_seed(2);
  std::vector<Named> tensors;
  for (int i = 0; i < 8; ++i) {
    // 64 MiB of float in tensors of uneven sizes, so ranks cut them.
    const int64_t rows = 1000 + 37 * i;
    tensors.push_back({"t" + std::to_string(i),
                       torch::randn({rows, (int64_t{1} << 21) / rows})});
  }
  uint64_t bytes = 0;
  for (const Named& t : tensors) bytes += t.tensor.nbytes();
  const auto seconds_since = [](auto start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
        .count();
  };
  for (const int world : {2, 4, 8}) {
    const std::string dir =
        testing::MakeTempDir("times" + std::to_string(world));
    auto start = std::chrono::steady_clock::now();
    WriteAll(dir, tensors, world, "times");
    const double write = seconds_since(start);

    start = std::chrono::steady_clock::now();
    const auto reader = ShardedStateReader::Open(dir);
    const double open = seconds_since(start);

    // Every rank of the other world size, one after another.
    const int other = world == 8 ? 3 : world * 2;
    start = std::chrono::steady_clock::now();
    for (int rank = 0; rank < other; ++rank) {
      ForEachPart(tensors, other, rank,
                  [&](size_t i, int64_t offset, int64_t length) {
                    torch::Tensor out = torch::empty({length});
                    reader.Read(tensors[i].name, offset, out);
                  });
    }
    const double reshard = seconds_since(start);

    start = std::chrono::steady_clock::now();
    bool same = true;
    for (const Named& t : tensors) {
      same = same && torch::equal(reader.ReadWhole(t.name), t.tensor);
    }
    const double whole = seconds_since(start);
    EXPECT_TRUE(same);
    const double mib = static_cast<double>(bytes) / (1 << 20);
    std::printf(
        "[ times    ] %.0f MiB, %d ranks: write %.3f s (%.0f MiB/s, fsync "
        "included), open %.4f s, read at %d ranks %.3f s (%.0f MiB/s), "
        "ReadWhole %.3f s (%.0f MiB/s, checksums checked)\n",
        mib, world, write, mib / write, open, other, reshard, mib / reshard,
        whole, mib / whole);
  }
}

}  // namespace
}  // namespace accel
