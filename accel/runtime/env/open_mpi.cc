// Open MPI's mpirun sets OMPI_COMM_WORLD_* for each process it starts.
#include <string>

#include "accel/runtime/env/readers.h"
#include "accel/runtime/env/variables.h"

namespace accel::launch_env {

bool ReadOpenMpi(const DistributedEnvironment::Lookup& lookup,
                 DistributedEnvironment* env) {
  Variables vars(lookup, "Open MPI's mpirun");
  if (!vars.AllOrNone({"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                       "OMPI_COMM_WORLD_LOCAL_RANK",
                       "OMPI_COMM_WORLD_LOCAL_SIZE"})) {
    return false;
  }
  env->engine = "Open MPI";
  env->rank = vars.Int("OMPI_COMM_WORLD_RANK");
  env->world_size = vars.Int("OMPI_COMM_WORLD_SIZE");
  env->local_rank = vars.Int("OMPI_COMM_WORLD_LOCAL_RANK");
  env->local_world_size = vars.Int("OMPI_COMM_WORLD_LOCAL_SIZE");
  PlaceOnMachines(vars, "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE",
                  "mpirun -x MASTER_ADDR=host0 ...", env);
  // Every rank derives the same port from the job id, as Lightning does on
  // SLURM, so that two mpirun jobs on one host do not collide.
  if (const char* job = vars.Get("OMPI_MCA_ess_base_jobid")) {
    env->job_id = std::string("ompi-") + job;
    env->master_port = PortFromJobId(job);
  }
  return true;
}

}  // namespace accel::launch_env
