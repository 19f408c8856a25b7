// accel::ParallelLinear and parallelize_module against one process: a block
// of a fused q|k|v attention and an MLP, split by a plan at 2 and 4 ranks
// (ranks as threads), gives the one-process output and input gradient, and
// each rank's parameters and gradients are its share of the whole ones';
// with sequence parallelism too; the plan's mistakes are UsageErrors that
// leave the model whole.
#include "accel/parallel/parallel_linear.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "tests/thread_ranks.h"

namespace accel {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kWidth = 8, kHeads = 4, kBatch = 2, kLength = 4;

// Attention over heads of kWidth / kHeads features, written for any number
// of local heads (the q|k|v projection's width says how many), and an MLP.
struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    qkv = register_module("qkv", ParallelLinear(kWidth, 3 * kWidth));
    proj = register_module("proj", ParallelLinear(kWidth, kWidth));
    fc = register_module("fc", ParallelLinear(kWidth, 4 * kWidth));
    fc_proj = register_module("fc_proj", ParallelLinear(4 * kWidth, kWidth));
    norm = register_module("norm", torch::nn::Linear(kWidth, kWidth));
  }
  torch::Tensor forward(torch::Tensor x) {
    const int64_t head = kWidth / kHeads;
    const torch::Tensor all = qkv(x);
    const int64_t local = all.size(-1) / 3;
    // Under sequence parallelism q|k|v hold the whole sequence, x a part.
    auto heads = [&](const torch::Tensor& t) {
      return t.view({all.size(0), all.size(1), local / head, head})
          .transpose(1, 2);
    };
    const auto parts = all.split(local, -1);
    const torch::Tensor weights = torch::softmax(
        torch::matmul(heads(parts[0]), heads(parts[1]).transpose(-2, -1)) /
            std::sqrt(double(head)),
        -1);
    const torch::Tensor y = torch::matmul(weights, heads(parts[2]))
                                .transpose(1, 2)
                                .reshape({all.size(0), all.size(1), local});
    x = x + proj(y);
    return x + fc_proj(torch::gelu(fc(x)));
  }
  ParallelLinear qkv{nullptr}, proj{nullptr}, fc{nullptr}, fc_proj{nullptr};
  torch::nn::Linear norm{nullptr};  // Not split: a plain Linear.
};
TORCH_MODULE(Block);

Block MakeBlock() {
  // The default generator is shared by the ranks' threads: one at a time.
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(3);
  Block block;
  block->to(torch::kFloat64);
  return block;
}

torch::Tensor Input() {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(4);
  return torch::randn({kBatch, kLength, kWidth}, generator, torch::kFloat64);
}

std::vector<std::pair<std::string, ParallelStyle>> Plan(bool sequence) {
  return {{"qkv", ColwiseParallel{.fused = 3, .sequence_parallel = sequence}},
          {"proj", RowwiseParallel{.sequence_parallel = sequence}},
          {"fc", ColwiseParallel{.sequence_parallel = sequence}},
          {"fc_proj", RowwiseParallel{.sequence_parallel = sequence}}};
}

void ExpectClose(const torch::Tensor& got, const torch::Tensor& want,
                 const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(torch::allclose(got, want, 1e-10, 1e-12))
      << what << ": max |difference| "
      << (got - want).abs().max().item<double>();
}

// Rows of each of `fused` blocks of dim 0, or columns (dim 1).
torch::Tensor Share(const torch::Tensor& t, int64_t dim, int64_t fused,
                    int rank, int size) {
  const int64_t block = t.size(dim) / fused, part = block / size;
  std::vector<torch::Tensor> pieces;
  for (int64_t b = 0; b < fused; ++b) {
    pieces.push_back(t.narrow(dim, b * block + rank * part, part));
  }
  return torch::cat(pieces, dim);
}

void Compare(Communicator& tp, bool sequence) {
  Block whole = MakeBlock();
  torch::Tensor x_whole = Input().requires_grad_();
  const torch::Tensor want = whole->forward(x_whole);
  (want * want).sum().backward();

  Block block = MakeBlock();
  EXPECT_EQ(parallelize_module(*block, tp, Plan(sequence)), 4);
  const int rank = tp.rank(), size = tp.size();
  const int64_t piece = kLength / size;
  torch::Tensor x = Input();
  if (sequence) x = x.narrow(1, rank * piece, piece).clone();
  x.requires_grad_();
  const torch::Tensor got = block->forward(x);
  (got * got).sum().backward();
  const auto mine = [&](const torch::Tensor& t) {
    return sequence ? t.narrow(1, rank * piece, piece) : t;
  };
  ExpectClose(got.detach(), mine(want.detach()), "output");
  ExpectClose(x.grad(), mine(x_whole.grad()), "input gradient");
  struct Expected {
    ParallelLinear split, reference;
    int64_t dim, fused;
  };
  for (const Expected& layer :
       std::vector<Expected>{{block->qkv, whole->qkv, 0, 3},
                             {block->proj, whole->proj, 1, 1},
                             {block->fc, whole->fc, 0, 1},
                             {block->fc_proj, whole->fc_proj, 1, 1}}) {
    ExpectClose(
        layer.split->weight,
        Share(layer.reference->weight, layer.dim, layer.fused, rank, size),
        "weight");
    ExpectClose(layer.split->weight.grad(),
                Share(layer.reference->weight.grad(), layer.dim, layer.fused,
                      rank, size),
                "weight gradient");
    if (layer.dim == 0) {
      ExpectClose(
          layer.split->bias.grad(),
          Share(layer.reference->bias.grad(), 0, layer.fused, rank, size),
          "bias gradient");
    } else {
      // A row-parallel bias is whole, and so is its gradient (under
      // sequence parallelism summed over the ranks' parts of the sequence).
      ExpectClose(layer.split->bias.grad(), layer.reference->bias.grad(),
                  "row bias gradient");
    }
  }
  const std::vector<const void*> split = TensorParallelParameters(*block);
  // 4 weights, 2 column biases; nothing is split over one rank.
  EXPECT_EQ(split.size(), size > 1 ? 6u : 0u);
}

TEST(ParallelLinearTest, APlanSplitsABlockAsOneProcessComputesIt) {
  for (int size : {1, 2, 4}) {
    testing::RunRanks("gloo", size,
                      [](Communicator& tp) { Compare(tp, false); });
  }
}

TEST(ParallelLinearTest, SequenceParallelToo) {
  for (int size : {2, 4}) {
    testing::RunRanks("gloo", size,
                      [](Communicator& tp) { Compare(tp, true); });
  }
}

TEST(ParallelLinearTest, UntilSplitItIsALinear) {
  torch::manual_seed(9);
  torch::nn::Linear linear(5, 3);
  torch::manual_seed(9);
  ParallelLinear parallel(5, 3);
  EXPECT_TRUE(parallel->weight.equal(linear->weight));
  EXPECT_TRUE(parallel->bias.equal(linear->bias));
  const torch::Tensor x = torch::randn({2, 5});
  EXPECT_TRUE(parallel(x).equal(linear(x)));
  EXPECT_EQ(parallel->named_parameters().keys(),
            (std::vector<std::string>{"weight", "bias"}));
}

std::string ErrorOf(
    Communicator& tp,
    const std::vector<std::pair<std::string, ParallelStyle>>& plan,
    Block& block) {
  try {
    parallelize_module(*block, tp, plan);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ParallelLinearTest, APlansMistakesAreUsageErrorsThatChangeNothing) {
  testing::RunRanks("gloo", 3, [](Communicator& tp) {
    Block block = MakeBlock();
    EXPECT_THAT(ErrorOf(tp, {{"norm", ColwiseParallel{}}}, block),
                HasSubstr("not an accel::ParallelLinear"));
    EXPECT_THAT(ErrorOf(tp, {{"blocks.*.fc", ColwiseParallel{}}}, block),
                HasSubstr("'blocks.*.fc' matches no module"));
    EXPECT_THAT(
        ErrorOf(tp, {{"qkv", ColwiseParallel{}}, {"q*", RowwiseParallel{}}},
                block),
        HasSubstr("'qkv' is matched by both 'qkv' and 'q*'"));
    EXPECT_THAT(ErrorOf(tp, {{"fc", ColwiseParallel{}}}, block),
                HasSubstr("a column-parallel layer's out_features (32) does "
                          "not split evenly over 3 tensor-parallel ranks"));
    // 8 input features over 3 ranks; qkv before it would split (24 rows),
    // and stays whole.
    EXPECT_THAT(
        ErrorOf(tp, {{"qkv", ColwiseParallel{}}, {"proj", RowwiseParallel{}}},
                block),
        HasSubstr("a row-parallel layer's in_features (8) does not "
                  "split evenly over 3 tensor-parallel ranks"));
    EXPECT_EQ(block->qkv->weight.size(0), 3 * kWidth);
  });
}

}  // namespace
}  // namespace accel
