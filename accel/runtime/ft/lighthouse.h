// The lighthouse of a fault-tolerant job: forms the quorum of every step
// from the replicas' requests, as torchft's Lighthouse does, but inside the
// process that hosts the job's store (rank 0), over the store itself.
//
//   auto store = std::make_shared<accel::PrefixStore>("ft", job_store);
//   accel::ft::Lighthouse lighthouse(store, {.world_size = 4});
//   ... the replicas (replica.h) train; the lighthouse answers them ...
//
// The members train without asking it anything while nothing changes: each
// step's sum carries one more number, the count of members whose
// heartbeat thread saw the lighthouse call a round (ChangeKey), so that
// every member learns it at the same step and comes. It calls one when a
// replacement asks to join, when a member is lost, or when a member's sum
// failed (a member is lost when the store saw its process go, when
// another process took its rank, or when its heartbeat stopped for
// heartbeat_timeout: a stopped or hung process); then it also aborts the
// others' collectives, which may wait on the lost one. A round ends when
// every member still alive has come:
//   - the members that applied the most steps hold the run's state (each
//     applies a step when its own sum completed, and every completed sum
//     is the same), and the lowest-ranked of them sends it to the others
//     and to the replicas that asked to join;
//   - the new quorum gets a new id, and new connections.
// The job stops (every member's request is answered with the reason) when
// fewer than min_replicas would remain, so that a partitioned job never
// goes on as two.
//
// The first quorum waits for every rank, or for join_timeout after the
// first request when at least min_replicas came.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "accel/runtime/ft/quorum.h"
#include "accel/runtime/store/store.h"

namespace accel::ft {

struct LighthouseOptions {
  int world_size = 1;  // Ranks the job was started with.
  // Fewest replicas that may train on; 0: half the world size, rounded up
  // (2 of 4, 2 of 3), so that two halves of a split cannot both go on.
  int min_replicas = 0;
  std::chrono::milliseconds join_timeout = std::chrono::seconds(60);
  std::chrono::milliseconds heartbeat_timeout = std::chrono::seconds(3);
  // How often it looks at the members without a request (their liveness).
  std::chrono::milliseconds poll = std::chrono::milliseconds(100);
};

class Lighthouse {
 public:
  // `store`: the job's store under the replicas' prefix. Starts a thread.
  Lighthouse(std::shared_ptr<Store> store, LighthouseOptions options);
  ~Lighthouse();
  Lighthouse(const Lighthouse&) = delete;
  Lighthouse& operator=(const Lighthouse&) = delete;

  // Why it stopped the job ("" while it runs).
  std::string stopped() const;

 private:
  struct Pending {
    QuorumRequest request;
    int rank;
  };
  void Loop();
  void Scan();
  void Decide();
  void FormFirst();
  // Ends the round: answers the members and the joiners.
  void EndRound(const std::vector<Member>& ready,
                const std::vector<Member>& joiners);
  void Answer(int rank, const QuorumRequest& request, const Quorum& quorum);
  // Calls the members of the current quorum to a round (ChangeKey): level
  // 1 at their next step, 2 at once (their collectives are aborted).
  void Call(int level, const std::string& why);
  void Stop(const std::string& reason);
  bool Alive(const Member& member);
  void ReadLiveness();
  int MinReplicas() const;

  const std::shared_ptr<Store> store_;
  const LighthouseOptions options_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};

  mutable std::mutex mutex_;  // stop_.
  std::string stop_;

  // The loop's own (one thread).
  int64_t next_bell_ = 1;
  std::map<int, Pending> pending_;       // By rank: the latest request.
  std::map<int, std::string> answered_;  // By rank: "<inc>/<serial>".
  Quorum quorum_;                        // The current one (no members yet).
  std::optional<std::chrono::steady_clock::time_point> first_request_;
  struct Beat {
    std::string value;
    std::chrono::steady_clock::time_point changed;
  };
  std::map<int, Beat> beats_;
  std::chrono::steady_clock::time_point beats_read_{};
  std::map<int, Departure> departed_;
  bool liveness_read_ = false;
  std::vector<Member> dropped_;  // Lost members of the current quorum.
  int64_t called_id_ = -1;       // The last quorum Call()ed, and how.
  int called_level_ = 0;
};

}  // namespace accel::ft
