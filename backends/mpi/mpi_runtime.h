// The process's MPI library: initialized once, with the thread level accel
// needs, and finalized at exit only when accel initialized it.
//
//   accel::MpiRuntime& mpi = accel::MpiRuntime::Get();  // MPI_Init_thread
//   {
//     auto lock = mpi.Lock();                           // around MPI calls
//     MPI_Comm_rank(MPI_COMM_WORLD, &rank);
//   }
//
// As with Gloo's gloo/mpi/context.h, there are two cases: a program that
// never calls MPI itself lets accel own MPI (MPI_Init_thread on first use,
// MPI_Finalize at exit); a program that initialized MPI keeps owning it
// (accel borrows it and never finalizes it), and must have asked for
// MPI_THREAD_SERIALIZED at least, since accel calls MPI from its worker
// thread.
//
// Thread level: accel asks for MPI_THREAD_SERIALIZED (MULTIPLE costs locks
// inside the library on every call) and itself makes every MPI call of the
// process under one lock, so several communicators on different threads are
// safe. A program that also calls MPI from other threads at the same time
// must initialize MPI with MPI_THREAD_MULTIPLE itself.
#pragma once

#include <mutex>

#include "accel/runtime/env/environment.h"

namespace accel {

class MpiRuntime {
 public:
  // Initializes MPI unless the program did. UsageError when MPI is already
  // finalized or gives less than MPI_THREAD_SERIALIZED.
  static MpiRuntime& Get();

  // Held around every MPI call.
  std::unique_lock<std::mutex> Lock() {
    return std::unique_lock<std::mutex>(mutex_);
  }
  bool owned() const { return owned_; }  // accel called MPI_Init_thread
  int thread_level() const { return level_; }

  // The job as MPI sees it (registered as the "mpi" backend's environment,
  // registry.h): rank, world size and local rank from MPI_COMM_WORLD, and
  // rank 0's rendezvous store address, port and secret sent to every rank
  // (from MASTER_ADDR, MASTER_PORT and ACCEL_RUN_SECRET when set, else
  // chosen by rank 0), so that a plain `mpirun -np 4 program` needs no
  // other set-up. RANK and WORLD_SIZE, when set, must agree with MPI.
  static DistributedEnvironment JobEnvironment(
      const DistributedEnvironment& env);

 private:
  MpiRuntime();
  std::mutex mutex_;
  bool owned_ = false;
  int level_ = 0;
};

}  // namespace accel
