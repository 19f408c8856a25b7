// The watchdog of a Communicator, on a thread of its own: it publishes what
// this rank is doing (and a heartbeat) to the store, and once a collective
// has waited a while looks at the other ranks. A rank that left the job,
// or whose machine stopped answering, or another collective on another
// rank (CollectiveChecks) makes it abort the running operation through the
// callback, with a verdict the failure then reports. After any failure,
// Diagnose() says what every rank was doing, for the caller's error.
//
//   Watchdog watchdog(context, store, [&] { transport.Abort(); });
//   watchdog.Running(op);            // the queue, before and after each op
//   ... transport.RunAllreduce(op, ...) fails ...
//   watchdog.Finished(op, /*succeeded=*/false);
//   if (auto verdict = watchdog.TakeVerdict()) ... else watchdog.Diagnose(...)
//
// Its store requests are bounded by a short timeout of their own and share
// no lock with the collectives, so a stopped rank 0 (which hosts the store)
// delays nothing. Horovod keeps its StallInspector apart from the
// controller likewise; tests drive this class over a fake transport.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "accel/runtime/comm/collective_checks.h"
#include "accel/runtime/comm/rank_status.h"
#include "accel/runtime/comm/transport.h"
#include "accel/runtime/store/store.h"

namespace accel {

class Watchdog {
 public:
  // Why the watchdog aborted the running operation.
  struct Verdict {
    enum class Kind { kMismatch, kDeparted, kInterrupted };
    Kind kind;
    std::string reason;  // "ranks called different collectives: ...".
    int rank = -1;       // The rank that left (or interrupted), if known.
  };

  // `store` null, or one rank: no thread, and Diagnose() knows only this
  // rank. `abort` is called from the watchdog's thread.
  Watchdog(const BackendContext& context, std::shared_ptr<Store> store,
           std::function<void()> abort);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The queue says what this rank runs. `succeeded`: the call completed
  // here (a lower bound on every rank's progress, see Completed).
  void Running(const Transport::Op& op);
  void Finished(const Transport::Op& op, bool succeeded);

  // Makes the collectives of every rank that wait (from check_after on)
  // fail with a kInterrupted verdict naming this rank and `reason`.
  void Interrupt(const std::string& reason);

  // Whether a rank interrupted the collectives: a kInterrupted verdict.
  // For a failure without a verdict (the interrupting rank may have closed
  // its connections before this rank's watchdog looked).
  std::optional<Verdict> ReadInterruption();

  // The verdict behind an abort of the operation `sequence`, once.
  std::optional<Verdict> TakeVerdict();

  // The error for operation `op`, which failed with `e` and no verdict:
  // a mismatch another rank found, who left, or at a timeout what each
  // rank is doing. `what` is the message's prefix.
  std::exception_ptr Diagnose(const std::string& what, const Transport::Op& op,
                              const std::exception& e);

  const CollectiveChecks& checks() const { return checks_; }

 private:
  // The last collective that completed here and needed every rank, so
  // every rank has called it: a lower bound on each rank's progress that
  // holds even when a stopped rank could not publish.
  struct Completed {
    uint64_t sequence = 0;
    std::string api;
    std::string site;
  };
  struct Observation {
    uint64_t beat = 0;
    std::chrono::steady_clock::time_point since;  // When beat last changed.
    bool seen = false;
  };
  // Statuses of every rank, or why the store (rank 0) could not tell.
  struct Picture {
    std::vector<RankStatus> statuses;
    enum class Store { kAnswered, kLost, kUnreachable, kNotAnswering };
    Store store = Store::kAnswered;
    std::string store_problem;
  };

  void SetStatus(const Transport::Op& op, bool running, bool succeeded);
  RankStatus Mine();
  std::vector<RankStatus> ReadStatuses(const RankStatus& mine);
  Picture TakePicture(const RankStatus& mine);
  // "; ranks 0, 1 run on rank 0's machine (2 ranks per machine)".
  std::string RanksWithRank0() const;
  // "rank 1 is in gather #12 (train.cc:75)" for every other rank.
  std::string DescribeRanks(const std::vector<RankStatus>& statuses,
                            const RankStatus& mine, bool only_differing) const;
  // "rank 3", or "rank 4 (1 of group tp)" in a subgroup.
  std::string Name(int rank) const { return RankName(naming_, rank); }
  // After a broken connection: the departed ranks, once the store knows.
  std::string AwaitDepartures(int* failed_rank);
  void Loop();
  // One look at the others once a call has waited check_after.
  void Check(const RankStatus& mine);

  const int rank_;
  const int size_;
  const int local_size_;
  const BackendContext naming_;  // For Name(): the group and its job ranks.
  const CommunicatorOptions options_;
  const CollectiveChecks checks_;
  const std::shared_ptr<Store> store_;
  const std::function<void()> abort_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  RankStatus status_;
  CallSite status_site_;  // status_.site, formatted only when it changes.
  uint64_t status_version_ = 0;
  std::chrono::steady_clock::time_point running_since_;
  Completed last_completed_;
  std::vector<Observation> observations_;
  std::optional<Verdict> verdict_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace accel
