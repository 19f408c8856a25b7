// The launch environment of one process: its rank, the job's size and
// where rank 0's rendezvous store is, read from whichever engine started
// it. Engines are tried in this order (the first whose variables are set
// wins; see launch_env/readers.h):
//
//   1. torchrun / accel launch / by hand: RANK, WORLD_SIZE, LOCAL_RANK,
//      LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
//      TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_USE_AGENT_STORE
//   2. Open MPI (mpirun): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK,
//      _LOCAL_SIZE
//   3. PMI (MPICH, Intel MPI): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
//      MPI_LOCALNRANKS
//   4. SLURM (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
//      SLURM_NODEID, SLURM_STEP_TASKS_PER_NODE, SLURM_JOB_NODELIST,
//      SLURM_JOB_ID, SLURM_STEP_ID
//
// MASTER_ADDR and MASTER_PORT, when set, override what an engine implies.
//
//   accel::DistributedEnvironment env =
//       accel::DistributedEnvironment::FromProcess();
//   if (!env.launched) { /* one process, no rendezvous */ }
//
// With none of the variables set the program is a single process. Missing
// or inconsistent values, or only part of an engine's set, are a UsageError
// that names the variables found and missing.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace accel {

struct DistributedEnvironment {
  bool launched = false;  // Whether an engine's variables were present.
  std::string engine;     // "torchrun", "Open MPI", "PMI", "SLURM", or "".
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  // This machine's index among the job's machines (GROUP_RANK,
  // SLURM_NODEID), or rank / local_world_size when the engine does not say.
  int machine_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string run_secret;  // ACCEL_RUN_SECRET.
  // Tells apart jobs that share a run secret: ACCEL_JOB_ID, else the
  // engine's job id (SLURM job and step, Open MPI's job id).
  std::string job_id;
  int restart_count = 0;
  // torchrun in its default mode: its agent already serves a c10d store on
  // MASTER_PORT, which every rank joins as a client.
  bool use_agent_store = false;
  // ACCEL_STORE_LISTEN_FD: a socket the launcher has been listening on
  // since it chose MASTER_PORT; rank 0 serves the store on it.
  int store_listen_fd = -1;
  // Things the user should know that are not errors ("SLURM allocated 4
  // tasks but srun did not start this process").
  std::vector<std::string> warnings;

  using Lookup = std::function<const char*(const char*)>;
  static DistributedEnvironment Parse(const Lookup& getenv);
  static DistributedEnvironment FromProcess();
};

}  // namespace accel
