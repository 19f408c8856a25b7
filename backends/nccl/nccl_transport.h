// The GPU backend: accel's Communicator over NCCL, one rank per GPU.
//
//   accel::BackendContext context;  // rank, size, store, local_rank
//   accel::NcclTransport comm(context);       // device = LOCAL_RANK
//   comm.allreduce(device_ptr, n, accel::DType::kFloat32,
//                  accel::ReduceOp::kSum);       // device memory
//
// Registered as "nccl". Buffers are device pointers on this rank's GPU. Each
// operation first waits for the work already queued on the device's legacy
// default stream (where LibTorch queues work unless told otherwise), runs on
// the communicator's own stream, and returns once it has completed, so that
// the blocking contract of Communicator holds. A wait longer than the
// timeout, or a peer that left the job, aborts the NCCL communicator
// (ncclCommAbort) instead of blocking forever.
#pragma once

#include <memory>
#include <string>

#include "accel/runtime/comm/transport.h"

namespace accel {

class NcclTransport : public Transport {
 public:
  explicit NcclTransport(const BackendContext& context);
  ~NcclTransport() override;

  std::string backend_name() const override { return "nccl"; }
  int device_index() const override;

 protected:
  void RunAllgather(const Op& op, const void* input, void* output, size_t count,
                    DType dtype) override;
  void RunAllgatherv(const Op& op, const void* input, void* output,
                     const std::vector<size_t>& counts, DType dtype) override;
  void RunAllreduce(const Op& op, void* buffer, size_t count, DType dtype,
                    ReduceOp reduce_op) override;
  // ncclReduceScatter for equal counts, else one ncclReduce per rank in
  // one group launch.
  void RunReduceScatter(const Op& op, const void* input, void* output,
                        const std::vector<size_t>& counts, DType dtype,
                        ReduceOp reduce_op) override;
  void RunBroadcast(const Op& op, void* buffer, size_t count, DType dtype,
                    int root) override;
  void RunBarrier(const Op& op) override;
  // Grouped ncclSend/ncclRecv, one pair per rank with data to move.
  void RunAllToAll(const Op& op, const void* input, void* output,
                   const std::vector<size_t>& counts, DType dtype) override;
  void Abort() override;

 private:
  struct State;
  // Enqueues `launch` on the communicator's stream after the default
  // stream's work, then waits for completion within op.timeout.
  template <typename Launch>
  void Run(const Op& op, Launch&& launch);
  std::unique_ptr<State> state_;
};

// Number of CUDA devices visible, or a negative CUDA error code.
int VisibleCudaDevices(std::string* error);

}  // namespace accel
