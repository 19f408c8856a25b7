// Private to the conformance suite (conformance.cc,
// conformance_collectives.cc): buffers in the backend's memory whose values
// are prepared and checked on the host, and a test run on a backend's ranks.
//
//   Buffer values(DType::kInt32, 1);
//   values.Set(0, 1);
//   comm.allreduce(values.data(), 1, DType::kInt32, ReduceOp::kSum);
//   EXPECT_EQ(values.At(0), comm.size());
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "accel/runtime/base/dtype.h"
#include "tests/conformance.h"
#include "tests/thread_ranks.h"

namespace accel::testing::conformance_internal {

// Runs `body` on every rank of a `world_size` group of `backend`, as the
// backend's setup runs ranks (threads unless it says otherwise).
void RunOnRanks(const std::string& backend, int world_size,
                const std::function<void(Communicator&)>& body,
                const RankOptions& options = {});

// Why `world_size` cannot run in this process, or "" when it can.
std::string Unsupported(int world_size);

// Values prepared and checked on the host; data() hands the backend a
// buffer in its memory holding them, and At() reads its result back.
class Buffer {
 public:
  Buffer(DType dtype, size_t count);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data();
  void Set(size_t i, double v);
  double At(size_t i);

 private:
  DType dtype_;
  std::vector<char> host_;
  void* buffer_;
  bool fresh_ = true;
};

}  // namespace accel::testing::conformance_internal
