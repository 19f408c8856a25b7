// What a backend implements: the collectives themselves, on typed buffers,
// one at a time, with arguments the Communicator has already checked. The
// Communicator (communicator.h) owns a Transport and adds everything that
// is the same for every backend: the queue and sequence numbers, the
// inline path, the watchdog, the cross-rank checks, and the messages.
//
//   class MyTransport : public accel::Transport {
//    public:
//     explicit MyTransport(const accel::BackendContext& c) : Transport(c) {}
//     std::string backend_name() const override { return "mine"; }
//     void RunAllreduce(const Op& op, void* buffer, size_t count,
//                       accel::DType dtype, accel::ReduceOp reduce) override;
//     ...
//   };
//   static const accel::BackendRegistration kRegistration(
//       "mine", [](const accel::BackendContext& c) {
//         return std::make_unique<MyTransport>(c);
//       });
//
// Run* throw TimeoutError or PeerError for those failures (the Communicator
// adds backend, operation, rank and call site to the message, and finds out
// why a peer failed). Abort() is called from another thread (the watchdog
// found that the running operation cannot complete) and must make it fail
// soon; OnBroken() is told the message of the failure that broke the
// communicator (MPI cannot cancel a collective and ends the job there).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accel/runtime/base/dtype.h"
#include "accel/runtime/store/store.h"

namespace accel {

// Where a collective was called from, for diagnostics. The default member
// initializer below captures the caller's file and line.
struct CallSite {
  const char* file = nullptr;
  int line = 0;
  static constexpr CallSite Here(const char* file = __builtin_FILE(),
                                 int line = __builtin_LINE()) {
    return {file, line};
  }
  std::string ToString() const;  // "train.cc:75"
  // " (train.cc:75)", or "" when no line is known (a call accel makes
  // inside the model's forward, whose own name then says where).
  std::string Parenthesized() const;
};

// Per-call options.
struct CollectiveOptions {
  // Zero means the communicator's default (CommunicatorOptions::timeout).
  std::chrono::milliseconds timeout{0};
  // The name diagnostics use for the call ("gather", "wait_for_everyone");
  // null means the operation's own name.
  const char* api = nullptr;
  CallSite site = CallSite::Here();
};

struct CommunicatorOptions {
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Every rank republishes its status at least this often; a rank whose
  // status stays unchanged for four intervals is reported as not
  // responding (stopped, overloaded or unreachable) when a collective
  // times out.
  std::chrono::milliseconds heartbeat_interval = std::chrono::milliseconds(500);
  // Once a collective has waited check_after, a watchdog looks at the other
  // ranks: one that left the job fails the collective at once instead of at
  // the timeout. With check_collectives, every rank also publishes what it
  // is doing (at most every status_interval), and different collectives on
  // different ranks fail the same way.
  bool check_collectives = true;
  std::chrono::milliseconds status_interval = std::chrono::milliseconds(100);
  std::chrono::milliseconds check_after = std::chrono::milliseconds(1000);
};

// What a backend needs to join a job. Built by rendezvous.h or by tests.
struct BackendContext {
  int rank = 0;
  int size = 1;
  // Shared by all ranks; the backend may use it under its own prefix.
  std::shared_ptr<Store> store;
  // Address this process's data connections listen on, reachable by peers.
  std::string host = "127.0.0.1";
  // Local device index (GPU backends), and the ranks on this machine.
  int local_rank = 0;
  int local_size = 1;
  CommunicatorOptions options;
  // Bound on connecting to the other ranks; zero means options.timeout.
  // ProcessGroup passes what is left of the rendezvous timeout.
  std::chrono::milliseconds connect_timeout{0};
  // A process subgroup (Communicator::Split): its name ("tp", "dp/shard")
  // and job_ranks[r], the rank in the job of its rank r. Both empty for the
  // job itself, where rank is the job's rank. local_rank stays the job's
  // (it picks the GPU).
  std::string group;
  std::vector<int> job_ranks;
};

// How messages name rank `rank` of the ranks `context` joins: "rank 3" in
// the job, "rank 4 (1 of group tp)" in a subgroup.
std::string RankName(const BackendContext& context, int rank);
// This rank for message prefixes: "rank 1/2", "rank 4 (1/3 of group tp)".
std::string RankWhere(const BackendContext& context);

class Transport;
// Makes a backend's transport for one rank (registry.h registers them).
using TransportFactory =
    std::function<std::unique_ptr<Transport>(const BackendContext&)>;

class Transport {
 public:
  // What a Run* call knows about the operation it runs.
  struct Op {
    const char* name;
    uint64_t sequence;  // 1 for the first collective, same on every rank.
    std::chrono::milliseconds timeout;
    const char* api;        // Name for diagnostics.
    CallSite site;          // Where the caller called it.
    std::string signature;  // What must match on every rank.
    size_t bytes = 0;       // This rank's payload (--v=2 logs it).
    // Started with *_async: the caller computes meanwhile, so a transport
    // that polls while it waits takes CPU from that computation.
    bool overlapped = false;
    // When the communicator started running it (unset: when the transport
    // does). One clock read per call serves the watchdog and the deadline.
    std::chrono::steady_clock::time_point started{};
    // started + timeout, or now + timeout if started is unset.
    std::chrono::steady_clock::time_point Deadline() const;
  };

  virtual ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend_name() const = 0;
  // The GPU whose memory buffers must be in, or -1 for host memory.
  virtual int device_index() const { return -1; }

  // output[r * count ...] = input of rank r.
  virtual void RunAllgather(const Op& op, const void* input, void* output,
                            size_t count, DType dtype) = 0;
  // counts[r] elements from rank r, concatenated in rank order.
  virtual void RunAllgatherv(const Op& op, const void* input, void* output,
                             const std::vector<size_t>& counts,
                             DType dtype) = 0;
  virtual void RunAllreduce(const Op& op, void* buffer, size_t count,
                            DType dtype, ReduceOp reduce_op) = 0;
  // input: counts[0] + ... + counts[size-1] elements on every rank; output:
  // this rank's segment (counts[rank] elements at the sum of the counts
  // before it) reduced over the ranks. output is either disjoint from input
  // or exactly this rank's segment of it.
  virtual void RunReduceScatter(const Op& op, const void* input, void* output,
                                const std::vector<size_t>& counts, DType dtype,
                                ReduceOp reduce_op) = 0;
  virtual void RunBroadcast(const Op& op, void* buffer, size_t count,
                            DType dtype, int root) = 0;
  virtual void RunBarrier(const Op& op) = 0;
  // counts[q * size() + r] elements go from rank q to rank r: from this
  // rank's input in rank order, into its output in rank order. The default
  // gathers every rank's whole input on every rank (allgatherv) and keeps
  // this rank's blocks: size() times the traffic of a native exchange,
  // for backends with nothing better.
  virtual void RunAllToAll(const Op& op, const void* input, void* output,
                           const std::vector<size_t>& counts, DType dtype);

  // The transport of a process subgroup (Communicator::Split), made while
  // `op` runs on every rank of this transport: `group` is this rank's
  // group, or null for a rank in none; `color` and `key` as Split got them.
  // The default makes a new transport of this backend over the group's own
  // store keys with `factory` (only the group's ranks take part); MPI
  // splits its communicator instead, which every rank must call.
  virtual std::unique_ptr<Transport> MakeGroup(const Op& op,
                                               const BackendContext* group,
                                               int color, int key,
                                               const TransportFactory& factory);

  // From another thread (the watchdog): make the running operation fail
  // soon. Records the request (abort_requested()), then calls Abort().
  void RequestAbort();
  // From another thread: make the running operation fail soon.
  virtual void Abort() {}
  virtual void OnBroken(const std::string& /*message*/) {}
  // Whether Communicator::Renew may drop this transport after an aborted
  // operation and build another (MPI cannot cancel a collective).
  virtual bool renewable() const { return true; }

 protected:
  explicit Transport(const BackendContext& context);

  // "[gloo] rank 1/2: ", the prefix of every message about this rank
  // ("[gloo] rank 4 (1/3 of group tp): " in a subgroup).
  std::string Where() const;
  // Throws UsageError "<where><operation>: <message>".
  [[noreturn]] void FailUsage(const char* operation,
                              const std::string& message) const;
  // RunReduceScatter over RunAllreduce of a copy of the whole input, for
  // host memory where a backend has nothing better (it moves every rank's
  // segments to every rank: size times the bytes a reduce-scatter needs).
  // With collective checks on, the ranks first agree that they run the same
  // call (a 2-element allreduce), since an allreduce of different totals
  // could corrupt memory or crash the backend.
  void ReduceScatterByAllreduce(const Op& op, const void* input, void* output,
                                const std::vector<size_t>& counts, DType dtype,
                                ReduceOp reduce_op);
  // Returns when every rank runs the same call as this one (sequence number
  // and signature), in one 2-element allreduce of its hash; otherwise moves
  // nothing and waits for the watchdog to stop the call, which names each
  // rank's (or throws TimeoutError at op.timeout).
  void AgreeOnCall(const Op& op);
  bool abort_requested() const { return abort_requested_.load(); }
  bool checks_enabled() const { return checks_enabled_; }

 private:
  const int rank_;
  const int size_;
  const std::string where_;  // Where() but for the backend's name.
  const bool checks_enabled_;
  std::atomic<bool> abort_requested_{false};
};

}  // namespace accel
