// Collectives on typed buffers, independent of the transport underneath.
//
//   std::unique_ptr<accel::Communicator> comm = ...;  // see registry.h
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
// Diagnostics stand beside the collectives: a watchdog thread publishes
// what this rank is doing (and a heartbeat) to the store, and, once a
// collective has waited a while, looks at the other ranks: a rank that left
// the job, or whose machine stopped answering, or different collectives on
// different ranks fail the collective at once; a timeout says what each
// rank is doing, or that it stopped responding. The watchdog's store
// requests are bounded by a short timeout of their own and share no lock
// with the collectives, so a stopped rank 0 (which hosts the store) delays
// nothing.
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
};

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend_name() const = 0;
  // The GPU whose memory buffers must be in, or -1 for host memory.
  virtual int device_index() const { return -1; }
  std::chrono::milliseconds default_timeout() const { return timeout_; }

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
  uint64_t broadcast(void* buffer, size_t count, DType dtype, int root,
                     const CollectiveOptions& options = {});
  uint64_t barrier(const CollectiveOptions& options = {});

  // "[gloo] rank 0/2: gather #3 (train.cc:75): ", the prefix of every
  // message about one call, for errors found in a collective's result.
  std::string DescribeCall(const CollectiveOptions& options, const char* name,
                           uint64_t sequence) const;

 protected:
  // What a backend's Run* method knows about the operation it runs.
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
  };

  explicit Communicator(const BackendContext& context);

  // Transport work, called on the worker thread one at a time with
  // validated arguments. Throw TimeoutError or PeerError for those failures;
  // the base adds the backend, operation and rank to the message.
  virtual void RunAllgather(const Op& op, const void* input, void* output,
                            size_t count, DType dtype) = 0;
  virtual void RunAllgatherv(const Op& op, const void* input, void* output,
                             const std::vector<size_t>& counts,
                             DType dtype) = 0;
  virtual void RunAllreduce(const Op& op, void* buffer, size_t count,
                            DType dtype, ReduceOp reduce_op) = 0;
  virtual void RunBroadcast(const Op& op, void* buffer, size_t count,
                            DType dtype, int root) = 0;
  virtual void RunBarrier(const Op& op) = 0;

  // Derived destructors call this first, so that no Run* call is in flight
  // while their members are destroyed. Queued operations fail.
  void StopWorker();

  // Makes the running operation fail soon (the watchdog found a mismatch or
  // a departed rank); called from another thread. Gloo closes its
  // connections, NCCL aborts its communicator.
  virtual void Abort() {}

  // Called on the thread that ran an operation that failed and broke the
  // communicator, with the message its caller is about to get. MPI cannot
  // cancel a collective, so its backend reports the message and ends the
  // job here instead.
  virtual void OnBroken(const std::string& message) {}

  // "[gloo] rank 1/2: ", the prefix of every message about this rank.
  std::string Where() const;

  // Throws UsageError "<where><operation>: <message>".
  [[noreturn]] void FailUsage(const char* operation,
                              const std::string& message) const;

 private:
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
  Started StartBroadcast(void* buffer, size_t count, DType dtype, int root,
                         const CollectiveOptions& options, Mode mode);
  static uint64_t Finish(const Started& started);
  void WorkerLoop();
  // Runs one operation; returns its error, if any.
  template <typename Fn>
  std::exception_ptr Execute(const Op& op, Fn& task);
  // Turns an operation's failure into the error its caller gets, breaking
  // the communicator for timeouts and peer failures (`error` null: an
  // earlier failure broke it).
  std::exception_ptr Failed(const Op& op, std::exception_ptr error);
  // "[gloo] gather #12 (train.cc:75): allgather uint8 x 1024, 1024 bytes, ",
  // the start of --v=2's line about `op`.
  std::string Traced(const Op& op) const;

  // What one rank is doing, as published in the store.
  struct Status {
    bool known = false;
    uint64_t sequence = 0;
    bool running = false;
    std::string api;
    std::string signature;
    std::string site;
    bool published = false;  // The rank has published a status.
    uint64_t beat = 0;       // Bumped at every publication.
    std::string departed;    // How the rank left (Store::departures()).
    bool silent = false;     // Its status stopped changing (see heartbeats).
    std::chrono::steady_clock::duration silent_for{0};
  };
  // What this rank knows of the others beyond their statuses.
  struct Observation {
    uint64_t beat = 0;
    std::chrono::steady_clock::time_point since;  // When beat last changed.
    bool seen = false;
  };
  // The last collective that completed here and needed every rank, so
  // every rank has called it: a lower bound on each rank's progress that
  // holds even when a stopped rank could not publish.
  struct Completed {
    uint64_t sequence = 0;
    std::string api;
    std::string site;
  };
  // Statuses of every rank, or a description of why the store (rank 0)
  // could not tell: "rank 0 is not responding: ...".
  struct Picture {
    std::vector<Status> statuses;
    std::string store_problem;
    bool store_lost = false;  // The connection to rank 0 is gone.
  };
  static std::string Encode(const Status& status);
  static Status Decode(const std::string& text);
  std::vector<Status> ReadStatuses(const Status& mine);
  Picture TakePicture(const Status& mine);
  // "ranks 0, 1 (rank 0's machine)": the ranks that share rank 0's host.
  std::string RanksWithRank0() const;
  Status CurrentStatus();
  static bool Differs(const Status& other, const Status& mine);
  // "rank 1 is in gather #12 (train.cc:75)" for every other rank.
  std::string DescribeRanks(const std::vector<Status>& statuses,
                            const Status& mine, bool only_differing) const;
  // `succeeded`: the call completed here (see last_completed_).
  void SetStatus(const Op& op, bool running, bool succeeded = false);
  void WatchdogLoop();
  // Waits briefly for the store to notice which process left after the
  // data path saw a broken connection; the departed ranks, or "".
  std::string AwaitDepartures(int* failed_rank);
  // The message of a collective that failed with `e` and no watchdog
  // verdict.
  std::exception_ptr Diagnose(const std::string& what, const Op& op,
                              const std::exception& e);

  const int rank_;
  const int size_;
  const int local_size_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<Store> store_;

  std::mutex mutex_;
  std::condition_variable work_available_;
  std::deque<std::unique_ptr<Job>> queue_;
  uint64_t next_sequence_ = 1;
  bool stopping_ = false;
  bool executing_ = false;     // A job runs now, on the worker or a caller.
  std::exception_ptr broken_;  // The first timeout or peer failure.
  std::thread worker_;

  const CommunicatorOptions options_;
  mutable std::mutex status_mutex_;
  std::condition_variable status_changed_;
  Status status_;
  CallSite status_site_;  // status_.site, formatted only when it changes
  uint64_t status_version_ = 0;
  std::chrono::steady_clock::time_point running_since_;
  Completed last_completed_;
  std::vector<Observation> observations_;  // Guarded by status_mutex_.
  std::string abort_reason_;  // Set by the watchdog before Abort().
  bool abort_is_usage_ = false;
  int abort_rank_ = -1;
  bool watchdog_stopping_ = false;
  std::thread watchdog_;
};

}  // namespace accel
