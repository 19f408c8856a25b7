#include "accel/runtime/comm/communicator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string_view>
#include <thread>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"
#include "accel/runtime/base/startup_trace.h"

namespace accel {
namespace {

using Clock = std::chrono::steady_clock;

// "0.123": milliseconds with microseconds, for --v=2.
std::string MillisecondsSince(Clock::time_point start) {
  char text[32];
  std::snprintf(
      text, sizeof(text), "%.3f",
      std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  return text;
}

// How long a rank that saw a broken connection waits for the store to notice
// which process went away: the data path usually fails first.
constexpr auto kDepartureGrace = std::chrono::milliseconds(2000);

// Bound on each diagnostic store request: a rank 0 that stopped answering
// must not delay a timeout's message (nor hold up the watchdog) for long.
constexpr auto kDiagnosticRequestTimeout = std::chrono::milliseconds(2000);

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

// "rank 2 crashed (its process left the job)" from Store::departures().
std::string DescribeDeparture(int rank, const std::string& how) {
  const std::string unreachable = "unreachable";
  if (how.rfind(unreachable, 0) == 0) {
    std::string machine = how.substr(unreachable.size());
    if (machine.rfind(" at ", 0) == 0) machine = " " + machine.substr(4);
    return "rank " + std::to_string(rank) + " is unreachable (its machine" +
           machine + " stopped answering on the network)";
  }
  return "rank " + std::to_string(rank) + " " + how +
         " (its process left the job)";
}

// Concatenates with one allocation: signatures are built on every call.
std::string Concat(std::initializer_list<std::string_view> parts) {
  size_t size = 0;
  for (std::string_view part : parts) size += part.size();
  std::string text;
  text.reserve(size);
  for (std::string_view part : parts) text.append(part);
  return text;
}

}  // namespace

std::string CallSite::ToString() const {
  if (file == nullptr) return "unknown";
  const char* base = std::strrchr(file, '/');
  return std::string(base ? base + 1 : file) + ":" + std::to_string(line);
}

Communicator::Communicator(const BackendContext& context)
    : rank_(context.rank),
      size_(context.size),
      local_size_(std::max(1, context.local_size)),
      timeout_(context.options.timeout),
      store_(context.store
                 ? context.store->WithRequestTimeout(kDiagnosticRequestTimeout)
                 : nullptr),
      options_(context.options),
      observations_(context.size) {
  worker_ = std::thread([this] { WorkerLoop(); });
  if (store_ != nullptr && size_ > 1) {
    watchdog_ = std::thread([this] { WatchdogLoop(); });
  }
}

Communicator::~Communicator() { StopWorker(); }

void Communicator::StopWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  work_available_.notify_all();
  if (worker_.joinable()) worker_.join();
  {
    std::lock_guard<std::mutex> lock(status_mutex_);
    watchdog_stopping_ = true;
  }
  status_changed_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

std::string Communicator::Where() const {
  return "[" + backend_name() + "] rank " + std::to_string(rank_) + "/" +
         std::to_string(size_) + ": ";
}

void Communicator::FailUsage(const char* operation,
                             const std::string& message) const {
  throw UsageError(Where() + operation + ": " + message);
}

std::shared_ptr<Work> Communicator::allgather_async(
    const void* input, void* output, size_t count, DType dtype,
    const CollectiveOptions& options) {
  return StartAllgather(input, output, count, dtype, options, Mode::kAsync)
      .work;
}

uint64_t Communicator::allgather(const void* input, void* output, size_t count,
                                 DType dtype,
                                 const CollectiveOptions& options) {
  return Finish(
      StartAllgather(input, output, count, dtype, options, Mode::kBlocking));
}

Communicator::Started Communicator::StartAllgather(
    const void* input, void* output, size_t count, DType dtype,
    const CollectiveOptions& options, Mode mode) {
  if (count > 0 && (input == nullptr || output == nullptr)) {
    FailUsage("allgather",
              "null buffer for " + std::to_string(count) + " elements");
  }
  ElementSize(dtype);  // Rejects an out-of-range dtype value.
  return Start(
      "allgather", options,
      Concat({"allgather ", DTypeName(dtype), " x ", std::to_string(count)}),
      [=](const Op& op) { RunAllgather(op, input, output, count, dtype); },
      mode, count * ElementSize(dtype));
}

std::shared_ptr<Work> Communicator::allgatherv_async(
    const void* input, void* output, std::vector<size_t> counts, DType dtype,
    const CollectiveOptions& options) {
  return StartAllgatherv(input, output, std::move(counts), dtype, options,
                         Mode::kAsync)
      .work;
}

uint64_t Communicator::allgatherv(const void* input, void* output,
                                  std::vector<size_t> counts, DType dtype,
                                  const CollectiveOptions& options) {
  return Finish(StartAllgatherv(input, output, std::move(counts), dtype,
                                options, Mode::kBlocking));
}

Communicator::Started Communicator::StartAllgatherv(
    const void* input, void* output, std::vector<size_t> counts, DType dtype,
    const CollectiveOptions& options, Mode mode) {
  if (counts.size() != static_cast<size_t>(size_)) {
    FailUsage("allgatherv", "expected " + std::to_string(size_) +
                                " counts (one per rank), found " +
                                std::to_string(counts.size()));
  }
  size_t total = 0;
  for (size_t c : counts) total += c;
  if ((counts[rank_] > 0 && input == nullptr) ||
      (total > 0 && output == nullptr)) {
    FailUsage("allgatherv", "null buffer with non-zero counts");
  }
  ElementSize(dtype);
  const size_t my_bytes = counts[rank_] * ElementSize(dtype);
  std::string signature = std::string("allgatherv ") + DTypeName(dtype) + " [";
  for (size_t r = 0; r < counts.size(); ++r) {
    signature += (r ? ", " : "") + std::to_string(counts[r]);
  }
  return Start(
      "allgatherv", options, signature + "]",
      [=, counts = std::move(counts)](const Op& op) {
        RunAllgatherv(op, input, output, counts, dtype);
      },
      mode, my_bytes);
}

std::shared_ptr<Work> Communicator::allreduce_async(
    void* buffer, size_t count, DType dtype, ReduceOp reduce_op,
    const CollectiveOptions& options) {
  return StartAllreduce(buffer, count, dtype, reduce_op, options, Mode::kAsync)
      .work;
}

uint64_t Communicator::allreduce(void* buffer, size_t count, DType dtype,
                                 ReduceOp reduce_op,
                                 const CollectiveOptions& options) {
  return Finish(StartAllreduce(buffer, count, dtype, reduce_op, options,
                               Mode::kBlocking));
}

Communicator::Started Communicator::StartAllreduce(
    void* buffer, size_t count, DType dtype, ReduceOp reduce_op,
    const CollectiveOptions& options, Mode mode) {
  if (count > 0 && buffer == nullptr) {
    FailUsage("allreduce",
              "null buffer for " + std::to_string(count) + " elements");
  }
  if (!SupportsReduction(dtype, reduce_op)) {
    FailUsage("allreduce",
              std::string("reduction '") + ReduceOpName(reduce_op) +
                  "' is not defined for dtype " + DTypeName(dtype) +
                  "; use 'max' (logical or) or 'min' (logical "
                  "and)");
  }
  return Start(
      "allreduce", options,
      Concat({"allreduce ", ReduceOpName(reduce_op), " ", DTypeName(dtype),
              " x ", std::to_string(count)}),
      [=](const Op& op) { RunAllreduce(op, buffer, count, dtype, reduce_op); },
      mode, count * ElementSize(dtype));
}

std::shared_ptr<Work> Communicator::broadcast_async(
    void* buffer, size_t count, DType dtype, int root,
    const CollectiveOptions& options) {
  return StartBroadcast(buffer, count, dtype, root, options, Mode::kAsync).work;
}

uint64_t Communicator::broadcast(void* buffer, size_t count, DType dtype,
                                 int root, const CollectiveOptions& options) {
  return Finish(
      StartBroadcast(buffer, count, dtype, root, options, Mode::kBlocking));
}

Communicator::Started Communicator::StartBroadcast(
    void* buffer, size_t count, DType dtype, int root,
    const CollectiveOptions& options, Mode mode) {
  if (root < 0 || root >= size_) {
    FailUsage("broadcast", "root must be a rank in [0, " +
                               std::to_string(size_) + "), found " +
                               std::to_string(root));
  }
  if (count > 0 && buffer == nullptr) {
    FailUsage("broadcast",
              "null buffer for " + std::to_string(count) + " elements");
  }
  ElementSize(dtype);
  return Start(
      "broadcast", options,
      Concat({"broadcast ", DTypeName(dtype), " x ", std::to_string(count),
              " from rank ", std::to_string(root)}),
      [=](const Op& op) { RunBroadcast(op, buffer, count, dtype, root); }, mode,
      count * ElementSize(dtype));
}

std::shared_ptr<Work> Communicator::barrier_async(
    const CollectiveOptions& options) {
  return Start(
             "barrier", options, "barrier",
             [=](const Op& op) { RunBarrier(op); }, Mode::kAsync)
      .work;
}

uint64_t Communicator::barrier(const CollectiveOptions& options) {
  return Finish(Start(
      "barrier", options, "barrier", [=](const Op& op) { RunBarrier(op); },
      Mode::kBlocking));
}

uint64_t Communicator::Finish(const Started& started) {
  if (started.work != nullptr) started.work->wait();
  return started.sequence;
}

std::string Communicator::DescribeCall(const CollectiveOptions& options,
                                       const char* name,
                                       uint64_t sequence) const {
  return Where() + (options.api != nullptr ? options.api : name) + " #" +
         std::to_string(sequence) + " (" + options.site.ToString() + "): ";
}

template <typename Fn>
Communicator::Started Communicator::Start(const char* name,
                                          const CollectiveOptions& options,
                                          std::string signature, Fn&& task,
                                          Mode mode, size_t bytes) {
  if (options.timeout.count() < 0) {
    FailUsage(name, "timeout must not be negative, found " +
                        std::to_string(options.timeout.count()) + " ms");
  }
  Op op;
  op.name = name;
  op.timeout = options.timeout.count() > 0 ? options.timeout : timeout_;
  op.api = options.api != nullptr ? options.api : name;
  op.site = options.site;
  op.signature = std::move(signature);
  op.bytes = bytes;
  op.overlapped = mode == Mode::kAsync;
  if (mode == Mode::kBlocking) {
    bool inline_run = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) FailUsage(name, "communicator is shutting down");
      if (queue_.empty() && !executing_) {
        op.sequence = next_sequence_++;
        executing_ = true;
        inline_run = true;
      }
    }
    if (inline_run) {
      const std::exception_ptr error = Execute(op, task);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        executing_ = false;
      }
      // Async work queued meanwhile waited for this call to finish.
      work_available_.notify_one();
      if (error) std::rethrow_exception(error);
      return {nullptr, op.sequence};
    }
  }
  auto job = std::make_unique<Job>();
  job->op = std::move(op);
  job->task = std::forward<Fn>(task);
  Started started;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) FailUsage(name, "communicator is shutting down");
    job->op.sequence = next_sequence_++;
    started.sequence = job->op.sequence;
    started.work = std::make_shared<Work>(job->done.get_future().share(),
                                          job->op.sequence);
    queue_.push_back(std::move(job));
  }
  work_available_.notify_one();
  return started;
}

void Communicator::WorkerLoop() {
  while (true) {
    std::unique_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_available_.wait(
          lock, [&] { return (stopping_ || !queue_.empty()) && !executing_; });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      if (stopping_) {
        job->done.set_exception(std::make_exception_ptr(UsageError(
            Where() + job->op.name + " #" + std::to_string(job->op.sequence) +
            ": communicator was destroyed before the operation ran")));
        continue;
      }
      executing_ = true;
    }
    const std::exception_ptr error = Execute(job->op, job->task);
    if (error) {
      job->done.set_exception(error);
    } else {
      job->done.set_value();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      executing_ = false;
    }
    work_available_.notify_all();
  }
}

std::string Communicator::AwaitDepartures(int* failed_rank) {
  if (store_ == nullptr) return "";
  const auto deadline = Clock::now() + kDepartureGrace;
  try {
    while (true) {
      std::map<int, std::string> departed = store_->departures();
      departed.erase(rank_);
      if (!departed.empty()) {
        std::string text;
        for (const auto& [rank, how] : departed) {
          if (*failed_rank < 0 || how != "exited") *failed_rank = rank;
          text += (text.empty() ? "" : ", ") + DescribeDeparture(rank, how);
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

void Communicator::SetStatus(const Op& op, bool running, bool succeeded) {
  std::lock_guard<std::mutex> lock(status_mutex_);
  status_.known = true;
  status_.sequence = op.sequence;
  status_.running = running;
  // Assignments reuse the strings' storage: nothing allocates per call.
  status_.api.assign(op.api);
  status_.signature.assign(op.signature);
  if (op.site.file != status_site_.file || op.site.line != status_site_.line) {
    status_site_ = op.site;
    status_.site = op.site.ToString();
  }
  ++status_version_;
  if (running) {
    running_since_ = Clock::now();
  } else if (succeeded && NeedsEveryRank(op.name)) {
    last_completed_.sequence = op.sequence;
    last_completed_.api.assign(op.api);
    last_completed_.site.assign(status_.site);
  }
}

Communicator::Status Communicator::CurrentStatus() {
  std::lock_guard<std::mutex> lock(status_mutex_);
  return status_;
}

std::string Communicator::Encode(const Status& status) {
  return std::to_string(status.sequence) + "\t" + (status.running ? "1" : "0") +
         "\t" + status.api + "\t" + status.signature + "\t" + status.site +
         "\t" + std::to_string(status.beat);
}

Communicator::Status Communicator::Decode(const std::string& text) {
  Status status;
  std::vector<std::string> fields;
  size_t start = 0;
  while (true) {
    const size_t tab = text.find('\t', start);
    fields.push_back(text.substr(start, tab - start));
    if (tab == std::string::npos) break;
    start = tab + 1;
  }
  if (fields.size() != 6) return status;
  status.published = true;
  status.sequence = std::strtoull(fields[0].c_str(), nullptr, 10);
  status.running = fields[1] == "1";
  status.api = fields[2];
  status.signature = fields[3];
  status.site = fields[4];
  status.beat = std::strtoull(fields[5].c_str(), nullptr, 10);
  // Heartbeats come before the first collective too.
  status.known = status.sequence > 0;
  return status;
}

bool Communicator::Differs(const Status& other, const Status& mine) {
  // A finished call counts too: the other rank may have failed already, and
  // left since (the mismatch is still the cause to report).
  return other.known && other.sequence == mine.sequence &&
         other.signature != mine.signature;
}

std::vector<Communicator::Status> Communicator::ReadStatuses(
    const Status& mine) {
  std::vector<Status> statuses(size_);
  statuses[rank_] = mine;
  if (store_ == nullptr) return statuses;
  std::map<int, std::string> departed = store_->departures();
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (auto text = store_->try_get("accel_status/" + std::to_string(r))) {
      statuses[r] = Decode(*text);
    }
    auto it = departed.find(r);
    if (it != departed.end()) statuses[r].departed = it->second;
  }
  // A rank whose heartbeat stands still is stopped, overloaded or cut off.
  const auto now = Clock::now();
  const auto silent_after = kSilentAfterBeats * options_.heartbeat_interval;
  std::lock_guard<std::mutex> lock(status_mutex_);
  for (int r = 0; r < size_; ++r) {
    Status& s = statuses[r];
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

Communicator::Picture Communicator::TakePicture(const Status& mine) {
  Picture picture;
  try {
    picture.statuses = ReadStatuses(mine);
    return picture;
  } catch (const PeerError& e) {
    picture.store_problem = e.what();
    picture.store_lost = true;
  } catch (const std::exception& e) {
    picture.store_problem = e.what();
  }
  picture.statuses.assign(size_, Status());
  picture.statuses[rank_] = mine;
  return picture;
}

std::string Communicator::RanksWithRank0() const {
  if (local_size_ >= size_ || local_size_ <= 1) return "";
  std::string text = "; ranks 0";
  for (int r = 1; r < local_size_; ++r) text += ", " + std::to_string(r);
  return text + " run on rank 0's machine (" + std::to_string(local_size_) +
         " ranks per machine)";
}

std::string Communicator::DescribeRanks(const std::vector<Status>& statuses,
                                        const Status& mine,
                                        bool only_differing) const {
  auto call = [](const Status& s) {
    return s.api + " #" + std::to_string(s.sequence) + " (" + s.site + ")";
  };
  Completed completed;
  {
    std::lock_guard<std::mutex> lock(status_mutex_);
    completed = last_completed_;
  }
  std::string others;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const Status& s = statuses[r];
    const bool same = s.known && s.running && s.departed.empty() && !s.silent &&
                      s.sequence == mine.sequence &&
                      s.signature == mine.signature;
    if (only_differing && same) continue;
    // Every rank called the last collective that needed all of them, even
    // one stopped before it could publish that.
    Status last = s;
    if (completed.sequence > 0 &&
        (!s.known || s.sequence < completed.sequence)) {
      last.known = true;
      last.running = false;
      last.sequence = completed.sequence;
      last.api = completed.api;
      last.site = completed.site;
    }
    std::string text = "rank " + std::to_string(r) + " ";
    if (!s.departed.empty() && Differs(s, mine)) {
      text += "is in " + call(s) + " [" + s.signature +
              "]; it has left the job since (" + s.departed + ")";
    } else if (!s.departed.empty()) {
      text = DescribeDeparture(r, s.departed);
    } else if (s.silent) {
      text += "is not responding (its status has not changed for " +
              Seconds(s.silent_for) +
              ": stopped, overloaded, or its machine is unreachable); " +
              (last.known ? "its last call was " + call(last)
                          : std::string("it has not called a collective"));
    } else if (!last.known) {
      text += "has not called a collective yet";
    } else if (last.running) {
      text += "is in " + call(last) + " [" + last.signature + "]";
    } else if (last.sequence == mine.sequence) {
      // It left this very call (it failed first): say what it called.
      text += "left " + call(last) + " [" + last.signature + "]";
    } else {
      text += "is not in a collective (its last was " + call(last) + ")";
    }
    others += (others.empty() ? "" : ", ") + text;
  }
  if (others.empty()) return "";
  return others + " while rank " + std::to_string(rank_) + " waits in " +
         call(mine) + " [" + mine.signature + "]";
}

void Communicator::WatchdogLoop() {
  uint64_t published = 0;
  uint64_t beat = 0;
  Clock::time_point last_publish;
  uint64_t checked_sequence = 0;
  auto next_check = Clock::time_point::max();
  const auto wake_every =
      std::min(options_.status_interval, options_.heartbeat_interval);
  std::unique_lock<std::mutex> lock(status_mutex_);
  while (!watchdog_stopping_) {
    status_changed_.wait_for(lock, wake_every);
    if (watchdog_stopping_) break;
    Status mine = status_;
    const uint64_t version = status_version_;
    const auto since = running_since_;
    // No lock is held across a store request: one that waits on a stopped
    // rank 0 delays only this thread, and only by its own short timeout.
    lock.unlock();
    const auto now = Clock::now();
    if ((options_.check_collectives && version != published) ||
        now - last_publish >= options_.heartbeat_interval) {
      mine.beat = ++beat;
      try {
        store_->set("accel_status/" + std::to_string(rank_), Encode(mine));
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
      const Picture picture = TakePicture(mine);
      std::string reason;
      bool mismatch = false;
      int departed = -1;
      if (picture.store_lost) {
        // The store's host (rank 0) is gone: nothing can complete.
        departed = 0;
        reason =
            picture.store_problem +
            (picture.store_problem.find("on the network") != std::string::npos
                 ? RanksWithRank0()
                 : "");
      } else if (picture.store_problem.empty()) {
        for (int r = 0; r < size_; ++r) {
          const Status& s = picture.statuses[r];
          if (!s.departed.empty() && departed < 0) departed = r;
          mismatch |= Differs(s, mine);
        }
        if (mismatch || departed >= 0) {
          reason = (mismatch ? "ranks called different collectives: "
                             : std::string()) +
                   DescribeRanks(picture.statuses, mine,
                                 /*only_differing=*/true);
        }
      }
      if (!reason.empty()) {
        {
          std::lock_guard<std::mutex> relock(status_mutex_);
          if (status_.sequence == mine.sequence && status_.running) {
            abort_is_usage_ = mismatch;
            abort_rank_ = departed;
            abort_reason_ = reason;
          }
        }
        Abort();
      }
    }
    lock.lock();
  }
}

std::exception_ptr Communicator::Diagnose(const std::string& what, const Op& op,
                                          const std::exception& e) {
  const bool timed_out = dynamic_cast<const TimeoutError*>(&e) != nullptr;
  const auto* peer = dynamic_cast<const PeerError*>(&e);
  Status mine = CurrentStatus();
  mine.running = true;
  const Picture picture =
      store_ != nullptr && size_ > 1 ? TakePicture(mine) : Picture{};
  if (picture.store_problem.empty()) {
    for (const Status& s : picture.statuses) {
      // A peer that found the mismatch first aborted, which is what failed
      // here: report the cause, not the closed connection.
      if (Differs(s, mine)) {
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
  if (picture.store_lost) {
    departed = picture.store_problem;
    failed_rank = 0;
  } else if (picture.store_problem.empty()) {
    for (int r = 0; r < static_cast<int>(picture.statuses.size()); ++r) {
      const std::string& how = picture.statuses[r].departed;
      if (how.empty()) continue;
      if (failed_rank < 0 || how != "exited") failed_rank = r;
      departed += (departed.empty() ? "" : ", ") + DescribeDeparture(r, how);
    }
    if (departed.empty() && peer != nullptr) {
      departed = AwaitDepartures(&failed_rank);
    }
  }
  if (timed_out && departed.empty()) {
    const std::string ranks =
        picture.store_problem.empty()
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

template <typename Fn>
std::exception_ptr Communicator::Execute(const Op& op, Fn& task) {
  if (broken_) return Failed(op, nullptr);
  SetStatus(op, /*running=*/true);
  const bool traced = VLOG_IS_ON(2);
  const auto started = traced ? Clock::now() : Clock::time_point();
  try {
    task(op);
  } catch (const std::exception& e) {
    SetStatus(op, /*running=*/false);
    ACCEL_VLOG(2) << Traced(op) << "failed after " << MillisecondsSince(started)
                  << " ms: " << e.what();
    return Failed(op, std::current_exception());
  } catch (...) {
    SetStatus(op, /*running=*/false);
    return Failed(op, std::current_exception());
  }
  SetStatus(op, /*running=*/false, /*succeeded=*/true);
  if (op.sequence == 1) TraceStartup("first_collective");
  if (traced) {
    ACCEL_VLOG(2) << Traced(op) << MillisecondsSince(started) << " ms";
  }
  return nullptr;
}

std::string Communicator::Traced(const Op& op) const {
  return "[" + backend_name() + "] " + op.api + " #" +
         std::to_string(op.sequence) + " (" + op.site.ToString() +
         "): " + op.signature + ", " + std::to_string(op.bytes) + " bytes, ";
}

std::exception_ptr Communicator::Failed(const Op& op,
                                        std::exception_ptr error) {
  const std::string what = Where() + op.api + " #" +
                           std::to_string(op.sequence) + " (" +
                           op.site.ToString() + "): ";
  if (error == nullptr) {
    std::string cause = "unknown error";
    try {
      std::rethrow_exception(broken_);
    } catch (const std::exception& e) {
      cause = e.what();
    }
    return std::make_exception_ptr(PeerError(
        what + "not run because an earlier collective failed: " + cause));
  }
  try {
    std::rethrow_exception(error);
  } catch (const UsageError& e) {
    return std::make_exception_ptr(UsageError(what + e.what()));
  } catch (const std::exception& e) {
    std::string reason;
    bool usage = false;
    int aborted_for = -1;
    {
      std::lock_guard<std::mutex> lock(status_mutex_);
      reason = std::move(abort_reason_);
      abort_reason_.clear();
      usage = abort_is_usage_;
      aborted_for = abort_rank_;
    }
    if (!reason.empty() && usage) {
      broken_ = std::make_exception_ptr(UsageError(what + reason));
    } else if (!reason.empty()) {
      broken_ = std::make_exception_ptr(PeerError(what + reason, aborted_for));
    } else {
      broken_ = Diagnose(what, op, e);
    }
  } catch (...) {
    broken_ = std::make_exception_ptr(
        Error(what + "failed with an exception that is not std::exception"));
  }
  try {
    std::rethrow_exception(broken_);
  } catch (const std::exception& e) {
    OnBroken(e.what());
  }
  return broken_;
}

}  // namespace accel
