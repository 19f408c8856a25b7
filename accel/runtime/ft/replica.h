// One replica of a fault-tolerant data-parallel job (torchft's Manager, in
// C++ over accel's store and communicators): the replicas that are alive
// agree on each step's members, sum the gradients over them, and go on when
// one is lost; a replacement joins at a step boundary and takes the state
// from a live member over the job's transport, without a checkpoint.
//
//   accel::ft::ReplicaOptions options;
//   options.backend = "gloo";
//   options.rank = rank;  options.world_size = world_size;
//   options.store = job_store;  // rank 0 runs the Lighthouse beside it
//   options.save_state = [&] { return Serialize(model, optimizer); };
//   options.load_state = [&](const std::string& s) { Load(s, ...); };
//   accel::ft::Replica replica(options);
//   while (replica.step() < steps && replica.StartStep()) {
//     // StartStep may have loaded the state from a peer (a joiner).
//     ShareOf(replica.step(), replica.quorum_index(), replica.quorum_size());
//     ... forward, backward (loss summed over this share / global batch) ...
//     if (replica.AllreduceAndCommit({{grads, n, accel::DType::kFloat32}})) {
//       optimizer.step();               // Every member applies the same sum.
//     }                                 // Else: the same step runs again.
//     zero_grad();
//   }
//
// Exactness: a step is applied only with a completed sum over its members,
// and a failed step runs again with the members left, on the same data (it
// is the caller's function of the step; the members split each step's
// global batch among themselves), so no sample is lost or counted twice.
// The members of each applied step (history()) replay the run bit for bit.
//
// While nothing changes a step costs one more number in the sum (whether
// the lighthouse called a round), and nothing over the store: the
// heartbeat thread waits for the lighthouse's call. A member applies a
// step when its own sum completed (every completed sum is the same); one
// whose sum failed goes to the round, where the members that applied the
// most steps send their state to those behind.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "accel/runtime/base/dtype.h"
#include "accel/runtime/comm/communicator.h"
#include "accel/runtime/ft/lighthouse.h"
#include "accel/runtime/ft/quorum.h"
#include "accel/runtime/store/store.h"

namespace accel::ft {

// Where a test's injector may make a replica fail (ReplicaOptions::inject).
enum class Point {
  kBeforeAllreduce,  // Its gradients are ready.
  kDuringAllreduce,  // Its sum was started, not waited for.
  kAfterAllreduce,   // Its sum completed; it has not voted.
  kDuringRecovery,   // The state is being sent (source and receivers).
};
const char* PointName(Point point);

struct ReplicaOptions {
  std::string backend = "gloo";
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  // The job's store; the replica works under "ft/" in it.
  std::shared_ptr<Store> store;
  // Address this process's data connections listen on.
  std::string host = "127.0.0.1";
  // The quorum's communicators (timeout, heartbeats, checks).
  CommunicatorOptions communicator;
  // Bound on one round with the lighthouse (a joiner waits for the step
  // the others run, the first quorum for every rank to arrive).
  std::chrono::milliseconds quorum_timeout = std::chrono::minutes(5);
  std::chrono::milliseconds heartbeat_interval = std::chrono::milliseconds(250);
  // The step this process starts at (a resumed checkpoint's); the first
  // quorum takes the lowest rank's.
  int64_t start_step = 0;
  // This replica's whole training state (parameters, optimizer, random
  // generators) as bytes, and back. Called when a member joins.
  std::function<std::string()> save_state;
  std::function<void(const std::string&)> load_state;
  // Tests: called at each Point with the step; throwing there makes the
  // replica fail as a lost process would (its destructor closes its
  // connections).
  std::function<void(Point, int64_t step)> inject;
  // Set on the rank whose process hosts the store (rank 0): that replica
  // runs the job's Lighthouse too (world_size is taken from here).
  std::optional<LighthouseOptions> lighthouse;
};

// A gradient buffer to sum over the members.
struct Buffer {
  void* data;
  size_t count;
  DType dtype;
  // Its last element is the replica's to use (float32 or float64): the
  // number of members called to a round travels in it, which saves a
  // collective per step.
  bool spare_last = false;
};

// One membership change, as the member with the lowest rank reports it.
struct Change {
  int64_t step = 0;    // The step the new quorum runs.
  int64_t quorum = 0;  // Its id.
  std::vector<int> members, lost, joined;
  // Lost: from the failed step to the new quorum ready (state sent).
  // Joined: sending the state; on the joiner itself (its first change):
  // from its start to its first step's start.
  double seconds = 0;
};

class Replica {
 public:
  explicit Replica(ReplicaOptions options);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // Blocks until this replica belongs to a quorum ready to run step(),
  // loading the state from a member first when it joins. False when the
  // job has finished without it (a replacement that came too late): leave
  // the loop. Error when the job cannot go on (the lighthouse stopped it,
  // or the store's host went).
  bool StartStep();
  // Sums `buffers` over the quorum (in place). True: the sums completed
  // (apply them; step() moved on). False: discard them; the next
  // StartStep goes to a round and step() runs again with the members left
  // (or this replica takes the state of those that applied it).
  bool AllreduceAndCommit(const std::vector<Buffer>& buffers);

  int64_t step() const { return step_; }
  int quorum_index() const { return quorum_.IndexOf(options_.rank); }
  int quorum_size() const { return static_cast<int>(quorum_.members.size()); }
  const Quorum& quorum() const { return quorum_; }
  // Committed steps run with fewer replicas than the world size.
  int64_t steps_with_fewer() const { return steps_with_fewer_; }
  // Steps run again after a failure.
  int64_t steps_retried() const { return steps_retried_; }
  // The members of every step applied, from the job's first (a joiner
  // receives it with the state).
  const std::vector<std::vector<int>>& history() const { return history_; }
  // Membership changes this replica saw (with the lost and joined ranks).
  const std::vector<Change>& changes() const { return changes_; }

 private:
  void Request(Vote vote);
  // Null when the others finished training (a replica left normally).
  std::optional<Quorum> AwaitAnswer();
  void Enter(const Quorum& quorum);
  void Connect(const Quorum& quorum);
  void DropCommunicator();
  void Recover();
  void Report();
  void Beat();
  void Heartbeat();
  void Inject(Point point);
  std::string Where() const;

  const ReplicaOptions options_;
  const std::shared_ptr<Store> store_;  // Under "ft/".
  const std::string incarnation_;
  std::unique_ptr<Lighthouse> lighthouse_;
  QuorumRequest last_request_;
  bool answer_pending_ = false;
  // Whether this replica holds the run's state (it was a quorum's source,
  // or loaded the state); a replica that is not is sent it again.
  bool in_sync_ = false;
  // Set when this replica must go to a round before its next step: its
  // vote (kNone: it is joining, or its last round failed).
  std::optional<Vote> round_ = Vote::kNone;
  Quorum quorum_;      // The one entered (no members before).
  int64_t calls_ = 0;  // Summed with the gradients (see AllreduceAndCommit).
  std::vector<Member> previous_members_;
  int64_t step_ = 0;
  int64_t steps_with_fewer_ = 0;
  int64_t steps_retried_ = 0;
  std::vector<std::vector<int>> history_;
  std::vector<Change> changes_;
  const std::chrono::steady_clock::time_point started_;
  std::chrono::steady_clock::time_point failed_at_{};
  int64_t state_bytes_ = 0;  // The last state sent or received.
  double state_seconds_ = 0;

  // comm_, comm_quorum_, called_ and stopping_: the heartbeat thread
  // passes the lighthouse's calls on (and aborts the collectives).
  std::mutex comm_mutex_;
  std::unique_ptr<Communicator> comm_;
  int64_t comm_quorum_ = -1;
  bool called_ = false;  // The lighthouse called comm_quorum_ to a round.
  bool stopping_ = false;
  int64_t beats_ = 0;  // The heartbeat thread's (the first before it).
  std::condition_variable stop_beating_;
  std::thread heartbeat_;
};

// The members of each step, one line each ("0,1,3"), as a joiner receives
// them with the state.
std::string EncodeHistory(const std::vector<std::vector<int>>& history);
std::vector<std::vector<int>> DecodeHistory(const std::string& text);

}  // namespace accel::ft
