#include "accel/memory.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <new>
#include <system_error>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/host_memory.h"
#include "accel/runtime/base/logging.h"

namespace accel::internal {
namespace {

// How a try ended on a rank, as the ranks exchange it.
enum class Ending { kReturned, kOutOfMemory, kInterrupted, kFailed };

const char* Code(Ending ending) {
  switch (ending) {
    case Ending::kReturned:
      return "returned";
    case Ending::kOutOfMemory:
      return "out_of_memory";
    case Ending::kInterrupted:
      return "interrupted";
    case Ending::kFailed:
      return "failed";
  }
  return "failed";
}

Ending Parse(const std::string& code) {
  for (Ending ending : {Ending::kReturned, Ending::kOutOfMemory,
                        Ending::kInterrupted, Ending::kFailed}) {
    if (code == Code(ending)) return ending;
  }
  return Ending::kFailed;
}

// Whether `error` or an exception nested in it satisfies `is`.
template <typename Predicate>
bool AnyNested(std::exception_ptr error, const Predicate& is) {
  while (error != nullptr) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      if (is(e)) return true;
      try {
        std::rethrow_if_nested(e);
        return false;
      } catch (...) {
        error = std::current_exception();
      }
    } catch (...) {
      return false;
    }
  }
  return false;
}

std::string Message(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    // Without LibTorch's stack trace: tens of lines per rank and try.
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not std::exception";
  }
}

}  // namespace

bool IsOutOfMemory(std::exception_ptr error) {
  return AnyNested(error, [](const std::exception& e) {
    // LibTorch's CPU allocator throws c10::Error with this text (CUDA's
    // says "out of memory"); it has no exception type of its own for it.
    if (const auto* system = dynamic_cast<const std::system_error*>(&e)) {
      // A thread that could not be started for want of memory (its stack
      // is refused under a memory limit): std::thread says EAGAIN.
      const std::error_code code = system->code();
      return code == std::errc::resource_unavailable_try_again ||
             code == std::errc::not_enough_memory;
    }
    return dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
           std::strstr(e.what(), "can't allocate memory") != nullptr ||
           std::strstr(e.what(), "CUDA out of memory") != nullptr;
  });
}

void BatchSizeTry::Failed(std::exception_ptr error) {
  error_ = error;
  out_of_memory_ = IsOutOfMemory(error);
  interrupted_ =
      !out_of_memory_ && AnyNested(error, [](const std::exception& e) {
        return dynamic_cast<const InterruptedError*>(&e) != nullptr;
      });
  if (interrupted_) return;
  // The others may wait in collectives this rank will not call.
  accelerator_.communicator().Interrupt(
      out_of_memory_
          ? "it ran out of memory at batch size " +
                std::to_string(batch_size_) + "; every rank tries a smaller one"
          : "find_executable_batch_size: it failed at batch size " +
                std::to_string(batch_size_));
}

bool BatchSizeTry::Agree() {
  Communicator& comm = accelerator_.communicator();
  const Ending mine = error_ == nullptr ? Ending::kReturned
                      : out_of_memory_  ? Ending::kOutOfMemory
                      : interrupted_    ? Ending::kInterrupted
                                        : Ending::kFailed;
  const std::vector<std::string> all = comm.ExchangeThroughStore(
      std::string(Code(mine)) + "\n" +
      (error_ != nullptr ? Message(error_) : std::string()));
  int failed = -1;
  std::string failure;
  std::string out_of_memory;  // "0, 2"
  std::string first_message;
  bool interrupted = false;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const size_t newline = all[r].find('\n');
    const Ending ending = Parse(all[r].substr(0, newline));
    const std::string message =
        newline == std::string::npos ? "" : all[r].substr(newline + 1);
    if (ending == Ending::kFailed && failed < 0) {
      failed = r;
      failure = message;
    } else if (ending == Ending::kOutOfMemory) {
      if (out_of_memory.empty()) first_message = message;
      out_of_memory += (out_of_memory.empty() ? "" : ", ") + std::to_string(r);
    }
    interrupted |= ending == Ending::kInterrupted;
  }
  const std::string where = "find_executable_batch_size at batch size " +
                            std::to_string(batch_size_) + ": ";
  if (failed < 0 && out_of_memory.empty() && !interrupted) return true;
  if (failed >= 0 || out_of_memory.empty()) {
    if (failed == comm.rank()) std::rethrow_exception(error_);
    if (failed < 0) {
      throw PeerError(where +
                      "a collective was interrupted, but no rank ran "
                      "out of memory");
    }
    throw PeerError(where + "rank " + std::to_string(failed) +
                        " failed, so every rank stops: " + failure,
                    failed);
  }
  const std::string returned = ReturnFreedHostMemory();
  if (accelerator_.is_main_process()) {
    ACCEL_LOG(WARNING) << where << "rank(s) " << out_of_memory
                       << " ran out of memory (" << first_message
                       << "); every rank tries a smaller batch size ("
                       << returned << ")";
  }
  comm.Renew();
  return false;
}

void StartSearch() {
  const std::string returned = ReturnFreedHostMemory();
  ACCEL_VLOG(1) << "find_executable_batch_size: " << returned;
}

int64_t NextBatchSize(const ExecutableBatchSizeOptions& options,
                      int64_t batch_size) {
  const int64_t next = options.reduce_batch_size
                           ? options.reduce_batch_size(batch_size)
                           : static_cast<int64_t>(batch_size * 0.9);
  if (next >= batch_size) {
    throw UsageError("find_executable_batch_size: reduce_batch_size(" +
                     std::to_string(batch_size) + ") returned " +
                     std::to_string(next) + ", expected a smaller size");
  }
  return next;
}

void NoBatchSizeLeft(const std::vector<int64_t>& tried) {
  std::string sizes;
  for (int64_t size : tried) {
    sizes += (sizes.empty() ? "" : ", ") + std::to_string(size);
  }
  throw Error(
      "find_executable_batch_size: no executable batch size found, reached "
      "zero; a rank ran out of memory at every size tried (" +
      sizes + ")");
}

}  // namespace accel::internal
