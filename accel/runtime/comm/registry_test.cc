// Backend resolution: "auto" takes the first usable backend, and skips
// nccl when the program trains on the CPU (--cpu). No backend is linked
// here: the test registers stand-ins whose probes it controls.
#include "accel/runtime/comm/registry.h"

#include <gtest/gtest.h>

#include <atomic>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

std::atomic<bool> gpu_visible{true};

std::unique_ptr<Transport> NoTransport(const BackendContext&) {
  throw UsageError("the stand-in backends of registry_test make nothing");
}

TEST(RegistryTest, AutoPicksNcclWhereUsableExceptOnTheCpu) {
  RegisterBackend("nccl", NoTransport, [] { return gpu_visible.load(); });
  RegisterBackend("gloo", NoTransport);
  EXPECT_EQ(ResolveBackend("auto"), "nccl");
  EXPECT_EQ(ResolveBackend("auto", /*cpu_only=*/true), "gloo");
  // A name is returned as it is (the options refuse --cpu with nccl).
  EXPECT_EQ(ResolveBackend("nccl", /*cpu_only=*/true), "nccl");
  gpu_visible = false;
  EXPECT_EQ(ResolveBackend("auto"), "gloo");
  EXPECT_FALSE(BackendUsable("nccl"));
  EXPECT_TRUE(BackendUsable("gloo"));
  EXPECT_THROW(RegisterBackend("gloo", NoTransport), UsageError);
}

}  // namespace
}  // namespace accel
