// Accelerate's collective semantics on tensors, with every rank a process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "accel/runtime/base/errors.h"
#include "tests/multiprocess_main.h"
#include "tests/usage_error.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

Accelerator& A() { return SharedAccelerator(); }
int N() { return A().num_processes(); }
int R() { return A().process_index(); }

TEST(AcceleratorTest, ProcessProperties) {
  EXPECT_EQ(N(), std::atoi(std::getenv("WORLD_SIZE")));
  EXPECT_EQ(R(), std::atoi(std::getenv("RANK")));
  EXPECT_EQ(A().is_main_process(), R() == 0);
  EXPECT_EQ(A().local_process_index(), R());
  EXPECT_EQ(A().is_local_main_process(), R() == 0);
  EXPECT_EQ(A().device(), torch::Device(torch::kCPU));
  EXPECT_EQ(A().backend(), "gloo");
}

TEST(AcceleratorTest, GatherConcatenatesAlongDimZeroInRankOrder) {
  torch::Tensor mine = torch::arange(3) + 10 * R();
  torch::Tensor all = A().gather(mine);
  ASSERT_EQ(all.sizes(), torch::IntArrayRef({3 * N()}));
  for (int r = 0; r < N(); ++r) {
    EXPECT_TRUE(
        torch::equal(all.narrow(0, 3 * r, 3), torch::arange(3) + 10 * r))
        << "block of rank " << r;
  }
}

TEST(AcceleratorTest, GatherOfTensorsTooLargeToTravelWithTheShapeCheck) {
  // Small tensors ride along with the shape check; this one needs a second
  // collective.
  torch::Tensor mine =
      torch::arange(1500, torch::kFloat64).reshape({500, 3}) + 1e6 * R();
  torch::Tensor all = A().gather(mine);
  ASSERT_EQ(all.sizes(), torch::IntArrayRef({500 * N(), 3}));
  for (int r = 0; r < N(); ++r) {
    EXPECT_TRUE(torch::equal(
        all.narrow(0, 500 * r, 500),
        torch::arange(1500, torch::kFloat64).reshape({500, 3}) + 1e6 * r));
  }
}

TEST(AcceleratorTest, GatherOfScalarsGivesOnePerRank) {
  torch::Tensor all = A().gather(torch::scalar_tensor(R(), torch::kFloat64));
  ASSERT_EQ(all.sizes(), torch::IntArrayRef({N()}));
  EXPECT_EQ(all.scalar_type(), torch::kFloat64);
  EXPECT_TRUE(torch::equal(all, torch::arange(N(), torch::kFloat64)));
}

TEST(AcceleratorTest, GatherKeepsEveryDtypeAndHandlesNonContiguousInput) {
  for (auto type : {torch::kFloat32, torch::kFloat64, torch::kFloat16,
                    torch::kBFloat16, torch::kInt8, torch::kUInt8,
                    torch::kInt32, torch::kInt64, torch::kBool}) {
    // [2, 3] transposed to a non-contiguous [3, 2].
    torch::Tensor base = (torch::arange(6).reshape({2, 3}) + R()) % 2 == 0;
    if (type != torch::kBool) {
      base = (torch::arange(6).reshape({2, 3}) + 7 * R()).to(type);
    }
    torch::Tensor mine = base.t();
    ASSERT_FALSE(mine.is_contiguous());
    torch::Tensor all = A().gather(mine);
    EXPECT_EQ(all.scalar_type(), type);
    ASSERT_EQ(all.sizes(), torch::IntArrayRef({3 * N(), 2}));
    EXPECT_TRUE(torch::equal(all.narrow(0, 3 * R(), 3), mine))
        << c10::toString(type);
  }
}

TEST(AcceleratorTest, GatherOfEmptyTensors) {
  torch::Tensor all = A().gather(torch::zeros({0, 4}));
  EXPECT_EQ(all.sizes(), torch::IntArrayRef({0, 4}));
}

TEST(AcceleratorTest, GatherOfVectorsAndMaps) {
  auto vector = A().gather(
      std::vector<torch::Tensor>{torch::full({1}, R()), torch::full({2}, 2.5)});
  ASSERT_EQ(vector.size(), 2u);
  EXPECT_EQ(vector[0].size(0), N());
  EXPECT_EQ(vector[1].size(0), 2 * N());
  auto map = A().gather(std::map<std::string, torch::Tensor>{
      {"labels", torch::full({2}, R(), torch::kLong)},
      {"loss", torch::tensor(1.5)}});
  EXPECT_EQ(map["labels"].size(0), 2 * N());
  EXPECT_EQ(map["loss"].size(0), N());
  EXPECT_EQ(map["labels"][2 * N() - 1].item<int64_t>(), N() - 1);
}

TEST(AcceleratorTest, GatherWithShapesThatDifferFailsOnEveryRankNamingEach) {
  if (N() == 1) GTEST_SKIP() << "needs several ranks";
  const std::string message =
      UsageErrorOf([] { A().gather(torch::zeros({R() + 1}, torch::kLong)); });
  // Like every collective error: the call, its number and its call site.
  EXPECT_THAT(message, ::testing::ContainsRegex(
                           "rank [0-9]+/[0-9]+: gather #[0-9]+ "
                           "\\(accelerator_test.cc:[0-9]+\\): tensors differ "
                           "across ranks"));
  for (int r = 0; r < N(); ++r) {
    EXPECT_THAT(message, HasSubstr("rank " + std::to_string(r) + ": shape [" +
                                   std::to_string(r + 1) + "] int64"));
  }
  EXPECT_THAT(message, HasSubstr("pad_across_processes"));
  const std::string dtype_message = UsageErrorOf([] {
    A().gather(torch::zeros({2}, R() == 0 ? torch::kFloat32 : torch::kFloat64));
  });
  EXPECT_THAT(dtype_message, HasSubstr("rank 0: shape [2] float32"));
  EXPECT_THAT(dtype_message, HasSubstr("rank 1: shape [2] float64"));
  // The error is consistent everywhere, so the group is still usable.
  EXPECT_EQ(A().gather(torch::ones({1})).size(0), N());
}

TEST(AcceleratorTest, ReduceSumMeanMaxMinLeaveTheInputAlone) {
  torch::Tensor mine = torch::tensor({1.0f, 2.0f}) * (R() + 1);
  const torch::Tensor before = mine.clone();
  const double ranks_sum = N() * (N() + 1) / 2.0;
  EXPECT_TRUE(torch::allclose(A().reduce(mine),
                              torch::tensor({1.0f, 2.0f}) * ranks_sum));
  EXPECT_TRUE(torch::allclose(A().reduce(mine, "mean"),
                              torch::tensor({1.0f, 2.0f}) * ranks_sum / N()));
  EXPECT_TRUE(
      torch::equal(A().reduce(mine, "max"), torch::tensor({1.0f, 2.0f}) * N()));
  EXPECT_TRUE(
      torch::equal(A().reduce(mine, "min"), torch::tensor({1.0f, 2.0f})));
  EXPECT_TRUE(torch::equal(mine, before));
  EXPECT_EQ(A().reduce(torch::tensor(int64_t{R()})).item<int64_t>(),
            N() * (N() - 1) / 2);
  auto map = A().reduce(std::map<std::string, torch::Tensor>{
      {"a", torch::ones({3})}, {"b", torch::full({1}, 2.0)}});
  EXPECT_EQ(map["b"].item<double>(), 2.0 * N());
}

TEST(AcceleratorTest, ReduceRejectsWhatItCannotDo) {
  EXPECT_THAT(UsageErrorOf([] { A().reduce(torch::ones({2}), "median"); }),
              HasSubstr("unknown reduction 'median'"));
  EXPECT_THAT(
      UsageErrorOf([] { A().reduce(torch::ones({2}, torch::kLong), "mean"); }),
      HasSubstr("\"mean\" needs a floating-point tensor"));
  EXPECT_THAT(
      UsageErrorOf([] { A().reduce(torch::ones({2}, torch::kBool), "sum"); }),
      HasSubstr("not defined for bool"));
  EXPECT_THAT(
      UsageErrorOf([] { A().gather(torch::ones({2}, torch::kComplexFloat)); }),
      HasSubstr("dtype ComplexFloat are not supported"));
}

TEST(AcceleratorTest, BroadcastSendsOneRanksValuesToAll) {
  const int sender = N() - 1;
  torch::Tensor mine = torch::full({2, 2}, R(), torch::kInt32);
  torch::Tensor result = A().broadcast(mine, sender);
  EXPECT_TRUE(torch::equal(result, torch::full({2, 2}, sender, torch::kInt32)));
  EXPECT_EQ(mine[0][0].item<int>(), R());
  EXPECT_THAT(UsageErrorOf([] { A().broadcast(torch::ones({1}), N()); }),
              HasSubstr("from_process must be in [0, " + std::to_string(N())));
  if (N() > 1) {
    EXPECT_THAT(UsageErrorOf([] { A().broadcast(torch::ones({R() + 1}), 0); }),
                ::testing::ContainsRegex("broadcast #[0-9]+ "
                                         "\\(accelerator_test.cc:[0-9]+\\): "
                                         "tensors differ across ranks"));
  }
}

TEST(AcceleratorTest, PadAcrossProcessesPadsToTheLongest) {
  torch::Tensor mine = torch::ones({R() + 1, 2}, torch::kLong);
  torch::Tensor padded = A().pad_across_processes(mine, 0, -1);
  ASSERT_EQ(padded.sizes(), torch::IntArrayRef({N(), 2}));
  EXPECT_EQ(padded[0][0].item<int64_t>(), 1);
  EXPECT_EQ(padded[N() - 1][1].item<int64_t>(), R() == N() - 1 ? 1 : -1);

  torch::Tensor first =
      A().pad_across_processes(mine, 0, -1, /*pad_first=*/true);
  EXPECT_EQ(first[N() - 1][0].item<int64_t>(), 1);
  EXPECT_EQ(first[0][0].item<int64_t>(), R() == N() - 1 ? 1 : -1);

  // Negative dims count from the end; a dim beyond the rank is a no-op.
  torch::Tensor columns = torch::zeros({2, R() + 1}, torch::kBool);
  torch::Tensor wide = A().pad_across_processes(columns, -1);
  EXPECT_EQ(wide.sizes(), torch::IntArrayRef({2, N()}));
  EXPECT_EQ(wide.scalar_type(), torch::kBool);
  torch::Tensor same = A().pad_across_processes(mine, 5);
  EXPECT_TRUE(torch::equal(same, mine));
}

TEST(AcceleratorTest, WaitForEveryoneReturnsOnEveryRank) {
  A().wait_for_everyone();
  A().wait_for_everyone();
  SUCCEED();
}

}  // namespace
}  // namespace accel::testing
