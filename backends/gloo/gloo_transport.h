// The CPU backend: accel's Communicator over shared memory among the ranks
// of each host and Gloo's TCP transport between hosts.
//
//   accel::BackendContext context;  // rank, size, store, host
//   auto comm = accel::CreateCommunicator("gloo", context);
//   comm->allreduce(data, n, accel::DType::kFloat32, accel::ReduceOp::kSum);
//
// Registered as "gloo": programs normally get it through
// accel::CreateCommunicator("gloo", ...) or --backend=gloo.
//
// Ranks on one host exchange data through shared memory
// (backends/shm/shared_memory_group.h), not loopback TCP. With several hosts
// the collectives are hierarchical: each host's ranks combine their data in
// shared memory, one rank per host (its lowest) runs Gloo with the other
// hosts' leaders, and shares the result with its host in shared memory.
// Allreduce reduces on the host first, so only one buffer per host crosses
// the network. With one rank per host this is plain Gloo, as before.
// ACCEL_SHARED_MEMORY=0 turns shared memory off (every rank on its own, over
// TCP), for comparison or as a way around a host that forbids it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accel/runtime/comm/transport.h"
#include "backends/shm/shared_memory_group.h"

namespace gloo {
class Context;
}

namespace accel {

struct GlooOptions {
  // Ranks share memory when they share a host.
  bool shared_memory = true;
  // Which host a rank is on: ranks with the same key share memory. Empty:
  // the real host (HostLayout::ThisHostKey). Tests split threads into
  // pretend hosts with it.
  std::function<std::string(int rank)> host_key;
  SharedMemoryOptions shared_memory_options;

  // The defaults, with ACCEL_SHARED_MEMORY=0 (or "false", "off") honoured.
  static GlooOptions FromEnvironment();
};

class GlooTransport : public Transport {
 public:
  explicit GlooTransport(const BackendContext& context,
                         GlooOptions options = GlooOptions::FromEnvironment());
  ~GlooTransport() override;

  std::string backend_name() const override { return "gloo"; }

  // How many hosts the job spans and how many ranks share this one's.
  int host_count() const { return static_cast<int>(hosts_.size()); }
  int local_size() const;

 protected:
  void RunAllgather(const Op& op, const void* input, void* output, size_t count,
                    DType dtype) override;
  void RunAllgatherv(const Op& op, const void* input, void* output,
                     const std::vector<size_t>& counts, DType dtype) override;
  void RunAllreduce(const Op& op, void* buffer, size_t count, DType dtype,
                    ReduceOp reduce_op) override;
  // On one host, in shared memory; between hosts (or with shared memory
  // off), an allreduce of the whole input (ReduceScatterByAllreduce).
  void RunReduceScatter(const Op& op, const void* input, void* output,
                        const std::vector<size_t>& counts, DType dtype,
                        ReduceOp reduce_op) override;
  void RunBroadcast(const Op& op, void* buffer, size_t count, DType dtype,
                    int root) override;
  void RunBarrier(const Op& op) override;
  void Abort() override;

 private:
  // Allgather and allgatherv, in bytes per rank.
  void RunAllgatherBytes(const Op& op, const void* input, void* output,
                         const std::vector<size_t>& bytes);
  // Gloo among the hosts' leaders (every rank, without shared memory).
  void HostsAllgatherv(const Op& op, const void* input, void* output,
                       const std::vector<size_t>& bytes);
  void HostsAllreduce(const Op& op, void* buffer, size_t count, DType dtype,
                      ReduceOp reduce_op);
  void HostsBroadcast(const Op& op, void* buffer, size_t bytes, int root_host);
  void HostsBarrier(const Op& op);
  // Runs one collective; a failure stops this host's shared memory too, so
  // that its other ranks do not wait for a leader that gave up.
  template <typename Body>
  void Run(const Op& op, Body&& body);
  SharedMemoryGroup::Call LocalCall(const Op& op, int phase) const;
  bool leader() const { return local_rank_ == 0; }

  // hosts_[h]: the ranks on host h, ascending; host h's leader is the first.
  std::vector<std::vector<int>> hosts_;
  std::vector<int> host_of_;
  std::vector<int> local_rank_of_;
  int host_ = 0;
  int local_rank_ = 0;
  std::unique_ptr<SharedMemoryGroup> local_;  // With other ranks here.
  std::shared_ptr<gloo::Context> context_;    // Leaders, with other hosts.
  std::chrono::steady_clock::time_point deadline_;  // Of the running call.
  // Per-rank byte counts and offsets of the running allgather, kept between
  // calls so that a latency-bound call allocates nothing (calls run one at
  // a time).
  std::vector<size_t> block_bytes_, block_offsets_;
  // Ports of our pairs' listening sockets: the connections peers made to
  // them are ours to shut down in Abort().
  std::vector<int> listen_ports_;
};

}  // namespace accel
