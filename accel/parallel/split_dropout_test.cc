// accel::SplitDropout against torch::dropout of the whole tensor: each
// share's mask is its part of one process's, nested shares too, the
// generator ends where one process's does, and bad shares are UsageErrors.
#include "accel/parallel/split_dropout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

using ::testing::HasSubstr;

constexpr double kP = 0.3;

// A whole [2, 4, 6, 3] tensor and what torch::dropout makes of it after
// manual_seed(seed), then the generator's next draw.
struct Whole {
  torch::Tensor x, dropped, next;
};

Whole DropWhole(uint64_t seed) {
  Whole whole;
  whole.x =
      torch::arange(2 * 4 * 6 * 3, torch::kFloat32).view({2, 4, 6, 3}) + 1;
  torch::manual_seed(seed);
  whole.dropped = torch::dropout(whole.x, kP, /*train=*/true);
  whole.next = torch::rand({4});
  return whole;
}

TEST(SplitDropoutTest, EachShareDropsItsPartOfTheWhole) {
  const Whole whole = DropWhole(7);
  // Not vacuous: some dropped, some kept and scaled.
  EXPECT_GT(whole.dropped.eq(0).sum().item<int64_t>(), 0);
  EXPECT_GT(whole.dropped.ne(0).sum().item<int64_t>(), 0);
  for (int64_t dim : {0, 1, 2}) {
    const int64_t count = whole.x.size(dim) / (dim == 2 ? 3 : 2);
    std::vector<torch::Tensor> parts;
    for (int64_t index = 0; index < count; ++index) {
      const int64_t part = whole.x.size(dim) / count;
      torch::manual_seed(7);
      parts.push_back(SplitDropout(whole.x.narrow(dim, index * part, part), kP,
                                   true, {{dim, index, count}}));
      // The generator advanced as one process's did.
      EXPECT_TRUE(torch::rand({4}).equal(whole.next)) << "dim " << dim;
    }
    EXPECT_TRUE(torch::cat(parts, dim).equal(whole.dropped)) << "dim " << dim;
  }
}

TEST(SplitDropoutTest, NestedSharesAndSharesOfTwoDims) {
  const Whole whole = DropWhole(11);
  // The sequence (dim 2, 6) over 3, each third over 2; the heads (dim 1)
  // over 2.
  for (int64_t outer = 0; outer < 3; ++outer) {
    for (int64_t inner = 0; inner < 2; ++inner) {
      for (int64_t head = 0; head < 2; ++head) {
        const torch::Tensor x =
            whole.x.narrow(2, 2 * outer + inner, 1).narrow(1, 2 * head, 2);
        torch::manual_seed(11);
        const torch::Tensor got = SplitDropout(
            x, kP, true, {{2, outer, 3}, {2, inner, 2}, {1, head, 2}});
        EXPECT_TRUE(got.equal(whole.dropped.narrow(2, 2 * outer + inner, 1)
                                  .narrow(1, 2 * head, 2)));
      }
    }
  }
}

TEST(SplitDropoutTest, WithoutSharesItIsDropoutAndGradientsFlow) {
  const Whole whole = DropWhole(3);
  torch::manual_seed(3);
  torch::Tensor x = whole.x.clone().requires_grad_();
  const torch::Tensor y = SplitDropout(x, kP, true, {});
  EXPECT_TRUE(y.equal(whole.dropped));
  y.sum().backward();
  // The gradient is the mask, scaled: 1 / (1 - p) where kept.
  EXPECT_TRUE(
      x.grad().equal(whole.dropped.ne(0).to(torch::kFloat32) / (1 - kP)));
  // Evaluation, p = 0 and p = 1 draw nothing (as torch::dropout).
  torch::manual_seed(3);
  const torch::Tensor first = torch::rand({4});
  torch::manual_seed(3);
  EXPECT_TRUE(SplitDropout(whole.x, kP, false, {{1, 0, 2}}).equal(whole.x));
  EXPECT_TRUE(SplitDropout(whole.x, 0, true, {{1, 0, 2}}).equal(whole.x));
  EXPECT_TRUE(SplitDropout(whole.x, 1, true, {{1, 0, 2}})
                  .equal(torch::zeros_like(whole.x)));
  EXPECT_TRUE(torch::rand({4}).equal(first));
}

std::string ErrorOf(double p, const DropoutShare& share) {
  try {
    SplitDropout(torch::ones({2, 3}), p, true, {share});
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

TEST(SplitDropoutTest, BadSharesAreUsageErrors) {
  EXPECT_THAT(ErrorOf(1.5, {0, 0, 2}), HasSubstr("a probability of 1.5;"));
  // Shown as given, not rounded into range.
  EXPECT_THAT(ErrorOf(1 + 1e-9, {0, 0, 2}),
              HasSubstr("a probability of 1.000000001"));
  EXPECT_THAT(ErrorOf(std::nan(""), {0, 0, 2}),
              HasSubstr("a probability of nan"));
  EXPECT_THAT(ErrorOf(0.1, {2, 0, 2}),
              HasSubstr("of a tensor of shape [2, 3], which has no such "
                        "dimension (dims run from -2 to 1)"));
  EXPECT_THAT(ErrorOf(0.1, {-3, 0, 2}), HasSubstr("no such dimension"));
  EXPECT_THAT(ErrorOf(0.1, {1, 2, 2}),
              HasSubstr("{dim 1, index 2, count 2}: the index must lie"));
  EXPECT_THAT(ErrorOf(0.1, {1, 0, 0}),
              HasSubstr("the count of shares must be at least 1"));
  try {
    SplitDropout(torch::ones({2, 3}), 0.1, true,
                 {{0, 0, int64_t{1} << 32}, {1, 0, int64_t{1} << 32}});
    ADD_FAILURE() << "counts past 2^63 were accepted";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("too large to draw"));
  }
}

TEST(SplitDropoutTest, NegativeDimsCountFromTheEnd) {
  const Whole whole = DropWhole(5);
  torch::manual_seed(5);
  const torch::Tensor last =
      SplitDropout(whole.x.narrow(3, 1, 1), kP, true, {{-1, 1, 3}});
  EXPECT_TRUE(last.equal(whole.dropped.narrow(3, 1, 1)));
}

}  // namespace
}  // namespace accel
