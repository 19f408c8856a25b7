#include "accel/runtime/ft/lighthouse.h"

#include <algorithm>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"

namespace accel::ft {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kBeatReadInterval = std::chrono::milliseconds(500);

std::string Tag(const QuorumRequest& request) {
  return request.incarnation + "/" + std::to_string(request.serial);
}

std::vector<int> RanksOf(const std::vector<Member>& members) {
  std::vector<int> ranks;
  for (const Member& member : members) ranks.push_back(member.rank);
  return ranks;
}

}  // namespace

Lighthouse::Lighthouse(std::shared_ptr<Store> store, LighthouseOptions options)
    : store_(std::move(store)), options_(options) {
  if (options_.world_size < 1) {
    throw UsageError(
        "fault tolerance: the world size must be at least 1, "
        "found " +
        std::to_string(options_.world_size));
  }
  if (options_.min_replicas < 0 ||
      options_.min_replicas > options_.world_size) {
    throw UsageError(
        "fault tolerance: min_replicas must be between 1 and the "
        "world size (" +
        std::to_string(options_.world_size) + "), found " +
        std::to_string(options_.min_replicas));
  }
  thread_ = std::thread([this] { Loop(); });
}

Lighthouse::~Lighthouse() {
  stopping_ = true;
  thread_.join();
}

std::string Lighthouse::stopped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stop_;
}

int Lighthouse::MinReplicas() const {
  return options_.min_replicas > 0 ? options_.min_replicas
                                   : (options_.world_size + 1) / 2;
}

void Lighthouse::Loop() {
  while (!stopping_) {
    try {
      try {
        store_->wait({BellKey(next_bell_)}, options_.poll);
      } catch (const TimeoutError&) {
        // Look at the members anyway: one may have gone quiet.
      }
      // A requester that died between its request and its bell leaves
      // that bell unrung: the counter says whether any came.
      const int64_t rung = store_->add(kBellCounter, 0);
      if (rung >= next_bell_) {
        next_bell_ = rung + 1;
        Scan();
      }
      liveness_read_ = false;
      Decide();
    } catch (const Error& e) {
      // The store is going away with its process: nobody is left to answer.
      if (!stopping_) ACCEL_LOG(ERROR) << "fault tolerance: " << e.what();
      return;
    }
  }
}

void Lighthouse::Scan() {
  for (int rank = 0; rank < options_.world_size; ++rank) {
    const std::optional<std::string> text = store_->try_get(RequestKey(rank));
    if (!text) continue;
    QuorumRequest request = QuorumRequest::Decode(*text);
    if (answered_[rank] == Tag(request)) continue;
    pending_[rank] = {std::move(request), rank};
    if (!first_request_) first_request_ = Clock::now();
  }
}

void Lighthouse::ReadLiveness() {
  if (liveness_read_) return;
  liveness_read_ = true;
  departed_ = store_->departures();
  // Heartbeats less often than departures: they only tell a silence of
  // heartbeat_timeout, and each read costs the training processes CPU.
  const auto now = Clock::now();
  if (now - beats_read_ < kBeatReadInterval) return;
  beats_read_ = now;
  for (int rank = 0; rank < options_.world_size; ++rank) {
    const std::string beat = store_->try_get(HeartbeatKey(rank)).value_or("");
    Beat& known = beats_[rank];
    if (beat != known.value) known = {beat, now};
  }
}

bool Lighthouse::Alive(const Member& member) {
  ReadLiveness();
  if (departed_.count(member.rank) != 0) return false;
  Beat& beat = beats_[member.rank];
  const std::string mine = member.incarnation + ":";
  if (beat.value.rfind(mine, 0) != 0) {
    // Read it again: a new process's beats may be newer than the last read.
    const std::string value =
        store_->try_get(HeartbeatKey(member.rank)).value_or("");
    if (value != beat.value) beat = {value, Clock::now()};
  }
  // Another process took the rank: this one is gone.
  if (beat.value.rfind(mine, 0) != 0) {
    // Not beating yet (it just started): alive while its request is fresh.
    return beat.value.empty();
  }
  return Clock::now() - beat.changed < options_.heartbeat_timeout;
}

void Lighthouse::Decide() {
  if (!stop_.empty()) {
    for (const auto& [rank, pending] : pending_) {
      Answer(rank, pending.request, Quorum{.stop = stop_});
    }
    pending_.clear();
    return;
  }
  if (quorum_.members.empty()) {
    FormFirst();
    return;
  }
  std::vector<Member> ready;
  std::vector<Member> stale;
  std::vector<Member> lost;
  bool running = false;
  bool failed = false;  // A member's sum failed while others' may not have.
  for (const Member& member : quorum_.members) {
    auto it = pending_.find(member.rank);
    const bool was_dropped =
        std::find(dropped_.begin(), dropped_.end(), member) != dropped_.end();
    if (!was_dropped && it != pending_.end() &&
        it->second.request.incarnation == member.incarnation) {
      // A member whose state transfer failed is sent the state again.
      (it->second.request.in_sync ? ready : stale).push_back(member);
      failed = failed || it->second.request.vote != Vote::kOk;
    } else if (was_dropped || !Alive(member)) {
      // Lost for the rest of this quorum: one that was stopped and comes
      // back before the round ends joins again and takes the state, rather
      // than holding the others to its pace.
      lost.push_back(member);
      if (!was_dropped) dropped_.push_back(member);
    } else {
      running = true;  // Still training.
    }
  }
  std::vector<Member> joiners = stale;
  for (const auto& [rank, pending] : pending_) {
    const Member member{rank, pending.request.incarnation};
    if (std::find(ready.begin(), ready.end(), member) != ready.end()) continue;
    if (std::find(stale.begin(), stale.end(), member) != stale.end()) continue;
    if (Alive(member)) joiners.push_back(member);
  }
  // A dropped member that asked meanwhile is a joiner (it takes the state).
  for (const Member& member : dropped_) {
    auto it = pending_.find(member.rank);
    if (it != pending_.end() &&
        it->second.request.incarnation == member.incarnation &&
        std::find(joiners.begin(), joiners.end(), member) == joiners.end()) {
      joiners.push_back(member);
    }
  }
  if (running) {
    // Call the others to a round. They may wait on the lost ones, or on a
    // member whose sum failed, in a collective that cannot fail by itself
    // (a stopped process keeps its connections open; shared memory has
    // none): then their collectives are aborted too.
    if (!lost.empty()) {
      Call(2, "rank" + std::string(lost.size() > 1 ? "s " : " ") +
                  RankList(RanksOf(lost)) + " left or stopped responding");
    } else if (failed || !stale.empty()) {
      Call(2, "a member's step failed");
    } else if (!joiners.empty() || !ready.empty()) {
      Call(1, joiners.empty() ? std::string("members asked for a round")
                              : RankList(RanksOf(joiners)) + " asked to join");
    }
    return;
  }
  EndRound(ready, joiners);
}

void Lighthouse::Call(int level, const std::string& why) {
  if (called_id_ == quorum_.id && called_level_ >= level) return;
  called_id_ = quorum_.id;
  called_level_ = level;
  store_->set(ChangeKey(quorum_.id), (level >= 2 ? "abort " : "join ") + why);
}

void Lighthouse::FormFirst() {
  const int arrived = static_cast<int>(pending_.size());
  const bool everyone = arrived == options_.world_size;
  const bool waited =
      first_request_ && Clock::now() - *first_request_ >= options_.join_timeout;
  if (!everyone && !(waited && arrived >= MinReplicas())) {
    if (waited && arrived < MinReplicas()) {
      Stop(std::to_string(arrived) + " of " +
           std::to_string(options_.world_size) + " replicas arrived within " +
           std::to_string(options_.join_timeout.count() / 1000) +
           " s, fewer than the " + std::to_string(MinReplicas()) +
           " needed to start");
    }
    return;
  }
  // The lowest rank's state (and step) becomes everyone's, as DDP
  // broadcasts rank 0's parameters at the start.
  std::vector<Member> joiners;
  for (const auto& [rank, pending] : pending_) {
    joiners.push_back({rank, pending.request.incarnation});
  }
  quorum_.step = pending_.begin()->second.request.step;
  EndRound({}, joiners);
}

void Lighthouse::EndRound(const std::vector<Member>& ready,
                          const std::vector<Member>& joiners) {
  const Quorum previous = quorum_;
  const bool first = previous.members.empty();
  if (ready.empty() && !first) {
    Stop("every replica that held the model's state was lost (" +
         RankList(previous.Ranks()) + ")");
    Decide();
    return;
  }
  Quorum next;
  next.members = ready;
  next.members.insert(next.members.end(), joiners.begin(), joiners.end());
  std::sort(next.members.begin(), next.members.end(),
            [](const Member& a, const Member& b) { return a.rank < b.rank; });
  const int count = static_cast<int>(next.members.size());
  if (count < MinReplicas()) {
    Stop("only " + std::to_string(count) + " of " +
         std::to_string(options_.world_size) + " replicas are left (" +
         RankList(RanksOf(next.members)) + "), fewer than " +
         std::to_string(MinReplicas()) +
         ": stopping rather than risk two halves of the job going on apart");
    Decide();
    return;
  }
  // Each member applied the steps whose sums completed on it: those that
  // applied the most hold the run's state (every completed sum is the same
  // sum), and the others take it from the lowest-ranked of them.
  if (first) {
    next.source = next.members.front().rank;
    next.step = pending_[next.source].request.step;
  } else {
    next.step = -1;
    for (const Member& member : ready) {
      const int64_t step = pending_[member.rank].request.step;
      if (step > next.step) {
        next.step = step;
        next.source = member.rank;
      }
    }
  }
  for (const Member& member : next.members) {
    const bool holds =
        !first && pending_[member.rank].request.in_sync &&
        pending_[member.rank].request.step == next.step &&
        std::find(joiners.begin(), joiners.end(), member) == joiners.end();
    if (member.rank != next.source && !holds) {
      next.recovering.push_back(member.rank);
    }
  }
  next.id = previous.id + 1;
  ACCEL_VLOG(1) << "fault tolerance: quorum " << next.id << " at step "
                << next.step << ": " << RankList(next.Ranks())
                << (next.recovering.empty()
                        ? ""
                        : ", sending rank " + std::to_string(next.source) +
                              "'s state to " + RankList(next.recovering));
  quorum_ = next;
  dropped_.clear();
  for (const Member& member : next.members) {
    Answer(member.rank, pending_[member.rank].request, next);
    pending_.erase(member.rank);
  }
}

void Lighthouse::Answer(int rank, const QuorumRequest& request,
                        const Quorum& quorum) {
  store_->set(AnswerKey(rank, request), quorum.Encode());
  answered_[rank] = Tag(request);
}

void Lighthouse::Stop(const std::string& reason) {
  ACCEL_LOG(ERROR) << "fault tolerance: " << reason;
  std::lock_guard<std::mutex> lock(mutex_);
  stop_ = reason;
}

}  // namespace accel::ft
