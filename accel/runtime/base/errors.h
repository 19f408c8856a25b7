// The exceptions every accel layer throws. Catch accel::Error for all of them.
//
//   try {
//     comm.allreduce(buf, n, accel::DType::kFloat32, accel::ReduceOp::kSum);
//   } catch (const accel::PeerError& e) {
//     LOG(ERROR) << e.what() << " (failed rank " << e.failed_rank() << ")";
//   }
//
// Messages name the backend, the operation, this rank, and what was expected
// versus what was found, so that a user can act on them without a debugger.
#pragma once

#include <stdexcept>
#include <string>

namespace accel {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// The caller passed something invalid (bad argument, unknown backend, bad
// environment). Retrying the same call cannot succeed.
class UsageError : public Error {
 public:
  using Error::Error;
};

// An operation did not complete within its timeout.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// Another process of the job failed or went away. failed_rank() is the rank
// that failed when it is known, else -1.
// The exit code of a rank whose error was another rank's failure (a
// PeerError that ended it): launchers tell the cause from its consequences
// by it, and blame the rank that failed first (see ExitCodeFor in
// error_report.h).
inline constexpr int kPeerFailedExitCode = 76;

class PeerError : public Error {
 public:
  explicit PeerError(const std::string& message, int failed_rank = -1)
      : Error(message), failed_rank_(failed_rank) {}
  int failed_rank() const { return failed_rank_; }

 private:
  int failed_rank_;
};

// A peer's machine stopped answering on the network (its connections time
// out instead of closing): the rank is cut off, not known to be gone.
class UnreachableError : public PeerError {
 public:
  using PeerError::PeerError;
};

// Another rank interrupted the collectives on purpose (Communicator::
// Interrupt), to start the work again on every rank: find_executable_batch_
// size does when one rank ran out of memory. failed_rank() is that rank.
class InterruptedError : public PeerError {
 public:
  using PeerError::PeerError;
};

// A checkpoint is missing, partial, corrupt or does not match the model.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// A data set's get() or a collate function failed: the message says where
// (data loader, epoch, sample), and the original exception is nested
// (std::rethrow_if_nested gets it back).
class DataError : public Error {
 public:
  using Error::Error;
};

// Rethrows the exception in flight with `prefix` before its message,
// keeping its accel type and, for a PeerError, its failed rank (anything
// else becomes an Error); call it in a catch block. Every backend rethrows
// through it, so a peer's failure keeps its rank whichever backend ran.
//
//   } catch (const Error& e) {
//     RethrowWithPrefix(Where() + "connecting to the other ranks failed: ");
//   }
[[noreturn]] inline void RethrowWithPrefix(const std::string& prefix) {
  try {
    throw;
  } catch (const UsageError& e) {
    throw UsageError(prefix + e.what());
  } catch (const TimeoutError& e) {
    throw TimeoutError(prefix + e.what());
  } catch (const UnreachableError& e) {
    throw UnreachableError(prefix + e.what(), e.failed_rank());
  } catch (const InterruptedError& e) {
    throw InterruptedError(prefix + e.what(), e.failed_rank());
  } catch (const PeerError& e) {
    throw PeerError(prefix + e.what(), e.failed_rank());
  } catch (const CheckpointError& e) {
    throw CheckpointError(prefix + e.what());
  } catch (const DataError& e) {
    throw DataError(prefix + e.what());
  } catch (const std::exception& e) {
    throw Error(prefix + e.what());
  }
}

}  // namespace accel
