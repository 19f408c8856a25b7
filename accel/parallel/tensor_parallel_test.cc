// Tensor parallelism's conjugate collectives against one process's math: a
// Megatron MLP (column-parallel, then row-parallel) at 2 and 4 ranks, with
// and without sequence parallelism, gives the single-process output, input
// gradient and (sliced) weight gradients; the gather / scatter pair keeps
// gradients whole; a dimension that does not split is a UsageError.
#include "accel/parallel/tensor_parallel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "accel/runtime/base/errors.h"
#include "tests/thread_ranks.h"

namespace accel::tp {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kWidth = 8, kHidden = 16, kBatch = 3, kLength = 4;

struct Mlp {
  torch::Tensor w1, b1, w2, b2;
};

// Generators of their own: the ranks are threads, and torch's default
// generator is shared by them.
torch::Tensor Random(at::IntArrayRef sizes, at::Generator& generator) {
  return torch::randn(sizes, generator, torch::kFloat64);
}

Mlp MakeMlp() {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(5);
  return {Random({kHidden, kWidth}, generator), Random({kHidden}, generator),
          Random({kWidth, kHidden}, generator), Random({kWidth}, generator)};
}

torch::Tensor Input() {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(6);
  return Random({kBatch, kLength, kWidth}, generator);
}

torch::Tensor Forward(const torch::Tensor& x, const Mlp& m) {
  namespace F = torch::nn::functional;
  return F::linear(torch::gelu(F::linear(x, m.w1, m.b1)), m.w2, m.b2);
}

// What one process computes: output, and the gradients of sum(y * y).
struct Reference {
  torch::Tensor y, dx, dw1, db1, dw2, db2;
};

Reference Compute() {
  Mlp m = MakeMlp();
  for (torch::Tensor* t : {&m.w1, &m.b1, &m.w2, &m.b2}) t->requires_grad_();
  torch::Tensor x = Input().requires_grad_();
  const torch::Tensor y = Forward(x, m);
  (y * y).sum().backward();
  return {y.detach(),  x.grad(),    m.w1.grad(),
          m.b1.grad(), m.w2.grad(), m.b2.grad()};
}

void ExpectClose(const torch::Tensor& got, const torch::Tensor& want,
                 const char* what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(torch::allclose(got, want, 1e-12, 1e-12))
      << what << ": max |difference| "
      << (got - want).abs().max().item<double>();
}

// This rank's rows of w1 and b1 (column-parallel), its columns of w2
// (row-parallel); b2 whole, added after the reduction.
Mlp Shard(const Mlp& m, int rank, int size) {
  const int64_t part = kHidden / size;
  return {m.w1.narrow(0, part * rank, part).clone(),
          m.b1.narrow(0, part * rank, part).clone(),
          m.w2.narrow(1, part * rank, part).clone(), m.b2.clone()};
}

void RunMlp(Communicator& tp, bool sequence_parallel) {
  namespace F = torch::nn::functional;
  const Reference want = Compute();
  Mlp m = Shard(MakeMlp(), tp.rank(), tp.size());
  for (torch::Tensor* t : {&m.w1, &m.b1, &m.w2, &m.b2}) t->requires_grad_();
  const int64_t piece = kLength / tp.size();
  torch::Tensor x = Input();
  if (sequence_parallel) x = x.narrow(1, piece * tp.rank(), piece).clone();
  x.requires_grad_();
  const torch::Tensor whole =
      sequence_parallel ? GatherSequence(x, tp, 1) : CopyToRegion(x, tp);
  const torch::Tensor partial =
      F::linear(torch::gelu(F::linear(whole, m.w1, m.b1)), m.w2);
  torch::Tensor y = sequence_parallel ? ReduceScatterSequence(partial, tp, 1)
                                      : ReduceFromRegion(partial, tp);
  y = y + m.b2;
  (y * y).sum().backward();
  const auto mine = [&](const torch::Tensor& t) {
    return sequence_parallel ? t.narrow(1, piece * tp.rank(), piece) : t;
  };
  ExpectClose(y.detach(), mine(want.y), "output");
  ExpectClose(x.grad(), mine(want.dx), "input gradient");
  const Mlp grads =
      Shard({want.dw1, want.db1, want.dw2, want.db2}, tp.rank(), tp.size());
  ExpectClose(m.w1.grad(), grads.w1, "w1 gradient");
  ExpectClose(m.b1.grad(), grads.b1, "b1 gradient");
  ExpectClose(m.w2.grad(), grads.w2, "w2 gradient");
  // Under sequence parallelism each rank's b2 gradient is its part of the
  // sequence's; their sum is the whole.
  torch::Tensor db2 = m.b2.grad().clone();
  if (sequence_parallel) {
    tp.allreduce(db2.data_ptr(), db2.numel(), DType::kFloat64, ReduceOp::kSum);
  }
  ExpectClose(db2, want.db2, "b2 gradient");
}

TEST(TensorParallelTest, MegatronMlpMatchesOneProcess) {
  for (int size : {1, 2, 4}) {
    testing::RunRanks("gloo", size,
                      [](Communicator& tp) { RunMlp(tp, false); });
  }
}

TEST(TensorParallelTest, SequenceParallelMlpMatchesOneProcess) {
  for (int size : {2, 4}) {
    testing::RunRanks("gloo", size, [](Communicator& tp) { RunMlp(tp, true); });
  }
}

// A failed collective names the function the model called and its
// direction, with each rank's call.
TEST(TensorParallelTest, ACollectivesErrorNamesTheFunction) {
  testing::RunRanks("gloo", 2, [](Communicator& tp) {
    // Rank 1's activations are one row longer.
    const torch::Tensor x = torch::ones({2 + tp.rank(), 3});
    try {
      ReduceFromRegion(x, tp);
      ADD_FAILURE() << "different shapes did not fail";
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr("ranks called different collectives"));
      EXPECT_THAT(e.what(), HasSubstr("tp::ReduceFromRegion forward #1"));
      EXPECT_THAT(e.what(), HasSubstr("[allreduce sum float32 x 6]"));
      EXPECT_THAT(e.what(), HasSubstr("[allreduce sum float32 x 9]"));
    }
  });
}

TEST(TensorParallelTest, GatherAndScatterAreConjugate) {
  testing::RunRanks("gloo", 2, [](Communicator& tp) {
    torch::Tensor x =
        torch::arange(6, torch::kFloat32).view({2, 3}).add(10 * tp.rank());
    x.requires_grad_();
    const torch::Tensor all = GatherFromRegion(x, tp, 0);
    EXPECT_TRUE(all.equal(torch::cat({torch::arange(6).view({2, 3}),
                                      torch::arange(6).view({2, 3}) + 10})
                              .to(torch::kFloat32)));
    (all * torch::arange(12, torch::kFloat32).view({4, 3})).sum().backward();
    EXPECT_TRUE(x.grad().equal(torch::arange(12, torch::kFloat32)
                                   .view({4, 3})
                                   .narrow(0, 2 * tp.rank(), 2)));
    torch::Tensor whole = torch::arange(8, torch::kFloat32).requires_grad_();
    const torch::Tensor mine = ScatterToRegion(whole, tp);
    EXPECT_TRUE(mine.equal(
        torch::arange(4 * tp.rank(), 4 * tp.rank() + 4).to(torch::kFloat32)));
    mine.sum().backward();
    EXPECT_TRUE(whole.grad().equal(torch::ones({8})));
  });
}

// Logits split along a vocabulary of 12: the loss and each rank's columns
// of the gradient are those of the whole logits' cross entropy.
TEST(TensorParallelTest, VocabParallelCrossEntropyIsTheWholeOnes) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(7);
  const torch::Tensor whole = Random({5, 12}, generator) * 4;
  const torch::Tensor targets = torch::tensor({0, 11, 5, 6, 3});
  torch::Tensor reference = whole.clone().requires_grad_();
  const torch::Tensor want =
      torch::nn::functional::cross_entropy(reference, targets);
  want.backward();
  for (int size : {1, 2, 3, 4}) {
    testing::RunRanks("gloo", size, [&](Communicator& tp) {
      const int64_t columns = 12 / tp.size();
      torch::Tensor mine = whole.narrow(1, columns * tp.rank(), columns)
                               .clone()
                               .requires_grad_();
      const torch::Tensor loss = VocabParallelCrossEntropy(mine, targets, tp);
      ExpectClose(loss.detach(), want.detach(), "loss");
      (loss * 3).backward();
      ExpectClose(mine.grad(),
                  reference.grad().narrow(1, columns * tp.rank(), columns) * 3,
                  "logits gradient");
      try {
        VocabParallelCrossEntropy(mine, torch::tensor({0, 12, 1, 1, 1}), tp);
        ADD_FAILURE() << "a target past the vocabulary was taken";
      } catch (const UsageError& e) {
        EXPECT_THAT(e.what(), HasSubstr("outside the vocabulary [0, 12)"));
      }
    });
  }
}

TEST(TensorParallelTest, VocabParallelEmbeddingIsTheWholeTables) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(8);
  const torch::Tensor table = Random({8, 3}, generator);
  const torch::Tensor tokens = torch::tensor({{0, 7, 3}, {4, 4, 1}});
  torch::Tensor reference = table.clone().requires_grad_();
  const torch::Tensor want = torch::embedding(reference, tokens);
  (want * want).sum().backward();
  testing::RunRanks("gloo", 4, [&](Communicator& tp) {
    torch::Tensor rows = table.narrow(0, 2 * tp.rank(), 2).clone();
    rows.requires_grad_();
    const torch::Tensor got = VocabParallelEmbedding(tokens, rows, tp);
    ExpectClose(got.detach(), want.detach(), "embedding");
    (got * got).sum().backward();
    ExpectClose(rows.grad(), reference.grad().narrow(0, 2 * tp.rank(), 2),
                "rows' gradient");
  });
}

TEST(TensorParallelTest, ADimensionThatDoesNotSplitIsAUsageError) {
  testing::RunRanks("gloo", 2, [](Communicator& tp) {
    try {
      ScatterToRegion(torch::ones({3, 5}), tp);
      ADD_FAILURE() << "no error";
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr("dimension 1 of a tensor of shape "
                                      "[3, 5] does not split evenly over "
                                      "the 2 ranks"));
    }
  });
}

}  // namespace
}  // namespace accel::tp
