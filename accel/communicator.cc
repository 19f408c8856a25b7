#include "accel/communicator.h"

#include <algorithm>

#include "accel/errors.h"

namespace accel {
namespace {

// How long a rank that saw a broken connection waits for the store to notice
// which process went away: the data path usually fails first.
constexpr auto kDepartureGrace = std::chrono::milliseconds(2000);

}  // namespace

Communicator::Communicator(const BackendContext& context)
    : rank_(context.rank),
      size_(context.size),
      timeout_(context.options.timeout),
      store_(context.store) {
  worker_ = std::thread([this] { WorkerLoop(); });
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
  return Start(
      "allgatherv", options,
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
      [=](const Op& op) { RunBroadcast(op, buffer, count, dtype, root); },
      mode);
}

std::shared_ptr<Work> Communicator::barrier_async(
    const CollectiveOptions& options) {
  return Start(
      "barrier", options, [=](const Op& op) { RunBarrier(op); }, Mode::kAsync);
}

void Communicator::barrier(const CollectiveOptions& options) {
  Start(
      "barrier", options, [=](const Op& op) { RunBarrier(op); },
      Mode::kBlocking)
      ->wait();
}

std::shared_ptr<Work> Communicator::Start(const char* name,
                                          const CollectiveOptions& options,
                                          Task task, Mode mode) {
  if (options.timeout.count() < 0) {
    FailUsage(name, "timeout must not be negative, found " +
                        std::to_string(options.timeout.count()) + " ms");
  }
  auto job = std::make_unique<Job>();
  job->op.name = name;
  job->op.timeout = options.timeout.count() > 0 ? options.timeout : timeout_;
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

void Communicator::ThrowIfPeerDeparted() {
  if (store_ == nullptr) return;
  std::map<int, std::string> departed;
  try {
    departed = store_->departures();
  } catch (const Error&) {
    throw PeerError(
        "rank 0 is unreachable (it hosts the rendezvous store, so "
        "it crashed or exited)",
        0);
  }
  departed.erase(rank_);
  if (departed.empty()) return;
  const auto& [rank, how] = *departed.begin();
  throw PeerError("rank " + std::to_string(rank) + " " + how +
                      " (its process left the job)",
                  rank);
}

void Communicator::Execute(Job& job) {
  const std::string what =
      Where() + job.op.name + " #" + std::to_string(job.op.sequence) + ": ";
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
  try {
    job.task(job.op);
    job.done.set_value();
    return;
  } catch (const UsageError& e) {
    job.done.set_exception(
        std::make_exception_ptr(UsageError(what + e.what())));
    return;
  } catch (const TimeoutError& e) {
    int failed_rank = -1;
    const std::string departed = DescribeDepartures(&failed_rank);
    if (departed.empty()) {
      broken_ = std::make_exception_ptr(TimeoutError(
          what + "timed out after " + std::to_string(job.op.timeout.count()) +
          " ms: " + e.what()));
    } else {
      broken_ = std::make_exception_ptr(
          PeerError(what + departed + "; " + e.what(), failed_rank));
    }
  } catch (const PeerError& e) {
    int failed_rank = e.failed_rank();
    const std::string departed = DescribeDepartures(&failed_rank);
    broken_ = std::make_exception_ptr(
        PeerError(what + (departed.empty() ? "a peer failed" : departed) +
                      ": " + e.what(),
                  failed_rank));
  } catch (const std::exception& e) {
    broken_ = std::make_exception_ptr(Error(what + e.what()));
  }
  job.done.set_exception(broken_);
}

}  // namespace accel
