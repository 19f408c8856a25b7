#include "accel/optim/autocast.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>

#include "accel/core/libtorch_compat.h"

namespace accel {
namespace {

constexpr c10::DeviceType kCpu = c10::DeviceType::CPU;

class AutocastTest : public ::testing::Test {
 protected:
  // What the linear layer computes in, on this thread, now.
  c10::ScalarType ForwardDtype() { return linear->forward(x).scalar_type(); }

  torch::nn::Linear linear{4, 2};
  torch::Tensor x = torch::rand({3, 4});
};

TEST_F(AutocastTest, ARefusedScopeLeavesTheThreadAsItWas) {
  EXPECT_THROW(AutocastScope(c10::DeviceType::Meta, c10::kBFloat16),
               std::invalid_argument);
  // LibTorch 1.13 has no float16 autocast on the CPU: its refusal took the
  // scope half in, and every later change threw (a destructor: terminate).
  bool refused = false;
  try {
    AutocastScope half(kCpu, c10::kHalf);
  } catch (const std::exception&) {
    refused = true;
  }
  if (refused) {
    EXPECT_EQ(ForwardDtype(), torch::kFloat32);
    EXPECT_EQ(at::autocast::decrement_nesting(), -1);  // Not left raised.
    at::autocast::increment_nesting();
  }
  {
    AutocastScope bf16(kCpu, c10::kBFloat16);
    EXPECT_EQ(ForwardDtype(), torch::kBFloat16);
  }
  EXPECT_EQ(ForwardDtype(), torch::kFloat32);
}

TEST_F(AutocastTest, FloorsStackAndTheNewestAliveIsInForce) {
  auto first = std::make_unique<ThreadAutocast>(kCpu, c10::kBFloat16);
  // A second Accelerator's floor ended the first one's.
  { ThreadAutocast second(kCpu, c10::kBFloat16); }
  EXPECT_EQ(ForwardDtype(), torch::kBFloat16);
  {
    // Ending the older first leaves the newer in force.
    auto second = std::make_unique<ThreadAutocast>(kCpu, c10::kBFloat16);
    first.reset();
    EXPECT_EQ(ForwardDtype(), torch::kBFloat16);
  }
  EXPECT_EQ(ForwardDtype(), torch::kFloat32);
}

TEST_F(AutocastTest, AStepInsideAFullPrecisionScopeEndsTheCachedCasts) {
  // LibTorch caches the casts of leaves that are not views: a weight in
  // mm (Linear's forward passes a transposed view).
  const torch::Tensor weight = torch::rand({4, 2}).requires_grad_();
  AutocastScope cached(kCpu, c10::kBFloat16, /*cache_enabled=*/true);
  const torch::Tensor before = torch::mm(x, weight);
  {
    AutocastScope off = AutocastScope::Off(kCpu);
    const AutocastPause step;  // As accel's optimizer step does.
    torch::NoGradGuard no_grad;
    weight.mul_(-3);
  }
  const torch::Tensor fresh =
      torch::mm(x.to(torch::kBFloat16), weight.detach().to(torch::kBFloat16));
  EXPECT_FALSE(torch::equal(before, fresh));
  EXPECT_TRUE(torch::equal(torch::mm(x, weight), fresh));
}

TEST_F(AutocastTest, ScopesInsideAPauseDoNotEndIt) {
  AutocastScope outer(kCpu, c10::kBFloat16);
  {
    const AutocastPause pause;
    {
      AutocastScope inner(kCpu, c10::kBFloat16);
      EXPECT_EQ(ForwardDtype(), torch::kFloat32);
      const AutocastPause nested;
    }
    EXPECT_EQ(ForwardDtype(), torch::kFloat32);
  }
  EXPECT_EQ(ForwardDtype(), torch::kBFloat16);
}

TEST_F(AutocastTest, APauseOutsideAccelsScopesGivesBackLibTorchsSetting) {
  compat::SetAutocastEnabled(kCpu, true);
  {
    const AutocastPause pause;
    EXPECT_EQ(ForwardDtype(), torch::kFloat32);
    // A scope that opens and ends inside the pause.
    { AutocastScope inner(kCpu, c10::kBFloat16); }
  }
  EXPECT_EQ(ForwardDtype(), torch::kBFloat16);
  compat::SetAutocastEnabled(kCpu, false);
  at::autocast::clear_cache();
}

TEST_F(AutocastTest, AScopeEndedOnAnotherThreadLeavesThatThreadAlone) {
  std::optional<AutocastScope> mine(std::in_place, kCpu, c10::kBFloat16);
  c10::ScalarType worker_dtype = c10::ScalarType::Undefined;
  std::thread worker([&] {
    AutocastScope its_own(kCpu, c10::kBFloat16);
    mine.reset();  // Closed the worker's scope of the same number.
    worker_dtype = ForwardDtype();
  });
  worker.join();
  EXPECT_EQ(worker_dtype, torch::kBFloat16);
  // This thread drops it at its next change.
  { AutocastScope other = AutocastScope::Off(kCpu); }
  EXPECT_EQ(ForwardDtype(), torch::kFloat32);
  EXPECT_EQ(at::autocast::decrement_nesting(), -1);
  at::autocast::increment_nesting();
}

TEST_F(AutocastTest, AFloorEndedOnAnotherThreadGoesAtTheNextChange) {
  auto floor = std::make_unique<ThreadAutocast>(kCpu, c10::kBFloat16);
  std::thread([&] { floor.reset(); }).join();
  { const AutocastPause step; }
  EXPECT_EQ(ForwardDtype(), torch::kFloat32);
}

}  // namespace
}  // namespace accel
