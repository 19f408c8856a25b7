#include "accel/runtime/comm/watchdog.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

using Clock = std::chrono::steady_clock;

// How long a rank that saw a broken connection waits for the store to notice
// which process went away: the data path usually fails first.
constexpr auto kDepartureGrace = std::chrono::milliseconds(2000);

// A rank whose heartbeat has not changed for this many intervals is silent.
constexpr int kSilentAfterBeats = 4;

// Collectives that cannot complete on one rank before every rank called
// them (a broadcast completes on a rank once the root has sent).
bool NeedsEveryRank(const char* name) {
  return std::strcmp(name, "broadcast") != 0;
}

std::string Seconds(Clock::duration d) {
  const auto tenths =
      std::chrono::duration_cast<std::chrono::milliseconds>(d).count() / 100;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " s";
}

// Set by Watchdog::Interrupt: "<rank>\n<reason>".
constexpr const char* kInterruptionKey = "interrupted";

// When several ranks left, the one to blame: one that did not simply exit.
void Blame(int rank, const Departure& how, int* failed_rank) {
  if (*failed_rank < 0 || how.failure()) *failed_rank = rank;
}

}  // namespace

Watchdog::Watchdog(const BackendContext& context, std::shared_ptr<Store> store,
                   std::function<void()> abort)
    : rank_(context.rank),
      size_(context.size),
      local_size_(std::max(1, context.local_size)),
      naming_{.rank = context.rank,
              .size = context.size,
              .group = context.group,
              .job_ranks = context.job_ranks},
      options_(context.options),
      checks_(context.options.check_collectives),
      store_(std::move(store)),
      abort_(std::move(abort)),
      observations_(context.size) {
  if (store_ != nullptr && size_ > 1) thread_ = std::thread([this] { Loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::Running(const Transport::Op& op) {
  SetStatus(op, /*running=*/true, /*succeeded=*/false);
}

void Watchdog::Finished(const Transport::Op& op, bool succeeded) {
  SetStatus(op, /*running=*/false, succeeded);
}

void Watchdog::SetStatus(const Transport::Op& op, bool running,
                         bool succeeded) {
  std::lock_guard<std::mutex> lock(mutex_);
  status_.known = true;
  status_.sequence = op.sequence;
  status_.running = running;
  // Finishing an op follows its start, which wrote what it is. Assignments
  // reuse the strings' storage: nothing allocates per call.
  if (running) {
    status_.api.assign(op.api);
    status_.signature.assign(op.signature);
    if (op.site.file != status_site_.file ||
        op.site.line != status_site_.line) {
      status_site_ = op.site;
      status_.site = op.site.ToString();
    }
  }
  ++status_version_;
  if (running) {
    running_since_ =
        op.started == Clock::time_point{} ? Clock::now() : op.started;
  } else if (succeeded && NeedsEveryRank(op.name)) {
    last_completed_.sequence = op.sequence;
    last_completed_.api.assign(op.api);
    last_completed_.site.assign(status_.site);
  }
}

RankStatus Watchdog::Mine() {
  std::lock_guard<std::mutex> lock(mutex_);
  return status_;
}

std::optional<Watchdog::Verdict> Watchdog::TakeVerdict() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::optional<Verdict> verdict = std::move(verdict_);
  verdict_.reset();
  return verdict;
}

std::vector<RankStatus> Watchdog::ReadStatuses(const RankStatus& mine) {
  std::vector<RankStatus> statuses(size_);
  statuses[rank_] = mine;
  if (store_ == nullptr) return statuses;
  const std::map<int, Departure> departed = store_->departures();
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (auto text = store_->try_get(RankStatusKey(r))) {
      statuses[r] = DecodeRankStatus(*text);
    }
    auto it = departed.find(r);
    if (it != departed.end()) statuses[r].departed = it->second;
  }
  // A rank whose heartbeat stands still is stopped, overloaded or cut off.
  const auto now = Clock::now();
  const auto silent_after = kSilentAfterBeats * options_.heartbeat_interval;
  std::lock_guard<std::mutex> lock(mutex_);
  for (int r = 0; r < size_; ++r) {
    RankStatus& s = statuses[r];
    if (r == rank_ || !s.published) continue;
    Observation& seen = observations_[r];
    if (!seen.seen || seen.beat != s.beat) {
      seen = {s.beat, now, true};
    } else if (now - seen.since >= silent_after) {
      s.silent = true;
      s.silent_for = now - seen.since;
    }
  }
  return statuses;
}

Watchdog::Picture Watchdog::TakePicture(const RankStatus& mine) {
  Picture picture;
  try {
    picture.statuses = ReadStatuses(mine);
    return picture;
  } catch (const UnreachableError& e) {
    picture.store = Picture::Store::kUnreachable;
    picture.store_problem = e.what();
  } catch (const PeerError& e) {
    picture.store = Picture::Store::kLost;
    picture.store_problem = e.what();
  } catch (const std::exception& e) {
    picture.store = Picture::Store::kNotAnswering;
    picture.store_problem = e.what();
  }
  picture.statuses.assign(size_, RankStatus());
  picture.statuses[rank_] = mine;
  return picture;
}

std::string Watchdog::RanksWithRank0() const {
  if (local_size_ >= size_ || local_size_ <= 1) return "";
  std::string text = "; ranks 0";
  for (int r = 1; r < local_size_; ++r) text += ", " + std::to_string(r);
  return text + " run on rank 0's machine (" + std::to_string(local_size_) +
         " ranks per machine)";
}

std::string Watchdog::DescribeRanks(const std::vector<RankStatus>& statuses,
                                    const RankStatus& mine,
                                    bool only_differing) const {
  Completed completed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed = last_completed_;
  }
  std::string others;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const RankStatus& s = statuses[r];
    const bool same = s.known && s.running && !s.departed && !s.silent &&
                      s.sequence == mine.sequence &&
                      s.signature == mine.signature;
    if (only_differing && same) continue;
    // Every rank called the last collective that needed all of them, even
    // one stopped before it could publish that.
    RankStatus last = s;
    if (completed.sequence > 0 &&
        (!s.known || s.sequence < completed.sequence)) {
      last.known = true;
      last.running = false;
      last.sequence = completed.sequence;
      last.api = completed.api;
      last.site = completed.site;
    }
    std::string text = Name(r) + " ";
    if (s.departed && checks_.Differs(s, mine)) {
      text += "is in " + DescribeCall(s) + " [" + s.signature +
              "]; it has left the job since (" + s.departed->ToString() + ")";
    } else if (s.departed) {
      text = DescribeDeparture(Name(r), *s.departed);
    } else if (s.silent) {
      text += "is not responding (its status has not changed for " +
              Seconds(s.silent_for) +
              ": stopped, overloaded, or its machine is unreachable); " +
              (last.known ? "its last call was " + DescribeCall(last)
                          : std::string("it has not called a collective"));
    } else if (!last.known) {
      text += "has not called a collective yet";
    } else if (last.running) {
      text += "is in " + DescribeCall(last) + " [" + last.signature + "]";
    } else if (last.sequence == mine.sequence) {
      // It left this very call (it failed first): say what it called.
      text += "left " + DescribeCall(last) + " [" + last.signature + "]";
    } else {
      text +=
          "is not in a collective (its last was " + DescribeCall(last) + ")";
    }
    others += (others.empty() ? "" : ", ") + text;
  }
  if (others.empty()) return "";
  return others + " while " + Name(rank_) + " waits in " + DescribeCall(mine) +
         " [" + mine.signature + "]";
}

std::string Watchdog::AwaitDepartures(int* failed_rank) {
  if (store_ == nullptr) return "";
  const auto deadline = Clock::now() + kDepartureGrace;
  try {
    while (true) {
      std::map<int, Departure> departed = store_->departures();
      departed.erase(rank_);
      if (!departed.empty()) {
        std::string text;
        for (const auto& [rank, how] : departed) {
          Blame(rank, how, failed_rank);
          text +=
              (text.empty() ? "" : ", ") + DescribeDeparture(Name(rank), how);
        }
        return text;
      }
      if (Clock::now() >= deadline) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const PeerError& e) {
    *failed_rank = 0;
    return e.what();
  } catch (const Error&) {
    return "";  // Not answering: the timeout's message says so.
  }
}

void Watchdog::Interrupt(const std::string& reason) {
  if (store_ == nullptr || size_ == 1) return;
  store_->set(kInterruptionKey, std::to_string(rank_) + "\n" + reason);
}

std::optional<Watchdog::Verdict> Watchdog::ReadInterruption() {
  if (store_ == nullptr || size_ == 1) return std::nullopt;
  std::optional<std::string> value;
  try {
    value = store_->try_get(kInterruptionKey);
  } catch (const std::exception&) {
    return std::nullopt;  // TakePicture reports what matters about the store.
  }
  if (!value) return std::nullopt;
  const size_t newline = value->find('\n');
  const int rank = std::atoi(value->substr(0, newline).c_str());
  const std::string reason =
      newline == std::string::npos ? "" : value->substr(newline + 1);
  return Verdict{
      Verdict::Kind::kInterrupted,
      Name(rank) + " interrupted the collectives of every rank: " + reason,
      rank};
}

void Watchdog::Check(const RankStatus& mine) {
  if (std::optional<Verdict> interruption = ReadInterruption()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (status_.sequence != mine.sequence || !status_.running) return;
      verdict_ = std::move(interruption);
    }
    abort_();
    return;
  }
  const Picture picture = TakePicture(mine);
  std::string reason;
  bool mismatch = false;
  int departed = -1;
  if (picture.store == Picture::Store::kLost ||
      picture.store == Picture::Store::kUnreachable) {
    // The store's host (rank 0) is gone: nothing can complete.
    departed = 0;
    reason =
        picture.store_problem +
        (picture.store == Picture::Store::kUnreachable ? RanksWithRank0() : "");
  } else if (picture.store == Picture::Store::kAnswered) {
    for (int r = 0; r < size_; ++r) {
      const RankStatus& s = picture.statuses[r];
      if (s.departed && departed < 0) departed = r;
      mismatch |= checks_.Differs(s, mine);
    }
    if (mismatch || departed >= 0) {
      reason =
          (mismatch ? "ranks called different collectives: " : std::string()) +
          DescribeRanks(picture.statuses, mine, /*only_differing=*/true);
    }
  }
  if (reason.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (status_.sequence != mine.sequence || !status_.running) return;
    verdict_ =
        Verdict{mismatch ? Verdict::Kind::kMismatch : Verdict::Kind::kDeparted,
                reason, departed};
  }
  abort_();
}

void Watchdog::Loop() {
  uint64_t published = 0;
  uint64_t beat = 0;
  Clock::time_point last_publish;
  uint64_t checked_sequence = 0;
  auto next_check = Clock::time_point::max();
  const auto wake_every =
      std::min(options_.status_interval, options_.heartbeat_interval);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    changed_.wait_for(lock, wake_every);
    if (stopping_) break;
    RankStatus mine = status_;
    const uint64_t version = status_version_;
    const auto since = running_since_;
    // No lock is held across a store request: one that waits on a stopped
    // rank 0 delays only this thread, and only by its own short timeout.
    lock.unlock();
    const auto now = Clock::now();
    if ((checks_.enabled() && version != published) ||
        now - last_publish >= options_.heartbeat_interval) {
      mine.beat = ++beat;
      try {
        store_->set(RankStatusKey(rank_), EncodeRankStatus(mine));
        published = version;
        last_publish = now;
      } catch (const std::exception&) {
        // The checks below report what matters about the store.
      }
    }
    if (mine.running && mine.sequence != checked_sequence) {
      checked_sequence = mine.sequence;
      next_check = since + options_.check_after;
    }
    if (mine.running && mine.sequence == checked_sequence &&
        now >= next_check) {
      next_check = now + options_.check_after;
      Check(mine);
    }
    lock.lock();
  }
}

std::exception_ptr Watchdog::Diagnose(const std::string& what,
                                      const Transport::Op& op,
                                      const std::exception& e) {
  const bool timed_out = dynamic_cast<const TimeoutError*>(&e) != nullptr;
  const auto* peer = dynamic_cast<const PeerError*>(&e);
  RankStatus mine = Mine();
  mine.running = true;
  const Picture picture =
      store_ != nullptr && size_ > 1 ? TakePicture(mine) : Picture{};
  if (picture.store == Picture::Store::kAnswered) {
    for (const RankStatus& s : picture.statuses) {
      // A peer that found the mismatch first aborted, which is what failed
      // here: report the cause, not the closed connection.
      if (checks_.Differs(s, mine)) {
        return std::make_exception_ptr(UsageError(
            what + "ranks called different collectives: " +
            DescribeRanks(picture.statuses, mine, /*only_differing=*/true)));
      }
    }
  }
  if (!timed_out && peer == nullptr) {
    return std::make_exception_ptr(Error(what + e.what()));
  }
  int failed_rank = peer != nullptr ? peer->failed_rank() : -1;
  std::string departed;
  if (picture.store == Picture::Store::kLost ||
      picture.store == Picture::Store::kUnreachable) {
    departed = picture.store_problem;
    failed_rank = 0;
  } else if (picture.store == Picture::Store::kAnswered) {
    for (int r = 0; r < static_cast<int>(picture.statuses.size()); ++r) {
      const std::optional<Departure>& how = picture.statuses[r].departed;
      if (!how) continue;
      Blame(r, *how, &failed_rank);
      departed +=
          (departed.empty() ? "" : ", ") + DescribeDeparture(Name(r), *how);
    }
    if (departed.empty() && peer != nullptr) {
      departed = AwaitDepartures(&failed_rank);
    }
  }
  if (timed_out && departed.empty()) {
    const std::string ranks =
        picture.store == Picture::Store::kAnswered
            ? DescribeRanks(picture.statuses, mine, /*only_differing=*/false)
            : picture.store_problem;
    return std::make_exception_ptr(TimeoutError(
        what + "timed out after " + std::to_string(op.timeout.count()) + " ms" +
        (ranks.empty() ? "" : ": " + ranks) + " (" + e.what() + ")"));
  }
  return std::make_exception_ptr(PeerError(
      what + (departed.empty() ? "a peer failed" : departed) + ": " + e.what(),
      failed_rank));
}

}  // namespace accel
