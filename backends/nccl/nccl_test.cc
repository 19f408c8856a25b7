// The nccl backend where there is no GPU (this machine, CI): it must be
// linked, refuse clearly and quickly, and never be chosen by "auto".
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/registry.h"
#include "accel/runtime/store/store.h"

namespace accel {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

bool GpuVisible() { return ResolveBackend("auto") == "nccl"; }

TEST(NcclWithoutGpuTest, IsRegistered) {
  const auto names = RegisteredBackends();
  EXPECT_NE(std::find(names.begin(), names.end(), "nccl"), names.end());
}

TEST(NcclWithoutGpuTest, AutoPicksGloo) {
  if (GpuVisible()) GTEST_SKIP() << "a GPU is visible here";
  EXPECT_EQ(ResolveBackend("auto"), "gloo");
  EXPECT_EQ(ResolveBackend("nccl"), "nccl");
}

TEST(NcclWithoutGpuTest, CreatingItFailsFastSayingWhatWasFoundAndWhatToDo) {
  if (GpuVisible()) GTEST_SKIP() << "a GPU is visible here";
  BackendContext context;
  context.store = std::make_shared<InMemoryStore>();
  const auto start = std::chrono::steady_clock::now();
  try {
    CreateCommunicator("nccl", context);
    FAIL() << "the nccl backend started without a GPU";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), AnyOf(HasSubstr("no CUDA GPU is visible"),
                                HasSubstr("built without CUDA")));
    EXPECT_THAT(e.what(), HasSubstr("--backend=gloo"));
  }
  // At once, not after a NCCL or network timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace accel
