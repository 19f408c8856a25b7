#include "accel/runtime/ft/replica.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"
#include "accel/runtime/base/random_hex.h"
#include "accel/runtime/comm/registry.h"

namespace accel::ft {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kFinishedKey[] = "finished";
constexpr std::chrono::milliseconds kAnswerSlice(500);

double SecondsSince(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

void SetLast(const Buffer& buffer, double value) {
  if (buffer.dtype == DType::kFloat32) {
    static_cast<float*>(buffer.data)[buffer.count - 1] =
        static_cast<float>(value);
  } else {
    static_cast<double*>(buffer.data)[buffer.count - 1] = value;
  }
}

double GetLast(const Buffer& buffer) {
  return buffer.dtype == DType::kFloat32
             ? static_cast<const float*>(buffer.data)[buffer.count - 1]
             : static_cast<const double*>(buffer.data)[buffer.count - 1];
}

}  // namespace

const char* PointName(Point point) {
  switch (point) {
    case Point::kBeforeAllreduce:
      return "before the allreduce";
    case Point::kDuringAllreduce:
      return "during the allreduce";
    case Point::kAfterAllreduce:
      return "after the allreduce";
    case Point::kDuringRecovery:
      return "during recovery";
  }
  return "?";
}

Replica::Replica(ReplicaOptions options)
    : options_(std::move(options)),
      store_(options_.store
                 ? std::make_shared<PrefixStore>("ft", options_.store)
                 : nullptr),
      incarnation_(RandomHex(8)),
      step_(options_.start_step),
      started_(Clock::now()) {
  if (!store_) throw UsageError("fault tolerance: the replica has no store");
  if (options_.world_size < 1 || options_.rank < 0 ||
      options_.rank >= options_.world_size) {
    throw UsageError("fault tolerance: rank " + std::to_string(options_.rank) +
                     " is not one of the " +
                     std::to_string(options_.world_size) + " ranks");
  }
  if (!options_.save_state || !options_.load_state) {
    throw UsageError(
        "fault tolerance: save_state and load_state are needed: a joining "
        "replica takes the state from a live one");
  }
  if (options_.lighthouse) {
    LighthouseOptions lighthouse = *options_.lighthouse;
    lighthouse.world_size = options_.world_size;
    lighthouse_ = std::make_unique<Lighthouse>(store_, lighthouse);
  }
  Beat();  // Before the first request: the lighthouse knows this process.
  heartbeat_ = std::thread([this] { Heartbeat(); });
}

Replica::~Replica() {
  // Leaving at the end of training, not in an exception: a replacement
  // that comes after this is told the job has finished.
  if (std::uncaught_exceptions() == 0 && in_sync_) {
    try {
      store_->set(kFinishedKey, std::to_string(step_));
    } catch (const Error&) {
      // The store's host already left: nobody is there to join.
    }
  }
  {
    std::lock_guard<std::mutex> lock(comm_mutex_);
    stopping_ = true;
  }
  stop_beating_.notify_all();
  heartbeat_.join();
  // A replica destroyed in a collective (an exception went through it)
  // must not hold the others there until the timeout.
  if (comm_) comm_->transport().RequestAbort();
  comm_.reset();
}

std::string Replica::Where() const {
  return "fault tolerance: rank " + std::to_string(options_.rank) + ": ";
}

void Replica::Beat() {
  store_->set(HeartbeatKey(options_.rank),
              incarnation_ + ":" + std::to_string(++beats_));
}

void Replica::Heartbeat() {
  int64_t heard = -1;  // The quorum whose call it has passed on.
  std::unique_lock<std::mutex> lock(comm_mutex_);
  while (!stopping_) {
    const int64_t id = comm_quorum_;
    lock.unlock();
    try {
      Beat();
      std::optional<std::string> call;
      if (id >= 0 && heard != id) {
        // Waiting on the key rather than polling it: a call reaches the
        // training thread within milliseconds.
        try {
          call = store_->get(ChangeKey(id), options_.heartbeat_interval);
        } catch (const TimeoutError&) {
        }
      }
      lock.lock();
      if (call && comm_quorum_ == id) {
        heard = id;
        called_ = true;
        // At once: a collective waiting on a killed process over shared
        // memory would only notice it after the watchdog's check_after,
        // and the replacement's arrival erases the departure it looks for.
        if (call->rfind("abort", 0) == 0 && comm_) {
          ACCEL_VLOG(1) << Where() << "quorum " << id << " aborted: " << *call;
          // The interruption is what the failed collective reports (rather
          // than waiting 2 s for a departure to blame); the abort ends it.
          comm_->Interrupt("the lighthouse called a round: " + call->substr(6));
          comm_->transport().RequestAbort();
        }
      }
      if (call || heard == id || id < 0) {
        stop_beating_.wait_for(lock, options_.heartbeat_interval,
                               [this] { return stopping_; });
      }
    } catch (const Error&) {
      // The store's host went: the training thread will say so.
      if (!lock.owns_lock()) lock.lock();
      return;
    }
  }
}

void Replica::Request(Vote vote) {
  last_request_ = {incarnation_, last_request_.serial + 1, step_, vote,
                   in_sync_};
  try {
    store_->set(RequestKey(options_.rank), last_request_.Encode());
    store_->set(BellKey(store_->add(kBellCounter, 1)), "");
  } catch (const PeerError&) {
    RethrowWithPrefix(Where() +
                      "the store's host (rank 0) is gone, and the "
                      "quorum with it: the job cannot go on: ");
  } catch (const TimeoutError& e) {
    throw PeerError(
        Where() + "the store's host (rank 0) stopped answering: " + e.what(),
        0);
  }
  answer_pending_ = true;
}

std::optional<Quorum> Replica::AwaitAnswer() {
  const std::string key = AnswerKey(options_.rank, last_request_);
  const auto deadline = Clock::now() + options_.quorum_timeout;
  std::string text;
  try {
    for (;;) {
      // In slices: a replica that arrives after the others finished is
      // told so rather than waiting out the timeout.
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - Clock::now());
      try {
        text = store_->get(key, std::max(std::chrono::milliseconds(1),
                                         std::min(left, kAnswerSlice)));
        break;
      } catch (const TimeoutError&) {
        if (store_->try_get(kFinishedKey)) return std::nullopt;
        if (Clock::now() >= deadline) throw;
      }
    }
  } catch (const PeerError&) {
    RethrowWithPrefix(Where() +
                      "the store's host (rank 0) is gone, and the "
                      "quorum with it: the job cannot go on: ");
  } catch (const TimeoutError& e) {
    // The lighthouse answers within a step of the others: rank 0, which
    // runs it, is stopped or overloaded (a PeerError, so that the launcher
    // blames rank 0 rather than replacing this one).
    throw PeerError(Where() + "no quorum for step " + std::to_string(step_) +
                        " from the lighthouse on rank 0 within " +
                        std::to_string(options_.quorum_timeout.count() / 1000) +
                        " s: " + e.what(),
                    0);
  }
  answer_pending_ = false;
  Quorum quorum = Quorum::Decode(text);
  if (!quorum.stop.empty()) {
    throw PeerError(Where() + "the lighthouse stopped the job at step " +
                    std::to_string(step_) + ": " + quorum.stop);
  }
  return quorum;
}

bool Replica::StartStep() {
  for (;;) {
    if (!round_) return true;  // The same quorum, nobody called a round.
    if (!answer_pending_) Request(*round_);
    std::optional<Quorum> quorum = AwaitAnswer();
    if (!quorum) return false;  // The others finished.
    try {
      Enter(*quorum);
      round_.reset();
      return true;
    } catch (const UsageError&) {
      throw;
    } catch (const Error& e) {
      // A member was lost while the quorum connected or sent the state:
      // ask again; the lighthouse leaves it out.
      ACCEL_LOG(WARNING) << Where() << "quorum " << quorum->id << " at step "
                         << quorum->step << " failed: " << e.what();
      if (failed_at_ == Clock::time_point{}) failed_at_ = Clock::now();
      DropCommunicator();
      round_ = Vote::kNone;
    }
  }
}

void Replica::DropCommunicator() {
  std::unique_ptr<Communicator> old;
  {
    std::lock_guard<std::mutex> lock(comm_mutex_);
    old = std::move(comm_);
    comm_quorum_ = -1;
  }
  if (old) old->transport().RequestAbort();
}

void Replica::Connect(const Quorum& quorum) {
  DropCommunicator();
  BackendContext context;
  context.rank = quorum.IndexOf(options_.rank);
  context.size = static_cast<int>(quorum.members.size());
  context.store =
      std::make_shared<PrefixStore>("q" + std::to_string(quorum.id), store_);
  context.host = options_.host;
  context.local_rank = options_.local_rank;
  context.local_size = options_.local_size;
  context.options = options_.communicator;
  context.group = "replicas";
  context.job_ranks = quorum.Ranks();
  std::unique_ptr<Communicator> comm =
      CreateCommunicator(options_.backend, context);
  std::lock_guard<std::mutex> lock(comm_mutex_);
  comm_ = std::move(comm);
  comm_quorum_ = quorum.id;
  called_ = false;
}

void Replica::Enter(const Quorum& quorum) {
  if (quorum.IndexOf(options_.rank) < 0) {
    throw UsageError(Where() + "the lighthouse answered with quorum " +
                     std::to_string(quorum.id) + " of " +
                     RankList(quorum.Ranks()) + ", without this rank");
  }
  quorum_ = quorum;
  // The source's state is the run's from here on, whoever else fails.
  if (quorum.source == options_.rank) in_sync_ = true;
  Connect(quorum);
  if (!quorum.recovering.empty()) Recover();
  step_ = quorum.step;
  Report();
}

void Replica::Recover() {
  const int root = quorum_.IndexOf(quorum_.source);
  const bool receiving = quorum_.Recovering(options_.rank);
  const auto started = Clock::now();
  // The program's state, then the members of every step applied (the
  // job's history, which a replay needs whoever keeps it).
  std::string state;
  int64_t sizes[2] = {0, 0};
  if (options_.rank == quorum_.source) {
    state = options_.save_state();
    sizes[0] = static_cast<int64_t>(state.size());
    const std::string history = EncodeHistory(history_);
    sizes[1] = static_cast<int64_t>(history.size());
    state += history;
  }
  comm_->broadcast(sizes, 2, DType::kInt64, root);
  if (options_.inject) options_.inject(Point::kDuringRecovery, quorum_.step);
  state.resize(static_cast<size_t>(sizes[0] + sizes[1]));
  comm_->broadcast(state.data(), state.size(), DType::kUInt8, root);
  if (receiving) {
    history_ = DecodeHistory(state.substr(static_cast<size_t>(sizes[0])));
    state.resize(static_cast<size_t>(sizes[0]));
    options_.load_state(state);
    in_sync_ = true;
  }
  state_bytes_ = sizes[0];
  state_seconds_ = SecondsSince(started);
}

void Replica::Report() {
  // By process: a rank lost and replaced within one round is both.
  const std::vector<Member>& now = quorum_.members;
  if (now == previous_members_) return;
  auto ranks_not_in = [](const std::vector<Member>& a,
                         const std::vector<Member>& b) {
    std::vector<int> ranks;
    for (const Member& m : a) {
      if (std::find(b.begin(), b.end(), m) == b.end()) ranks.push_back(m.rank);
    }
    return ranks;
  };
  Change change;
  change.step = quorum_.step;
  change.quorum = quorum_.id;
  change.members = quorum_.Ranks();
  change.lost = ranks_not_in(previous_members_, now);
  const bool first = previous_members_.empty();
  if (!first) change.joined = ranks_not_in(now, previous_members_);
  previous_members_ = now;
  if (!change.lost.empty() && failed_at_ != Clock::time_point{}) {
    change.seconds = SecondsSince(failed_at_);
  } else if (first) {
    change.seconds = SecondsSince(started_);  // This replica's start.
  } else {
    change.seconds = state_seconds_;  // Sending the joiners the state.
  }
  changes_.push_back(change);
  if (first || quorum_.IndexOf(options_.rank) != 0) return;
  // One line per change, from the lowest-ranked member.
  std::string line =
      "fault tolerance: step " + std::to_string(change.step) + ": ";
  if (!change.lost.empty()) line += "lost " + RankList(change.lost) + "; ";
  if (!change.joined.empty()) {
    char sent[96];
    std::snprintf(sent, sizeof(sent), " (state %.2f MB from rank %d, %.3f s)",
                  state_bytes_ / 1e6, quorum_.source, state_seconds_);
    line += "joined " + RankList(change.joined) + sent + "; ";
  }
  char tail[96];
  std::snprintf(tail, sizeof(tail), "%d of %d replicas train on",
                static_cast<int>(now.size()), options_.world_size);
  line += tail;
  if (!change.lost.empty()) {
    char after[64];
    std::snprintf(after, sizeof(after), ", %.3f s after the failure",
                  change.seconds);
    line += after;
  }
  ACCEL_LOG(INFO) << line;
}

void Replica::Inject(Point point) {
  if (options_.inject) options_.inject(point, step_);
}

bool Replica::AllreduceAndCommit(const std::vector<Buffer>& buffers) {
  for (const Buffer& buffer : buffers) {
    if (buffer.spare_last &&
        (buffer.count == 0 || (buffer.dtype != DType::kFloat32 &&
                               buffer.dtype != DType::kFloat64))) {
      throw UsageError(Where() +
                       "a buffer with a spare last element must be float32 "
                       "or float64 and not empty");
    }
  }
  if (!comm_ || round_) {
    throw UsageError(Where() +
                     "AllreduceAndCommit without StartStep before it");
  }
  Inject(Point::kBeforeAllreduce);
  const auto started = Clock::now();
  // How many members were called to a round: the same sum everywhere, so
  // every member goes to it after the same step. In a buffer's spare last
  // element when there is one, else in a collective of its own.
  {
    std::lock_guard<std::mutex> lock(comm_mutex_);
    calls_ = called_ ? 1 : 0;
  }
  const Buffer* carrier = nullptr;
  for (const Buffer& buffer : buffers) {
    if (buffer.spare_last) carrier = &buffer;
  }
  if (carrier != nullptr) SetLast(*carrier, static_cast<double>(calls_));
  try {
    if (!options_.inject) {
      // Blocking calls run on this thread: no hand-off to the worker.
      for (const Buffer& buffer : buffers) {
        comm_->allreduce(buffer.data, buffer.count, buffer.dtype,
                         ReduceOp::kSum);
      }
      if (carrier == nullptr) {
        comm_->allreduce(&calls_, 1, DType::kInt64, ReduceOp::kSum);
      }
    } else {
      std::vector<std::shared_ptr<Work>> works;
      for (const Buffer& buffer : buffers) {
        works.push_back(comm_->allreduce_async(buffer.data, buffer.count,
                                               buffer.dtype, ReduceOp::kSum));
      }
      if (carrier == nullptr) {
        works.push_back(
            comm_->allreduce_async(&calls_, 1, DType::kInt64, ReduceOp::kSum));
      }
      try {
        Inject(Point::kDuringAllreduce);
      } catch (...) {
        // The sums write into the caller's buffers: they end before the
        // exception leaves (and the buffers with it).
        comm_->transport().RequestAbort();
        for (const auto& work : works) {
          try {
            work->wait();
          } catch (const Error&) {
          }
        }
        throw;
      }
      for (const auto& work : works) work->wait();
    }
    if (carrier != nullptr) {
      calls_ = static_cast<int64_t>(std::llround(GetLast(*carrier)));
    }
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    // Another member may have completed the same sums and applied the
    // step: the round finds out who holds the state.
    ACCEL_VLOG(1) << Where() << "step " << step_ << " failed: " << e.what();
    // From the start of the sums: a stopped member held them until the
    // lighthouse dropped it.
    if (failed_at_ == Clock::time_point{}) failed_at_ = started;
    ++steps_retried_;
    round_ = Vote::kFailed;
    return false;
  }
  Inject(Point::kAfterAllreduce);
  // A completed sum holds every member's gradients: apply it.
  history_.push_back(quorum_.Ranks());
  if (quorum_size() < options_.world_size) ++steps_with_fewer_;
  ++step_;
  failed_at_ = Clock::time_point{};
  if (calls_ > 0) round_ = Vote::kOk;
  return true;
}

std::string EncodeHistory(const std::vector<std::vector<int>>& history) {
  std::string text;
  for (const std::vector<int>& members : history) {
    for (size_t i = 0; i < members.size(); ++i) {
      text += (i > 0 ? "," : "") + std::to_string(members[i]);
    }
    text += "\n";
  }
  return text;
}

std::vector<std::vector<int>> DecodeHistory(const std::string& text) {
  std::vector<std::vector<int>> history;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::vector<int> members;
    size_t from = at;
    while (from < end) {
      size_t comma = text.find(',', from);
      if (comma == std::string::npos || comma > end) comma = end;
      members.push_back(std::stoi(text.substr(from, comma - from)));
      from = comma + 1;
    }
    history.push_back(members);
    at = end + 1;
  }
  return history;
}

}  // namespace accel::ft
