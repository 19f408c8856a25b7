// The MPI backend: accel's Communicator over MPI (Open MPI from Debian), for
// jobs that an MPI launcher starts.
//
//   $ mpirun -np 4 ./train                     # --backend=auto picks mpi
//   $ srun -n 4 --mpi=pmix ./train --backend=mpi
//   $ ./train --num_processes=4 --backend=mpi  # accel's launcher runs mpirun
//
//   auto comm = accel::CreateCommunicator("mpi", context);  // MPI_COMM_WORLD
//   auto mine = accel::MakeMpiCommunicator(context, comm);  // the caller's
//   mine->allreduce(data, n, accel::DType::kFloat32, accel::ReduceOp::kSum);
//
// Registered as "mpi". Programs that let accel set up the job need nothing
// else: ranks come from MPI and rank 0 tells the others where its store is
// (MpiRuntime::JobEnvironment). The store carries what accel adds to MPI:
// each rank's current call for the watchdog and the diagnostics.
//
// MPI thread level: accel runs collectives on its worker thread (or on the
// caller's when nothing is queued), one at a time per communicator, so it
// needs MPI_THREAD_SERIALIZED; see mpi_runtime.h for who initializes MPI and
// how calls from several communicators are kept apart.
//
// Mismatched calls: MPI pairs collectives by order alone, so a rank in a
// different call could exchange data with this one. With collective checks
// on (the default), the ranks first compare their calls in one 16-byte
// allreduce and, on a difference, move nothing: the watchdog then names
// each rank's call as for the other backends.
//
// Failures: each collective starts as MPI's non-blocking form
// (MPI_Iallreduce, ...) and this rank polls it, so that the per-call timeout
// and the watchdog (mismatched calls, a rank that left) notice a hang. But
// MPI cannot cancel a started collective, and the job cannot go on with one
// pending, so the failing rank prints the usual message (backend, rank,
// call, call site, what each rank is doing) on stderr, waits a moment for
// the other ranks that found the failure to print theirs, and ends the job
// with MPI_Abort. The caller never sees the exception.
//
// Buffers are host memory. float16 and bfloat16 reductions use accel's own
// (MPI has no such types); the others use MPI's built-in operations. Counts
// above INT_MAX elements are a UsageError (MPI counts are int).
#pragma once

#include <mpi.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "accel/runtime/comm/communicator.h"
#include "accel/runtime/comm/transport.h"
#include "accel/runtime/store/store.h"

namespace accel {

// A Communicator over a copy of the caller's MPI communicator, whose rank
// and size must match the context's.
std::unique_ptr<Communicator> MakeMpiCommunicator(const BackendContext& context,
                                                  MPI_Comm comm);

class MpiTransport : public Transport {
 public:
  // Over a copy of MPI_COMM_WORLD.
  explicit MpiTransport(const BackendContext& context);
  // Over a copy of `comm`, whose rank and size must match the context's.
  MpiTransport(const BackendContext& context, MPI_Comm comm);
  ~MpiTransport() override;

  std::string backend_name() const override { return "mpi"; }

 protected:
  void RunAllgather(const Op& op, const void* input, void* output, size_t count,
                    DType dtype) override;
  void RunAllgatherv(const Op& op, const void* input, void* output,
                     const std::vector<size_t>& counts, DType dtype) override;
  void RunAllreduce(const Op& op, void* buffer, size_t count, DType dtype,
                    ReduceOp reduce_op) override;
  // MPI_Ireduce_scatter.
  void RunReduceScatter(const Op& op, const void* input, void* output,
                        const std::vector<size_t>& counts, DType dtype,
                        ReduceOp reduce_op) override;
  void RunBroadcast(const Op& op, void* buffer, size_t count, DType dtype,
                    int root) override;
  void RunBarrier(const Op& op) override;
  void RunAllToAll(const Op& op, const void* input, void* output,
                   const std::vector<size_t>& counts, DType dtype) override;
  // MPI_Comm_split of this transport's communicator (every rank calls it).
  std::unique_ptr<Transport> MakeGroup(
      const Op& op, const BackendContext* group, int color, int key,
      const TransportFactory& factory) override;
  void Abort() override;
  [[noreturn]] void OnBroken(const std::string& message) override;
  bool renewable() const override { return false; }

 private:
  // Starts a non-blocking collective under the MPI lock and polls it until
  // it completes, the deadline passes or Abort() is called.
  template <typename StartCall>
  void Run(const Op& op, StartCall&& start);
  template <typename StartCall>
  void Poll(std::chrono::steady_clock::time_point deadline, StartCall&& start);
  // MPI matches collectives by order alone: a rank in a different call
  // could exchange data with it. Before the transfer, the ranks compare
  // their calls (one 16-byte allreduce); on a difference nothing moves.
  void CheckSameCall(const Op& op,
                     std::chrono::steady_clock::time_point deadline);
  MPI_Datatype ElementType(DType dtype) const;
  MPI_Op Operation(DType dtype, ReduceOp op) const;
  int Count(size_t count) const;  // UsageError above INT_MAX

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::shared_ptr<Store> store_;
  std::chrono::milliseconds check_after_;
  const bool compare_calls_;  // CommunicatorOptions::check_collectives
  // accel's own reductions for float16 and bfloat16, per ReduceOp.
  std::vector<MPI_Op> half_ops_;
  std::vector<MPI_Op> bfloat16_ops_;
  std::atomic<bool> aborted_{false};
};

}  // namespace accel
