#include "accel/core/tensor_split.h"

#include <gtest/gtest.h>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

torch::Tensor Counting(std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return torch::arange(n, torch::kFloat64).view(shape);
}

TEST(TensorSplitTest, ColumnSharesAreRowBlocks) {
  const torch::Tensor whole = Counting({4, 3});
  const TensorSplit rows{.dim = 0, .size = 2};
  EXPECT_TRUE(ShareOf(whole, rows, 0).equal(whole.narrow(0, 0, 2)));
  EXPECT_TRUE(ShareOf(whole, rows, 1).equal(whole.narrow(0, 2, 2)));
}

TEST(TensorSplitTest, RowSharesAreColumnBlocks) {
  const torch::Tensor whole = Counting({3, 4});
  const TensorSplit columns{.dim = 1, .size = 2};
  EXPECT_TRUE(ShareOf(whole, columns, 1).equal(whole.narrow(1, 2, 2)));
}

TEST(TensorSplitTest, FusedBlocksAreEachSplit) {
  // q|k|v rows of 4 each: rank 1 of 2 holds rows 2-3, 6-7 and 10-11.
  const torch::Tensor whole = Counting({12, 2});
  const torch::Tensor share =
      ShareOf(whole, {.dim = 0, .fused = 3, .size = 2}, 1);
  const torch::Tensor expected = torch::cat(
      {whole.narrow(0, 2, 2), whole.narrow(0, 6, 2), whole.narrow(0, 10, 2)});
  EXPECT_TRUE(share.equal(expected));
}

TEST(TensorSplitTest, JoinSharesInvertsShareOfForEverySplit) {
  for (const TensorSplit& split :
       {TensorSplit{.dim = 0, .size = 1}, TensorSplit{.dim = 0, .size = 4},
        TensorSplit{.dim = 1, .size = 3},
        TensorSplit{.dim = 0, .fused = 3, .size = 2}}) {
    const torch::Tensor whole = Counting({12, 6});
    std::vector<torch::Tensor> shares;
    for (int r = 0; r < split.size; ++r) {
      shares.push_back(ShareOf(whole, split, r));
    }
    EXPECT_TRUE(JoinShares(shares, split).equal(whole)) << split.ToString();
    EXPECT_EQ(WholeShape(shares[0].sizes().vec(), split), whole.sizes().vec());
  }
}

TEST(TensorSplitTest, ASplitThatDoesNotDivideIsAUsageError) {
  EXPECT_THROW(ShareOf(Counting({5, 2}), {.dim = 0, .size = 2}, 0), UsageError);
  EXPECT_THROW(ShareOf(Counting({6, 2}), {.dim = 0, .fused = 3, .size = 4}, 0),
               UsageError);
  EXPECT_THROW(ShareOf(Counting({4}), {.dim = 1, .size = 2}, 0), UsageError);
  EXPECT_THROW(ShareOf(Counting({4}), {.dim = 0, .size = 2}, 2), UsageError);
  EXPECT_THROW(JoinShares({Counting({2}), Counting({3})}, {.size = 2}),
               UsageError);
  EXPECT_THROW(JoinShares({Counting({2})}, {.size = 2}), UsageError);
}

}  // namespace
}  // namespace accel
