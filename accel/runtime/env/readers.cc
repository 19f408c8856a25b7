#include "accel/runtime/env/readers.h"

namespace accel::launch_env {

const std::vector<Reader>& Readers() {
  static const std::vector<Reader> readers = {
      {"torchrun", ReadTorchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK",
       "LOCAL_WORLD_SIZE", /*needs_master_variables=*/true},
      {"Open MPI", ReadOpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
       "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"PMI", ReadPmi, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
       "MPI_LOCALNRANKS"},
      {"SLURM", ReadSlurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
       "the tasks on this node (SLURM_STEP_TASKS_PER_NODE)"},
  };
  return readers;
}

}  // namespace accel::launch_env
