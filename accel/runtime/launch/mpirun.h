// What accel knows about MPI launchers without linking MPI: whether this
// process was started by one, and how to start a job with Open MPI's
// mpirun.
//
//   if (accel::StartedByMpiLauncher()) { /* --backend=auto picks "mpi" */ }
//   std::vector<std::string> command =
//       accel::MpirunCommand(4, {"./train", "--backend=mpi"}, {"MASTER_PORT"});
//   // {"mpirun", "-np", "4", ..., "-x", "MASTER_PORT", "./train", ...}
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace accel {

// Whether the environment shows an MPI launcher: Open MPI's mpirun
// (OMPI_COMM_WORLD_SIZE), or a PMI/PMIx one such as `srun --mpi=pmix`
// (PMIX_RANK, PMI_RANK). SLURM's own variables alone do not count: srun
// without an MPI plugin starts plain processes.
bool StartedByMpiLauncher(
    const std::function<const char*(const char*)>& getenv = nullptr);

// mpirun (or $ACCEL_MPIRUN) starting `program` as `num_processes` ranks on
// this machine, forwarding the variables named in `exported` (-x). As root
// it adds --allow-run-as-root; it always adds --oversubscribe (more ranks
// than cores is allowed, as with accel's own launcher) and --bind-to none
// (ranks may run several threads, as with accel's own launcher).
std::vector<std::string> MpirunCommand(
    int num_processes, const std::vector<std::string>& program,
    const std::vector<std::string>& exported);

}  // namespace accel
