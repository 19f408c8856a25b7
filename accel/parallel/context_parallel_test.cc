// Ulysses' all-to-alls against one process's attention: causal attention
// over a sequence split across 1, 2 and 4 ranks gives the one-process
// output and the gradients of q, k and v (each rank's part); the two
// exchanges are inverse; dimensions that do not split are UsageErrors.
#include "accel/parallel/context_parallel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "accel/runtime/base/errors.h"
#include "tests/thread_ranks.h"

namespace accel::cp {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kBatch = 2, kLength = 8, kHeads = 4, kHead = 3;

// Own generators: the ranks are threads.
torch::Tensor Random(int seed) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn({kBatch, kLength, kHeads, kHead}, generator,
                      torch::kFloat64);
}

// Causal attention of [B, T, H, D] inputs, over the whole T.
torch::Tensor Attention(const torch::Tensor& q, const torch::Tensor& k,
                        const torch::Tensor& v) {
  const int64_t length = q.size(1);
  const torch::Tensor mask =
      torch::ones({length, length}, torch::kBool).tril().logical_not();
  torch::Tensor scores =
      torch::matmul(q.transpose(1, 2), k.transpose(1, 2).transpose(-2, -1)) /
      std::sqrt(double(kHead));
  scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
  return torch::matmul(torch::softmax(scores, -1), v.transpose(1, 2))
      .transpose(1, 2);
}

void ExpectClose(const torch::Tensor& got, const torch::Tensor& want,
                 const char* what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(torch::allclose(got, want, 1e-12, 1e-12))
      << what << ": max |difference| "
      << (got - want).abs().max().item<double>();
}

void RunAttention(Communicator& cp) {
  // One process: output and the gradients of sum(y * w).
  torch::Tensor q = Random(1).requires_grad_(), k = Random(2).requires_grad_(),
                v = Random(3).requires_grad_();
  const torch::Tensor w = Random(4);
  const torch::Tensor y = Attention(q, k, v);
  (y * w).sum().backward();
  // This rank's part of the sequence.
  const auto part = [&](const torch::Tensor& t) {
    return ShardSequence(t.detach(), cp, 1);
  };
  torch::Tensor ql = part(q).requires_grad_(), kl = part(k).requires_grad_(),
                vl = part(v).requires_grad_();
  const auto heads = [&](const torch::Tensor& t) {
    return SequenceToHeads(t, cp, 1, 2);
  };
  const torch::Tensor yl =
      HeadsToSequence(Attention(heads(ql), heads(kl), heads(vl)), cp, 1, 2);
  (yl * part(w)).sum().backward();
  ExpectClose(yl.detach(), part(y), "output");
  ExpectClose(ql.grad(), part(q.grad()), "q gradient");
  ExpectClose(kl.grad(), part(k.grad()), "k gradient");
  ExpectClose(vl.grad(), part(v.grad()), "v gradient");
}

TEST(ContextParallelTest, UlyssesAttentionMatchesOneProcess) {
  for (int size : {1, 2, 4}) {
    testing::RunRanks("gloo", size, RunAttention);
  }
}

TEST(ContextParallelTest, TheExchangesAreInverse) {
  testing::RunRanks("gloo", 2, [](Communicator& cp) {
    const torch::Tensor x = ShardSequence(Random(7), cp, 1);  // [2, 4, 4, 3]
    const torch::Tensor heads = SequenceToHeads(x, cp, 1, 2);
    EXPECT_EQ(heads.sizes(), (std::vector<int64_t>{2, 8, 2, 3}));
    // Rank r holds heads [2r, 2r + 2) of every position.
    EXPECT_TRUE(heads.equal(Random(7).narrow(2, 2 * cp.rank(), 2)));
    EXPECT_TRUE(HeadsToSequence(heads, cp, 1, 2).equal(x));
  });
}

TEST(ContextParallelTest, DimensionsThatDoNotSplitAreUsageErrors) {
  testing::RunRanks("gloo", 2, [](Communicator& cp) {
    const torch::Tensor three_heads = torch::zeros({1, 4, 3, 2});
    try {
      SequenceToHeads(three_heads, cp, 1, 2);
      ADD_FAILURE() << "no error";
    } catch (const UsageError& error) {
      EXPECT_THAT(error.what(), HasSubstr("does not split evenly over the 2"));
    }
    EXPECT_THROW(ShardSequence(torch::zeros({1, 5}), cp, 1), UsageError);
    EXPECT_THROW(SequenceToHeads(torch::zeros({1, 4, 4}), cp, 1, 1),
                 UsageError);
  });
}

}  // namespace
}  // namespace accel::cp
