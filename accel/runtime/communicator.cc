#include "accel/runtime/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include "accel/runtime/errors.h"

namespace accel {
namespace {

// How long a rank that saw a broken connection waits for the store to notice
// which process went away: the data path usually fails first.
constexpr auto kDepartureGrace = std::chrono::milliseconds(2000);

}  // namespace

std::string CallSite::ToString() const {
  if (file == nullptr) return "unknown";
  const char* base = std::strrchr(file, '/');
  return std::string(base ? base + 1 : file) + ":" + std::to_string(line);
}

Communicator::Communicator(const BackendContext& context)
    : rank_(context.rank),
      size_(context.size),
      timeout_(context.options.timeout),
      store_(context.store),
      options_(context.options) {
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
  return StartAllgather(input, output, count, dtype, options, Mode::kAsync);
}

void Communicator::allgather(const void* input, void* output, size_t count,
                             DType dtype, const CollectiveOptions& options) {
  StartAllgather(input, output, count, dtype, options, Mode::kBlocking)->wait();
}

std::shared_ptr<Work> Communicator::StartAllgather(
    const void* input, void* output, size_t count, DType dtype,
    const CollectiveOptions& options, Mode mode) {
  if (count > 0 && (input == nullptr || output == nullptr)) {
    FailUsage("allgather",
              "null buffer for " + std::to_string(count) + " elements");
  }
  ElementSize(dtype);  // Rejects an out-of-range dtype value.
  return Start(
      "allgather", options,
      std::string("allgather ") + DTypeName(dtype) + " x " +
          std::to_string(count),
      [=](const Op& op) { RunAllgather(op, input, output, count, dtype); },
      mode);
}

std::shared_ptr<Work> Communicator::allgatherv_async(
    const void* input, void* output, std::vector<size_t> counts, DType dtype,
    const CollectiveOptions& options) {
  return StartAllgatherv(input, output, std::move(counts), dtype, options,
                         Mode::kAsync);
}

void Communicator::allgatherv(const void* input, void* output,
                              std::vector<size_t> counts, DType dtype,
                              const CollectiveOptions& options) {
  StartAllgatherv(input, output, std::move(counts), dtype, options,
                  Mode::kBlocking)
      ->wait();
}

std::shared_ptr<Work> Communicator::StartAllgatherv(
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
  std::string signature = std::string("allgatherv ") + DTypeName(dtype) + " [";
  for (size_t r = 0; r < counts.size(); ++r) {
    signature += (r ? ", " : "") + std::to_string(counts[r]);
  }
  return Start(
      "allgatherv", options, signature + "]",
      [=, counts = std::move(counts)](const Op& op) {
        RunAllgatherv(op, input, output, counts, dtype);
      },
      mode);
}

std::shared_ptr<Work> Communicator::allreduce_async(
    void* buffer, size_t count, DType dtype, ReduceOp reduce_op,
    const CollectiveOptions& options) {
  return StartAllreduce(buffer, count, dtype, reduce_op, options, Mode::kAsync);
}

void Communicator::allreduce(void* buffer, size_t count, DType dtype,
                             ReduceOp reduce_op,
                             const CollectiveOptions& options) {
  StartAllreduce(buffer, count, dtype, reduce_op, options, Mode::kBlocking)
      ->wait();
}

std::shared_ptr<Work> Communicator::StartAllreduce(
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
      std::string("allreduce ") + ReduceOpName(reduce_op) + " " +
          DTypeName(dtype) + " x " + std::to_string(count),
      [=](const Op& op) { RunAllreduce(op, buffer, count, dtype, reduce_op); },
      mode);
}

std::shared_ptr<Work> Communicator::broadcast_async(
    void* buffer, size_t count, DType dtype, int root,
    const CollectiveOptions& options) {
  return StartBroadcast(buffer, count, dtype, root, options, Mode::kAsync);
}

void Communicator::broadcast(void* buffer, size_t count, DType dtype, int root,
                             const CollectiveOptions& options) {
  StartBroadcast(buffer, count, dtype, root, options, Mode::kBlocking)->wait();
}

std::shared_ptr<Work> Communicator::StartBroadcast(
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
      std::string("broadcast ") + DTypeName(dtype) + " x " +
          std::to_string(count) + " from rank " + std::to_string(root),
      [=](const Op& op) { RunBroadcast(op, buffer, count, dtype, root); },
      mode);
}

std::shared_ptr<Work> Communicator::barrier_async(
    const CollectiveOptions& options) {
  return Start(
      "barrier", options, "barrier", [=](const Op& op) { RunBarrier(op); },
      Mode::kAsync);
}

void Communicator::barrier(const CollectiveOptions& options) {
  Start(
      "barrier", options, "barrier", [=](const Op& op) { RunBarrier(op); },
      Mode::kBlocking)
      ->wait();
}

std::shared_ptr<Work> Communicator::Start(const char* name,
                                          const CollectiveOptions& options,
                                          std::string signature, Task task,
                                          Mode mode) {
  if (options.timeout.count() < 0) {
    FailUsage(name, "timeout must not be negative, found " +
                        std::to_string(options.timeout.count()) + " ms");
  }
  auto job = std::make_unique<Job>();
  job->op.name = name;
  job->op.timeout = options.timeout.count() > 0 ? options.timeout : timeout_;
  job->op.api = options.api != nullptr ? options.api : name;
  job->op.site = options.site;
  job->op.signature = std::move(signature);
  job->task = std::move(task);
  auto work = std::make_shared<Work>(job->done.get_future().share());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) FailUsage(name, "communicator is shutting down");
    job->op.sequence = next_sequence_++;
    const bool idle = queue_.empty() && !executing_;
    if (mode == Mode::kAsync || !idle) {
      queue_.push_back(std::move(job));
    } else {
      executing_ = true;
    }
  }
  if (job == nullptr) {
    work_available_.notify_one();
    return work;
  }
  Execute(*job);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    executing_ = false;
  }
  // Async work queued meanwhile waited for this call to finish.
  work_available_.notify_one();
  return work;
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
    Execute(*job);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      executing_ = false;
    }
    work_available_.notify_all();
  }
}

std::string Communicator::DescribeDepartures(int* failed_rank) {
  if (store_ == nullptr) return "";
  const auto deadline = std::chrono::steady_clock::now() + kDepartureGrace;
  try {
    while (true) {
      std::map<int, std::string> departed = store_->departures();
      departed.erase(rank_);
      if (!departed.empty()) {
        std::string text;
        for (const auto& [rank, how] : departed) {
          if (*failed_rank < 0 || how == "crashed") *failed_rank = rank;
          text += (text.empty() ? "" : ", ") + std::string("rank ") +
                  std::to_string(rank) + " " + how;
        }
        return text + " (its process left the job)";
      }
      if (std::chrono::steady_clock::now() >= deadline) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const Error&) {
    *failed_rank = 0;
    return "rank 0 is unreachable (it hosts the rendezvous store, so it "
           "crashed or exited)";
  }
}

void Communicator::SetStatus(const Op& op, bool running) {
  {
    std::lock_guard<std::mutex> lock(status_mutex_);
    status_.known = true;
    status_.sequence = op.sequence;
    status_.running = running;
    status_.api = op.api;
    status_.signature = op.signature;
    status_.site = op.site.ToString();
    ++status_version_;
    if (running) running_since_ = std::chrono::steady_clock::now();
  }
}

std::string Communicator::Encode(const Status& status) {
  return std::to_string(status.sequence) + "\t" + (status.running ? "1" : "0") +
         "\t" + status.api + "\t" + status.signature + "\t" + status.site;
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
  if (fields.size() != 5) return status;
  status.known = true;
  status.sequence = std::strtoull(fields[0].c_str(), nullptr, 10);
  status.running = fields[1] == "1";
  status.api = fields[2];
  status.signature = fields[3];
  status.site = fields[4];
  return status;
}

bool Communicator::Differs(const Status& other, const Status& mine) {
  // A finished call counts too: the other rank may have failed already.
  return other.known && other.departed.empty() &&
         other.sequence == mine.sequence && other.signature != mine.signature;
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
  return statuses;
}

std::string Communicator::DescribeRanks(const std::vector<Status>& statuses,
                                        const Status& mine,
                                        bool only_differing) const {
  auto call = [](const Status& s) {
    return s.api + " #" + std::to_string(s.sequence) + " (" + s.site + ")";
  };
  std::string others;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const Status& s = statuses[r];
    const bool same = s.known && s.running && s.departed.empty() &&
                      s.sequence == mine.sequence &&
                      s.signature == mine.signature;
    if (only_differing && same) continue;
    std::string text = "rank " + std::to_string(r) + " ";
    if (!s.departed.empty()) {
      text += s.departed + " (its process left the job)";
    } else if (!s.known) {
      text += "has not called a collective yet";
    } else if (s.running) {
      text += "is in " + call(s) + " [" + s.signature + "]";
    } else {
      text += "is not in a collective (its last was " + call(s) + ")";
    }
    others += (others.empty() ? "" : ", ") + text;
  }
  if (others.empty()) return "";
  return others + " while rank " + std::to_string(rank_) + " waits in " +
         call(mine) + " [" + mine.signature + "]";
}

void Communicator::WatchdogLoop() {
  uint64_t published = 0;
  uint64_t checked_sequence = 0;
  auto next_check = std::chrono::steady_clock::time_point::max();
  std::unique_lock<std::mutex> lock(status_mutex_);
  while (!watchdog_stopping_) {
    status_changed_.wait_for(lock, options_.status_interval);
    if (watchdog_stopping_) break;
    const Status mine = status_;
    const uint64_t version = status_version_;
    const auto since = running_since_;
    lock.unlock();
    try {
      if (options_.check_collectives && version != published) {
        store_->set("accel_status/" + std::to_string(rank_), Encode(mine));
        published = version;
      }
      const auto now = std::chrono::steady_clock::now();
      if (mine.running && mine.sequence != checked_sequence) {
        checked_sequence = mine.sequence;
        next_check = since + options_.check_after;
      }
      if (mine.running && mine.sequence == checked_sequence &&
          now >= next_check) {
        next_check = now + options_.check_after;
        const std::vector<Status> statuses = ReadStatuses(mine);
        bool mismatch = false;
        int departed = -1;
        for (int r = 0; r < size_; ++r) {
          const Status& s = statuses[r];
          if (!s.departed.empty() && departed < 0) departed = r;
          mismatch |= Differs(s, mine);
        }
        if (mismatch || departed >= 0) {
          {
            std::lock_guard<std::mutex> relock(status_mutex_);
            if (status_.sequence == mine.sequence && status_.running) {
              abort_is_usage_ = mismatch;
              abort_rank_ = departed;
              abort_reason_ =
                  (mismatch ? "ranks called different collectives: "
                            : std::string()) +
                  DescribeRanks(statuses, mine, /*only_differing=*/true);
            }
          }
          Abort();
        }
      }
    } catch (const std::exception&) {
      // The store is gone or busy: the collective's own timeout still holds.
    }
    lock.lock();
  }
}

std::string Communicator::FindMismatch() {
  if (store_ == nullptr || size_ == 1) return "";
  try {
    Status mine;
    {
      std::lock_guard<std::mutex> lock(status_mutex_);
      mine = status_;
    }
    mine.running = true;
    const std::vector<Status> statuses = ReadStatuses(mine);
    for (const Status& s : statuses) {
      if (Differs(s, mine)) {
        return "ranks called different collectives: " +
               DescribeRanks(statuses, mine, /*only_differing=*/true);
      }
    }
  } catch (const std::exception&) {
    // Diagnosis is best effort.
  }
  return "";
}

void Communicator::Execute(Job& job) {
  const std::string what = Where() + job.op.api + " #" +
                           std::to_string(job.op.sequence) + " (" +
                           job.op.site.ToString() + "): ";
  if (broken_) {
    std::string cause = "unknown error";
    try {
      std::rethrow_exception(broken_);
    } catch (const std::exception& e) {
      cause = e.what();
    }
    job.done.set_exception(std::make_exception_ptr(PeerError(
        what + "not run because an earlier collective failed: " + cause)));
    return;
  }
  SetStatus(job.op, /*running=*/true);
  auto take_abort_reason = [&](bool* usage, int* rank) {
    std::lock_guard<std::mutex> lock(status_mutex_);
    std::string reason = std::move(abort_reason_);
    abort_reason_.clear();
    *usage = abort_is_usage_;
    *rank = abort_rank_;
    return reason;
  };
  try {
    job.task(job.op);
    SetStatus(job.op, /*running=*/false);
    job.done.set_value();
    return;
  } catch (const UsageError& e) {
    SetStatus(job.op, /*running=*/false);
    job.done.set_exception(
        std::make_exception_ptr(UsageError(what + e.what())));
    return;
  } catch (const std::exception& e) {
    SetStatus(job.op, /*running=*/false);
    bool usage = false;
    int aborted_for = -1;
    const std::string reason = take_abort_reason(&usage, &aborted_for);
    const bool timed_out = dynamic_cast<const TimeoutError*>(&e) != nullptr;
    const bool peer = dynamic_cast<const PeerError*>(&e) != nullptr;
    if (!reason.empty() && usage) {
      broken_ = std::make_exception_ptr(UsageError(what + reason));
    } else if (!reason.empty()) {
      broken_ = std::make_exception_ptr(PeerError(what + reason, aborted_for));
    } else if (std::string mismatch = FindMismatch(); !mismatch.empty()) {
      // A peer that found the mismatch first aborted, which is what failed
      // here: report the cause, not the closed connection.
      broken_ = std::make_exception_ptr(UsageError(what + mismatch));
    } else if (timed_out || peer) {
      int failed_rank =
          peer ? static_cast<const PeerError&>(e).failed_rank() : -1;
      std::string departed = DescribeDepartures(&failed_rank);
      std::string ranks;
      try {
        Status mine;
        {
          std::lock_guard<std::mutex> lock(status_mutex_);
          mine = status_;
        }
        mine.running = true;
        ranks = DescribeRanks(ReadStatuses(mine), mine,
                              /*only_differing=*/false);
      } catch (const std::exception&) {
        // Diagnosis is best effort.
      }
      if (timed_out && departed.empty()) {
        broken_ = std::make_exception_ptr(TimeoutError(
            what + "timed out after " + std::to_string(job.op.timeout.count()) +
            " ms" + (ranks.empty() ? "" : ": " + ranks) + " (" + e.what() +
            ")"));
      } else {
        broken_ = std::make_exception_ptr(
            PeerError(what + (departed.empty() ? "a peer failed" : departed) +
                          ": " + e.what(),
                      failed_rank));
      }
    } else {
      broken_ = std::make_exception_ptr(Error(what + e.what()));
    }
  }
  job.done.set_exception(broken_);
}

}  // namespace accel
