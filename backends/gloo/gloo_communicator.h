// The CPU backend: accel's Communicator over Gloo's TCP transport.
//
//   accel::BackendContext context;  // rank, size, store, host
//   accel::GlooCommunicator comm(context);
//   comm.allreduce(data, n, accel::DType::kFloat32, accel::ReduceOp::kSum);
//
// Registered as "gloo": programs normally get it through
// accel::CreateCommunicator("gloo", ...) or --backend=gloo.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "accel/runtime/communicator.h"

namespace gloo {
class Context;
}

namespace accel {

class GlooCommunicator : public Communicator {
 public:
  explicit GlooCommunicator(const BackendContext& context);
  ~GlooCommunicator() override;

  std::string backend_name() const override { return "gloo"; }

 protected:
  void RunAllgather(const Op& op, const void* input, void* output, size_t count,
                    DType dtype) override;
  void RunAllgatherv(const Op& op, const void* input, void* output,
                     const std::vector<size_t>& counts, DType dtype) override;
  void RunAllreduce(const Op& op, void* buffer, size_t count, DType dtype,
                    ReduceOp reduce_op) override;
  void RunBroadcast(const Op& op, void* buffer, size_t count, DType dtype,
                    int root) override;
  void RunBarrier(const Op& op) override;
  void Abort() override;

 private:
  std::shared_ptr<gloo::Context> context_;
  // Ports of our pairs' listening sockets: the connections peers made to
  // them are ours to shut down in Abort().
  std::vector<int> listen_ports_;
};

}  // namespace accel
