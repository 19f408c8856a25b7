// The tracker counts what LibTorch allocates on the CPU and is transparent
// to every kernel, those that allocate raw among them (with it installed,
// torch::gelu failed with "d INTERNAL ASSERT FAILED" and a bfloat16 matmul
// with "dptr.get() == dptr.get_context() INTERNAL ASSERT FAILED").
#include "accel/memory/host_memory_tracker.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace accel {
namespace {

// First: its reference values are computed before the tracker exists.
TEST(HostMemoryTrackerTest, KernelsThatAllocateRawWorkAsWithout) {
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({64, 96});
  const torch::Tensor w = torch::randn({96, 32});
  // Without the tracker first.
  const torch::Tensor gelu = torch::gelu(x);
  const torch::Tensor bf16 =
      torch::matmul(x.to(torch::kBFloat16), w.to(torch::kBFloat16));
  const torch::Tensor conv =
      torch::conv2d(x.view({1, 1, 64, 96}), torch::ones({4, 1, 3, 3}));
  HostMemoryTracker& memory = HostMemoryTracker::Install();
  const int64_t before = memory.held_bytes();
  {
    EXPECT_TRUE(torch::equal(torch::gelu(x), gelu));
    EXPECT_TRUE(torch::equal(
        torch::matmul(x.to(torch::kBFloat16), w.to(torch::kBFloat16)), bf16));
    EXPECT_TRUE(torch::equal(
        torch::conv2d(x.view({1, 1, 64, 96}), torch::ones({4, 1, 3, 3})),
        conv));
    torch::Tensor grad_input = torch::randn({64, 96}, torch::requires_grad());
    torch::gelu(grad_input.to(torch::kBFloat16)).sum().backward();
    EXPECT_TRUE(grad_input.grad().defined());
  }
  EXPECT_EQ(memory.held_bytes(), before);
}

TEST(HostMemoryTrackerTest, CountsTensorsAndTheirPeak) {
  HostMemoryTracker& memory = HostMemoryTracker::Install();
  EXPECT_EQ(&HostMemoryTracker::Install(), &memory);
  const int64_t before = memory.held_bytes();
  memory.ResetPeak();
  {
    torch::Tensor a = torch::empty({1 << 20}, torch::kUInt8);
    EXPECT_EQ(memory.held_bytes(), before + (1 << 20));
    torch::Tensor b = torch::empty({1 << 18}, torch::kFloat32);
    EXPECT_EQ(memory.held_bytes(), before + (2 << 20));
  }
  EXPECT_EQ(memory.held_bytes(), before);
  EXPECT_EQ(memory.peak_bytes(), before + (2 << 20));
  memory.ResetPeak();
  EXPECT_EQ(memory.peak_bytes(), before);
}

}  // namespace
}  // namespace accel
