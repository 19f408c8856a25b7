#include "accel/checkpoint/tensor_shares.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "accel/checkpoint/sharded_state.h"
#include "accel/runtime/base/errors.h"
#include "tests/tensor_files.h"

namespace accel {
namespace {

std::string FreshDir() {
  std::string dir = ::testing::TempDir() + "/tensor_shares_XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) ADD_FAILURE() << "mkdtemp";
  return dir;
}

const TensorSplit kColumns{.dim = 1, .size = 2};

// W [4, 6], saved in 2 shares of 3 columns, each cut in two pieces as ZeRO
// over 2 ranks would (4 processes: tp 2 x dp_shard 2), with its Adam
// state and step count; b [5] whole, in two pieces.
struct Saved {
  std::string dir;
  torch::Tensor w = torch::arange(24, torch::kFloat32).view({4, 6});
  torch::Tensor exp_avg = -torch::arange(24, torch::kFloat32).view({4, 6});
  torch::Tensor b = torch::arange(5, torch::kFloat32);
};

Saved Save(const std::string& splits_metadata,
           const std::string& rank_3_metadata = "") {
  Saved saved;
  saved.dir = FreshDir();
  for (int rank = 0; rank < 4; ++rank) {
    const int tp = rank % 2, shard = rank / 2;
    const torch::Tensor w = ShareOf(saved.w, kColumns, tp).view({-1});
    const torch::Tensor m = ShareOf(saved.exp_avg, kColumns, tp).view({-1});
    std::vector<ShardPiece> pieces = {
        {ShareName("model_0/w", tp, 2),
         {4, 3},
         shard * 6,
         w.narrow(0, shard * 6, 6)},
        {"optimizer_0/" + ShareName("model_0/w", tp, 2) + "/exp_avg",
         {4, 3},
         shard * 6,
         m.narrow(0, shard * 6, 6)}};
    if (shard == 0) {
      pieces.push_back(
          {"optimizer_0/" + ShareName("model_0/w", tp, 2) + "/step",
           {},
           0,
           torch::tensor({int64_t{7}})});
    }
    if (tp == 0) {
      pieces.push_back({"model_0/b",
                        {5},
                        shard * 3,
                        saved.b.narrow(0, shard * 3, shard == 0 ? 3 : 2)});
    }
    WriteShardFile(saved.dir, rank, 4, "run", pieces,
                   {{kTensorSplitsKey, rank == 3 && !rank_3_metadata.empty()
                                           ? rank_3_metadata
                                           : splits_metadata}});
  }
  WriteShardIndex(saved.dir, 4, "run");
  return saved;
}

const std::string kSplits = EncodeTensorSplits({{"model_0/w", kColumns}});

TEST(TensorSharesTest, ReadsTheWholeAndEveryShareAtAnySize) {
  const Saved saved = Save(kSplits);
  const ShardedStateReader reader = ShardedStateReader::Open(saved.dir);
  const SharesReader shares(reader);
  const StateName w{"", "model_0/w", ""};
  ASSERT_NE(shares.SplitOf("model_0/w"), nullptr);
  EXPECT_EQ(*shares.SplitOf("model_0/w"), kColumns);
  EXPECT_EQ(shares.SplitOf("model_0/b"), nullptr);
  EXPECT_TRUE(shares.Contains(w));
  EXPECT_EQ(shares.Shape(w), (std::vector<int64_t>{4, 6}));
  EXPECT_TRUE(testing::SameBytes(shares.ReadWhole(w), saved.w));
  for (const TensorSplit& split :
       {TensorSplit{.dim = 1, .size = 1}, kColumns,
        TensorSplit{.dim = 1, .size = 3}, TensorSplit{.dim = 0, .size = 4},
        TensorSplit{.dim = 0, .fused = 2, .size = 2}}) {
    for (int rank = 0; rank < split.size; ++rank) {
      const torch::Tensor expected = ShareOf(saved.w, split, rank).view({-1});
      // Its second half, as ZeRO over 2 ranks would hold it.
      const int64_t half = expected.numel() / 2;
      torch::Tensor out = torch::empty({expected.numel() - half});
      shares.Read(w, split, rank, half, out);
      EXPECT_TRUE(out.equal(expected.narrow(0, half, out.numel())))
          << split.ToString() << ", rank " << rank;
    }
  }
  const StateName exp_avg{"optimizer_0/", "model_0/w", "/exp_avg"};
  EXPECT_TRUE(shares.ReadWhole(exp_avg).equal(saved.exp_avg));
  EXPECT_EQ(
      shares.ReadWhole({"optimizer_0/", "model_0/w", "/step"}).item<int64_t>(),
      7);
  EXPECT_EQ(shares.Suffixes("optimizer_0/", "model_0/w"),
            (std::vector<std::string>{"/exp_avg", "/step"}));
  EXPECT_EQ(shares.Suffixes("", "model_0/w"), (std::vector<std::string>{""}));
  EXPECT_EQ(shares.Suffixes("", "model_0/b"), (std::vector<std::string>{""}));
  EXPECT_EQ(shares.Names(),
            (std::vector<std::string>{"model_0/b", "model_0/w",
                                      "optimizer_0/model_0/w/exp_avg",
                                      "optimizer_0/model_0/w/step"}));
  // A whole tensor read as a share.
  torch::Tensor b = torch::empty({2});
  shares.Read({"", "model_0/b", ""}, {.dim = 0, .size = 1}, 0, 3, b);
  EXPECT_TRUE(b.equal(saved.b.narrow(0, 3, 2)));
}

TEST(TensorSharesTest, ASplitThatDoesNotFitIsACheckpointError) {
  const Saved saved = Save(kSplits);
  const ShardedStateReader reader = ShardedStateReader::Open(saved.dir);
  const SharesReader shares(reader);
  torch::Tensor out = torch::empty({4});
  EXPECT_THROW(
      shares.Read({"", "model_0/w", ""}, {.dim = 1, .size = 4}, 0, 0, out),
      CheckpointError);
  EXPECT_THROW(shares.Read({"", "model_0/w", ""}, kColumns, 0, 10, out),
               CheckpointError);
}

TEST(TensorSharesTest, RankFilesWhoseSplitsDifferAreACheckpointError) {
  const Saved saved =
      Save(kSplits, EncodeTensorSplits({{"model_0/w", {.dim = 0, .size = 2}}}));
  const ShardedStateReader reader = ShardedStateReader::Open(saved.dir);
  try {
    SharesReader shares(reader);
    ADD_FAILURE() << "no error";
  } catch (const CheckpointError& error) {
    EXPECT_NE(std::string(error.what())
                  .find("differ between rank 0's and "
                        "rank 3's files"),
              std::string::npos)
        << error.what();
  }
}

TEST(TensorSharesTest, MetadataThatDoesNotMatchTheSharesIsACheckpointError) {
  for (const std::string& metadata :
       {std::string("not json"), std::string(R"({"model_0/w": {"dim": 1}})"),
        EncodeTensorSplits({{"model_0/w", {.dim = 1, .size = 3}}}),
        EncodeTensorSplits({{"model_0/v", kColumns}})}) {
    const Saved saved = Save(metadata);
    const ShardedStateReader reader = ShardedStateReader::Open(saved.dir);
    try {
      SharesReader shares(reader);
      ADD_FAILURE() << "no error for " << metadata;
    } catch (const CheckpointError& error) {
      EXPECT_NE(std::string(error.what()).find(kTensorSplitsKey),
                std::string::npos)
          << error.what();
    }
  }
}

}  // namespace
}  // namespace accel
