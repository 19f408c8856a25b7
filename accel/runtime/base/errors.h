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
class PeerError : public Error {
 public:
  explicit PeerError(const std::string& message, int failed_rank = -1)
      : Error(message), failed_rank_(failed_rank) {}
  int failed_rank() const { return failed_rank_; }

 private:
  int failed_rank_;
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

}  // namespace accel
