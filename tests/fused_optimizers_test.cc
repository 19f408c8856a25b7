// accel::FusedAdamW (accel/optim/fused_optimizers.h) through the
// Accelerator at 2 processes: under DDP and ZeRO stages 1, 2 and 3 (which
// point the optimizer at flat shard pieces), the same parameters after
// kFewSteps steps as LibTorch's AdamW, bit for bit (the fused step's
// tolerance, 0 ulp, which //accel/optim:fused_optimizers_test checks
// element by element), every step fused.
#include "accel/optim/fused_optimizers.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "tests/multiprocess_main.h"
#include "tests/zero_training.h"

namespace accel::testing {
namespace {

constexpr int kFewSteps = 8;

class FusedAdamWTest : public ::testing::TestWithParam<int> {};

TEST_P(FusedAdamWTest, GivesLibTorchsParameters) {
  const int stage = GetParam();
  const Result libtorch = Train({.stage = stage, .steps = kFewSteps});
  const fused_internal::StepCounts before = fused_internal::CountedSteps();
  const Result fused =
      Train({.stage = stage, .steps = kFewSteps, .fused = true});
  const fused_internal::StepCounts after = fused_internal::CountedSteps();
  EXPECT_EQ(MaxDifference(fused.parameters, libtorch.parameters), 0.0);
  EXPECT_EQ(fused.state_elements, libtorch.state_elements);
  // Every step of every piece this rank holds went through the loop (the
  // model has 6 tensors; a rank's ZeRO share covers some of them).
  EXPECT_GE(after.fused - before.fused, kFewSteps);
  EXPECT_EQ(after.unfused, before.unfused);
  // Not vacuous: training moved the weights (under stage 3 only the main
  // process gathers them; the others compare nothing).
  const Result untrained = Train({.stage = stage, .steps = 0});
  if (SharedAccelerator().is_main_process()) {
    EXPECT_GT(MaxDifference(libtorch.parameters, untrained.parameters), 1e-2);
    std::printf("stage %d at %d processes: fused AdamW equals AdamW\n", stage,
                SharedAccelerator().num_processes());
  }
}

INSTANTIATE_TEST_SUITE_P(DdpAndZeroStages, FusedAdamWTest,
                         ::testing::Values(0, 1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0
                                      ? std::string("Ddp")
                                      : "ZeroStage" +
                                            std::to_string(info.param);
                         });

}  // namespace
}  // namespace accel::testing
