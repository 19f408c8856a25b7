#include "accel/runtime/comm/communicator.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"
#include "accel/runtime/base/startup_trace.h"
#include "accel/runtime/comm/watchdog.h"

namespace accel {
namespace {

using Clock = std::chrono::steady_clock;

// Bound on each diagnostic store request: a rank 0 that stopped answering
// must not delay a timeout's message (nor hold up the watchdog) for long.
constexpr auto kDiagnosticRequestTimeout = std::chrono::milliseconds(2000);

// "0.123": milliseconds with microseconds, for --v=2.
std::string MillisecondsSince(Clock::time_point start) {
  char text[32];
  std::snprintf(
      text, sizeof(text), "%.3f",
      std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  return text;
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

Communicator::Communicator(std::unique_ptr<Transport> transport,
                           const BackendContext& context,
                           TransportFactory factory)
    : rank_(context.rank),
      size_(context.size),
      timeout_(context.options.timeout),
      checks_enabled_(context.options.check_collectives),
      context_(context),
      factory_(std::move(factory)),
      transport_(std::move(transport)) {
  if (transport_ == nullptr) {
    throw UsageError("Communicator: the backend made no transport");
  }
  Start(context);
}

Communicator::~Communicator() { Stop(); }

void Communicator::Start(const BackendContext& context) {
  watchdog_ = std::make_unique<Watchdog>(
      context,
      context.store
          ? context.store->WithRequestTimeout(kDiagnosticRequestTimeout)
          : nullptr,
      [this] { transport_->RequestAbort(); });
  worker_ = std::thread([this] { WorkerLoop(); });
}

void Communicator::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  work_available_.notify_all();
  if (worker_.joinable()) worker_.join();
  watchdog_.reset();
}

void Communicator::Interrupt(const std::string& reason) {
  if (watchdog_ != nullptr) watchdog_->Interrupt(reason);
}

void Communicator::Renew() {
  if (factory_ == nullptr || !transport_->renewable()) {
    FailUsage("renew", "the " + backend_name() +
                           " backend cannot rebuild its communicator after "
                           "an interrupted collective (MPI cannot cancel "
                           "one); use --backend=gloo");
  }
  // A collective still running here waits for ranks that have left it.
  transport_->RequestAbort();
  Stop();
  transport_.reset();
  ++generation_;
  // Keys of their own: the old generation's statuses, connection
  // addresses and interruption stay apart from the new one's.
  BackendContext context = context_;
  if (context.store != nullptr) {
    context.store = std::make_shared<PrefixStore>(
        "renewed/" + std::to_string(generation_), context_.store);
  }
  context.connect_timeout = std::chrono::milliseconds(0);
  transport_ = factory_(context);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.clear();
    next_sequence_ = 1;
    stopping_ = false;
    executing_ = false;
    broken_ = nullptr;
  }
  Start(context);
}

std::vector<std::string> Communicator::ExchangeThroughStore(
    const std::string& mine) {
  std::vector<std::string> values(size_);
  const std::string prefix = "exchange/" + std::to_string(++exchanges_) + "/";
  if (size_ == 1 || context_.store == nullptr) {
    values[rank_] = mine;
    return values;
  }
  Store& store = *context_.store;
  store.set(prefix + std::to_string(rank_), mine);
  std::vector<bool> have(size_, false);
  const auto deadline = Clock::now() + timeout_;
  while (true) {
    std::string missing;
    for (int r = 0; r < size_; ++r) {
      if (!have[r]) {
        if (std::optional<std::string> value =
                store.try_get(prefix + std::to_string(r))) {
          values[r] = std::move(*value);
          have[r] = true;
        } else {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
      }
    }
    if (missing.empty()) return values;
    for (const auto& [r, how] : store.departures()) {
      if (r != rank_ && !have[r]) {
        throw PeerError(Where() + "exchange through the store: rank " +
                            std::to_string(r) + " left the job first",
                        r);
      }
    }
    if (Clock::now() >= deadline) {
      throw TimeoutError(Where() + "exchange through the store: rank(s) " +
                         missing + " gave nothing within " +
                         std::to_string(timeout_.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

uint64_t Communicator::operations_started() {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_sequence_ - 1;
}

std::string Communicator::Where() const {
  return "[" + backend_name() + "] " + RankWhere(context_) + ": ";
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
      [=](const Op& op) {
        transport_->RunAllgather(op, input, output, count, dtype);
      },
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
        transport_->RunAllgatherv(op, input, output, counts, dtype);
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
      [=](const Op& op) {
        transport_->RunAllreduce(op, buffer, count, dtype, reduce_op);
      },
      mode, count * ElementSize(dtype));
}

std::shared_ptr<Work> Communicator::reduce_scatter_async(
    const void* input, void* output, std::vector<size_t> counts, DType dtype,
    ReduceOp reduce_op, const CollectiveOptions& options) {
  return StartReduceScatter(input, output, std::move(counts), dtype, reduce_op,
                            options, Mode::kAsync)
      .work;
}

uint64_t Communicator::reduce_scatter(const void* input, void* output,
                                      std::vector<size_t> counts, DType dtype,
                                      ReduceOp reduce_op,
                                      const CollectiveOptions& options) {
  return Finish(StartReduceScatter(input, output, std::move(counts), dtype,
                                   reduce_op, options, Mode::kBlocking));
}

Communicator::Started Communicator::StartReduceScatter(
    const void* input, void* output, std::vector<size_t> counts, DType dtype,
    ReduceOp reduce_op, const CollectiveOptions& options, Mode mode) {
  constexpr const char* kName = "reduce_scatter";
  if (counts.size() != static_cast<size_t>(size_)) {
    FailUsage(kName, "expected " + std::to_string(size_) +
                         " counts (one per rank), found " +
                         std::to_string(counts.size()));
  }
  if (!SupportsReduction(dtype, reduce_op)) {
    FailUsage(kName, std::string("reduction '") + ReduceOpName(reduce_op) +
                         "' is not defined for dtype " + DTypeName(dtype) +
                         "; use 'max' (logical or) or 'min' (logical and)");
  }
  const size_t element = ElementSize(dtype);
  size_t total = 0;
  size_t before = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) before = total;
    total += counts[r];
  }
  const size_t mine = counts[rank_];
  if ((total > 0 && input == nullptr) || (mine > 0 && output == nullptr)) {
    FailUsage(kName, "null buffer with non-zero counts");
  }
  // Another overlap would let this rank's result overwrite input that the
  // others have not read yet.
  const auto in_at = reinterpret_cast<uintptr_t>(input);
  const auto out_at = reinterpret_cast<uintptr_t>(output);
  if (mine > 0 && out_at != in_at + before * element &&
      out_at < in_at + total * element && in_at < out_at + mine * element) {
    FailUsage(kName,
              "output overlaps input but is not this rank's segment of it "
              "(elements " +
                  std::to_string(before) + " to " +
                  std::to_string(before + mine) + ")");
  }
  std::string signature = Concat({"reduce_scatter ", ReduceOpName(reduce_op),
                                  " ", DTypeName(dtype), " ["});
  for (int r = 0; r < size_; ++r) {
    signature += (r ? ", " : "") + std::to_string(counts[r]);
  }
  return Start(
      kName, options, signature + "]",
      [=, counts = std::move(counts)](const Op& op) {
        transport_->RunReduceScatter(op, input, output, counts, dtype,
                                     reduce_op);
      },
      mode, total * element);
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
      [=](const Op& op) {
        transport_->RunBroadcast(op, buffer, count, dtype, root);
      },
      mode, count * ElementSize(dtype));
}

std::shared_ptr<Work> Communicator::barrier_async(
    const CollectiveOptions& options) {
  return Start(
             "barrier", options, "barrier",
             [=](const Op& op) { transport_->RunBarrier(op); }, Mode::kAsync)
      .work;
}

uint64_t Communicator::barrier(const CollectiveOptions& options) {
  return Finish(Start(
      "barrier", options, "barrier",
      [=](const Op& op) { transport_->RunBarrier(op); }, Mode::kBlocking));
}

uint64_t Communicator::Finish(const Started& started) {
  if (started.work != nullptr) started.work->wait();
  return started.sequence;
}

std::string Communicator::DescribeCall(const CollectiveOptions& options,
                                       const char* name,
                                       uint64_t sequence) const {
  return Where() + (options.api != nullptr ? options.api : name) + " #" +
         std::to_string(sequence) + options.site.Parenthesized() + ": ";
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
      bool queued = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        executing_ = false;
        queued = !queue_.empty();
      }
      // Async work queued meanwhile waited for this call to finish. Only
      // then: a notify with nothing queued would wake the worker to find
      // nothing, a context switch per latency-bound call.
      if (queued) work_available_.notify_one();
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

// For the operations defined in communicator_groups.cc and
// communicator_all_to_all.cc, which pass their work as a Task.
template Communicator::Started Communicator::Start<Communicator::Task>(
    const char* name, const CollectiveOptions& options, std::string signature,
    Task&& task, Mode mode, size_t bytes);

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

template <typename Fn>
std::exception_ptr Communicator::Execute(Op& op, Fn& task) {
  if (broken_) return Failed(op, nullptr);
  op.started = Clock::now();
  watchdog_->Running(op);
  const bool traced = VLOG_IS_ON(2);
  const auto started = traced ? Clock::now() : Clock::time_point();
  try {
    task(op);
  } catch (const std::exception& e) {
    watchdog_->Finished(op, /*succeeded=*/false);
    ACCEL_VLOG(2) << Traced(op) << "failed after " << MillisecondsSince(started)
                  << " ms: " << e.what();
    return Failed(op, std::current_exception());
  } catch (...) {
    watchdog_->Finished(op, /*succeeded=*/false);
    return Failed(op, std::current_exception());
  }
  watchdog_->Finished(op, /*succeeded=*/true);
  if (op.sequence == 1) TraceStartup("first_collective");
  if (traced) {
    ACCEL_VLOG(2) << Traced(op) << MillisecondsSince(started) << " ms";
  }
  return nullptr;
}

std::string Communicator::Traced(const Op& op) const {
  return "[" + backend_name() + "] " + op.api + " #" +
         std::to_string(op.sequence) + op.site.Parenthesized() + ": " +
         op.signature + ", " + std::to_string(op.bytes) + " bytes, ";
}

std::exception_ptr Communicator::Failed(const Op& op,
                                        std::exception_ptr error) {
  const std::string what = Where() + op.api + " #" +
                           std::to_string(op.sequence) +
                           op.site.Parenthesized() + ": ";
  if (error == nullptr) {
    // The earlier failure first: it is the cause, and the line a reader of
    // several ranks' errors looks for.
    const std::string not_run = std::string("; then ") + op.api + " #" +
                                std::to_string(op.sequence) +
                                op.site.Parenthesized() +
                                ": not run because an earlier collective "
                                "failed (above)";
    try {
      std::rethrow_exception(broken_);
    } catch (const InterruptedError& e) {
      return std::make_exception_ptr(
          InterruptedError(e.what() + not_run, e.failed_rank()));
    } catch (const std::exception& e) {
      return std::make_exception_ptr(PeerError(e.what() + not_run));
    } catch (...) {
    }
    return std::make_exception_ptr(
        PeerError(Where() + "an unknown error" + not_run));
  }
  try {
    std::rethrow_exception(error);
  } catch (const UsageError& e) {
    return std::make_exception_ptr(UsageError(what + e.what()));
  } catch (const std::exception& e) {
    // The watchdog's verdict, when it aborted the call, is the cause.
    std::optional<Watchdog::Verdict> verdict = watchdog_->TakeVerdict();
    if (!verdict) verdict = watchdog_->ReadInterruption();
    if (verdict) {
      switch (verdict->kind) {
        case Watchdog::Verdict::Kind::kMismatch:
          broken_ = std::make_exception_ptr(UsageError(what + verdict->reason));
          break;
        case Watchdog::Verdict::Kind::kInterrupted:
          broken_ = std::make_exception_ptr(
              InterruptedError(what + verdict->reason, verdict->rank));
          break;
        case Watchdog::Verdict::Kind::kDeparted:
          broken_ = std::make_exception_ptr(
              PeerError(what + verdict->reason, verdict->rank));
          break;
      }
    } else {
      broken_ = watchdog_->Diagnose(what, op, e);
    }
  } catch (...) {
    broken_ = std::make_exception_ptr(
        Error(what + "failed with an exception that is not std::exception"));
  }
  try {
    std::rethrow_exception(broken_);
  } catch (const std::exception& e) {
    transport_->OnBroken(e.what());
  }
  return broken_;
}

}  // namespace accel
