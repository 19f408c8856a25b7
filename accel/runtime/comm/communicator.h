// Collectives on typed buffers, independent of the transport underneath.
//
//   std::unique_ptr<accel::Communicator> comm =
//       accel::CreateCommunicator("gloo", context);  // see registry.h
//   std::vector<float> mine = {1, 2, 3}, all(3 * comm->size());
//   comm->allgather(mine.data(), all.data(), 3, accel::DType::kFloat32);
//   comm->allreduce(mine.data(), 3, accel::DType::kFloat32,
//                   accel::ReduceOp::kSum);
//   auto work = comm->allreduce_async(grads, n, accel::DType::kFloat32,
//                                     accel::ReduceOp::kSum);
//   ... overlap other work ...
//   work->wait();  // Throws the operation's error, if any.
//
// Every rank must call the same collectives in the same order. Operations
// run one at a time, in call order, on a worker thread per communicator; the
// blocking forms start the operation and wait for it. After a timeout or a
// peer failure the communicator is broken: later calls fail at once with
// the first error rather than hang on a dead peer.
//
// The Communicator is what is the same for every backend, around the
// Transport a backend implements (transport.h): argument checks, the queue
// and sequence numbers, the inline path for blocking calls, --v=2 traces,
// and the messages. Its Watchdog (watchdog.h) publishes what this rank is
// doing and, once a collective has waited a while, looks at the other
// ranks: a rank that left the job, or whose machine stopped answering, or
// different collectives on different ranks (CollectiveChecks, behind the
// one check_collectives switch) fail the collective at once; a timeout says
// what each rank is doing, or that it stopped responding.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "accel/runtime/base/dtype.h"
#include "accel/runtime/comm/transport.h"
#include "accel/runtime/store/store.h"

namespace accel {

class Watchdog;

// A started operation. wait() blocks until it finishes and throws its error.
class Work {
 public:
  explicit Work(std::shared_future<void> done, uint64_t sequence = 0)
      : done_(std::move(done)), sequence_(sequence) {}
  void wait() const { done_.get(); }
  bool is_completed() const {
    return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
  // The operation's sequence number (1 for a communicator's first).
  uint64_t sequence() const { return sequence_; }

 private:
  std::shared_future<void> done_;
  uint64_t sequence_;
};

class Communicator {
 public:
  // Takes the backend's transport, already joined with the other ranks.
  // With `factory` (CreateCommunicator passes the backend's), Renew() can
  // build a new one.
  Communicator(std::unique_ptr<Transport> transport,
               const BackendContext& context, TransportFactory factory = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string backend_name() const { return transport_->backend_name(); }
  // The GPU whose memory buffers must be in, or -1 for host memory.
  int device_index() const { return transport_->device_index(); }
  std::chrono::milliseconds default_timeout() const { return timeout_; }
  // Whether cross-rank checks are on (CommunicatorOptions::
  // check_collectives): the tensor layer's shape agreement follows it too.
  bool checks_enabled() const { return checks_enabled_; }
  // The backend underneath (dynamic_cast it for a backend's own methods).
  Transport& transport() { return *transport_; }

  // output[r * count ...] = input of rank r. Same count on every rank.
  std::shared_ptr<Work> allgather_async(const void* input, void* output,
                                        size_t count, DType dtype,
                                        const CollectiveOptions& options = {});
  // counts[r] elements from rank r, concatenated in rank order into output;
  // this rank contributes counts[rank()] elements. Counts may be 0.
  std::shared_ptr<Work> allgatherv_async(const void* input, void* output,
                                         std::vector<size_t> counts,
                                         DType dtype,
                                         const CollectiveOptions& options = {});
  // In place: buffer = op over every rank's buffer.
  std::shared_ptr<Work> allreduce_async(void* buffer, size_t count, DType dtype,
                                        ReduceOp op,
                                        const CollectiveOptions& options = {});
  // input holds counts[0] + ... + counts[size() - 1] elements on every
  // rank; output gets this rank's segment of their reduction (counts[rank()]
  // elements, from offset counts[0] + ... + counts[rank() - 1]). Counts may
  // differ and be 0, and must be the same list on every rank. output is
  // disjoint from input or exactly this rank's segment of it (in place).
  std::shared_ptr<Work> reduce_scatter_async(
      const void* input, void* output, std::vector<size_t> counts, DType dtype,
      ReduceOp op, const CollectiveOptions& options = {});
  // In place: every rank's buffer = root's buffer.
  std::shared_ptr<Work> broadcast_async(void* buffer, size_t count, DType dtype,
                                        int root,
                                        const CollectiveOptions& options = {});
  std::shared_ptr<Work> barrier_async(const CollectiveOptions& options = {});

  // Blocking forms. When nothing is queued they run on the calling thread,
  // which saves a thread hand-off per call on latency-bound collectives.
  // They return the call's sequence number, for callers that report
  // problems with its result (see DescribeCall).
  uint64_t allgather(const void* input, void* output, size_t count, DType dtype,
                     const CollectiveOptions& options = {});
  uint64_t allgatherv(const void* input, void* output,
                      std::vector<size_t> counts, DType dtype,
                      const CollectiveOptions& options = {});
  uint64_t allreduce(void* buffer, size_t count, DType dtype, ReduceOp op,
                     const CollectiveOptions& options = {});
  uint64_t reduce_scatter(const void* input, void* output,
                          std::vector<size_t> counts, DType dtype, ReduceOp op,
                          const CollectiveOptions& options = {});
  uint64_t broadcast(void* buffer, size_t count, DType dtype, int root,
                     const CollectiveOptions& options = {});
  uint64_t barrier(const CollectiveOptions& options = {});

  // All-to-all (MPI_Alltoall): block r of input (count elements) goes to
  // rank r, and block q of output comes from rank q; input and output hold
  // size() * count elements each and do not overlap. Ulysses-style context
  // parallelism and mixture-of-experts routing exchange through it.
  uint64_t all_to_all(const void* input, void* output, size_t count,
                      DType dtype, const CollectiveOptions& options = {});
  std::shared_ptr<Work> all_to_all_async(const void* input, void* output,
                                         size_t count, DType dtype,
                                         const CollectiveOptions& options = {});
  // All-to-all with per-rank counts (MPI_Alltoallv): send_counts[r]
  // elements to rank r, taken from input in rank order; recv_counts[q]
  // elements from rank q, put into output in rank order. What rank q sends
  // rank r must be what rank r expects from q: every rank checks the whole
  // exchange first (one allgather of the counts) and a mismatch is a
  // UsageError on every rank naming both ranks.
  uint64_t all_to_allv(const void* input, std::vector<size_t> send_counts,
                       void* output, std::vector<size_t> recv_counts,
                       DType dtype, const CollectiveOptions& options = {});

  // Starting the work again on every rank, after one rank gave it up (it
  // ran out of memory, say) while the others may wait in collectives it
  // will never call:
  //
  //   comm.Interrupt("rank 0 ran out of memory");  // On the rank that quit.
  //   ... every rank: the work ends (the others' collectives fail with
  //   InterruptedError within about check_after) and the ranks agree,
  //   through the store, to start again ...
  //   comm.Renew();                                 // Every rank.
  //
  // Interrupt() makes the collectives that wait on every rank (this one's
  // included, and those called later) fail with InterruptedError naming
  // this rank and `reason` once they have waited check_after, or at once
  // when this rank's Renew() closes its connections.
  void Interrupt(const std::string& reason);
  // Collective (every rank calls it, after its work has ended): fails the
  // operations still queued or running here, drops the transport and makes
  // a new one with fresh connections, over keys of its own in the store.
  // Then the communicator works again, numbering collectives from 1.
  // UsageError when the backend cannot (MPI cannot cancel a collective).
  void Renew();
  // How many times Renew() ran.
  int generation() const { return generation_; }
  // Collective over the store alone, so it works while the communicator is
  // broken (between Interrupt and Renew): every rank gives `mine`; returns
  // every rank's, in rank order. PeerError when a rank left the job first,
  // TimeoutError naming the ranks missing after the communicator's timeout.
  std::vector<std::string> ExchangeThroughStore(const std::string& mine);

  // Process subgroups, as torch.distributed.new_group, MPI_Comm_split and
  // ncclCommSplit make them. Collective over this communicator: every rank
  // calls it, in the same order as its other collectives.
  //
  //   // 4 ranks: {0, 1} and {2, 3}, each a communicator of 2 ranks.
  //   std::unique_ptr<Communicator> tp = comm.Split(comm.rank() / 2, 0, "tp");
  //   tp->allreduce(data, n, DType::kFloat32, ReduceOp::kSum);
  //
  // Ranks that pass the same `color` form one group, ranked by `key`, then
  // by their rank here; a rank that passes a negative color joins none and
  // gets null. The group is a Communicator of its own, on this backend:
  // its collectives run concurrently with other groups' and with this
  // communicator's, its watchdog watches its ranks, and its messages name
  // the group and each rank's rank in the job ("rank 4 (1 of group tp)").
  // `name` may not be empty; a group's groups are named "dp/shard".
  // Making a group costs one allgather here and the backend's own set-up
  // among the group's ranks (its store keys, under a prefix of its own).
  std::unique_ptr<Communicator> Split(int color, int key,
                                      const std::string& name,
                                      const CollectiveOptions& options = {});
  // The group of `ranks` (ranks here, in the order given, each once); every
  // rank calls it with the same list, and a rank not in it gets null.
  std::unique_ptr<Communicator> NewGroup(const std::vector<int>& ranks,
                                         const std::string& name,
                                         const CollectiveOptions& options = {});
  // "" for the job itself, else the group's name.
  const std::string& group_name() const { return context_.group; }
  // The rank in the job of this communicator's rank `rank`.
  int job_rank(int rank) const;
  // Operations started on this communicator since it was made or renewed
  // (the last one's sequence number): tests count them per training step
  // to catch a change that adds a collective, as torch's CommDebugMode.
  uint64_t operations_started();

  // "[gloo] rank 0/2: gather #3 (train.cc:75): ", the prefix of every
  // message about one call, for errors found in a collective's result.
  std::string DescribeCall(const CollectiveOptions& options, const char* name,
                           uint64_t sequence) const;

 private:
  using Op = Transport::Op;
  using Task = std::function<void(const Op&)>;
  struct Job {
    Op op;
    Task task;
    std::promise<void> done;
  };

  enum class Mode { kAsync, kBlocking };
  // A started operation: its Work, or none when a blocking call already ran
  // on the calling thread.
  struct Started {
    std::shared_ptr<Work> work;
    uint64_t sequence = 0;
  };
  // Validated operations come here. kBlocking runs `task` on the calling
  // thread when the worker is idle (and then allocates nothing: latency-bound
  // collectives take a microsecond), else queues it like kAsync.
  template <typename Fn>
  Started Start(const char* name, const CollectiveOptions& options,
                std::string signature, Fn&& task, Mode mode, size_t bytes = 0);
  // Each public operation validates its arguments once, then starts.
  Started StartAllgather(const void* input, void* output, size_t count,
                         DType dtype, const CollectiveOptions& options,
                         Mode mode);
  Started StartAllgatherv(const void* input, void* output,
                          std::vector<size_t> counts, DType dtype,
                          const CollectiveOptions& options, Mode mode);
  Started StartAllreduce(void* buffer, size_t count, DType dtype, ReduceOp op,
                         const CollectiveOptions& options, Mode mode);
  Started StartReduceScatter(const void* input, void* output,
                             std::vector<size_t> counts, DType dtype,
                             ReduceOp op, const CollectiveOptions& options,
                             Mode mode);
  Started StartBroadcast(void* buffer, size_t count, DType dtype, int root,
                         const CollectiveOptions& options, Mode mode);
  // `matrix` null: every rank sends count elements to every rank.
  Started StartAllToAll(const void* input, void* output,
                        std::vector<size_t> send_counts,
                        std::vector<size_t> recv_counts, DType dtype,
                        bool equal, const CollectiveOptions& options,
                        Mode mode);
  static uint64_t Finish(const Started& started);
  void WorkerLoop();
  // Stops the worker (queued operations fail) and the watchdog, before the
  // transport goes.
  void Stop();
  // Makes the watchdog and starts the worker, over `context`'s store.
  void Start(const BackendContext& context);
  // Runs one operation; returns its error, if any.
  template <typename Fn>
  std::exception_ptr Execute(Op& op, Fn& task);
  // Turns an operation's failure into the error its caller gets, breaking
  // the communicator for timeouts and peer failures (`error` null: an
  // earlier failure broke it).
  std::exception_ptr Failed(const Op& op, std::exception_ptr error);
  // "[gloo] gather #12 (train.cc:75): allgather uint8 x 1024, 1024 bytes, ",
  // the start of --v=2's line about `op`.
  std::string Traced(const Op& op) const;
  // "[gloo] rank 1/2: ", the prefix of every message about this rank.
  std::string Where() const;
  [[noreturn]] void FailUsage(const char* operation,
                              const std::string& message) const;

  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const bool checks_enabled_;
  const BackendContext context_;  // As the first transport got it.
  const TransportFactory factory_;
  int generation_ = 0;
  int exchanges_ = 0;  // ExchangeThroughStore calls, the same on every rank.
  int splits_ = 0;     // Split calls, the same on every rank.
  // Declared first, destroyed last: the worker and the watchdog use it.
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Watchdog> watchdog_;

  std::mutex mutex_;
  std::condition_variable work_available_;
  std::deque<std::unique_ptr<Job>> queue_;
  uint64_t next_sequence_ = 1;
  bool stopping_ = false;
  bool executing_ = false;     // A job runs now, on the worker or a caller.
  std::exception_ptr broken_;  // The first timeout or peer failure.
  std::thread worker_;
};

}  // namespace accel
