// The PMI variables of MPICH's and Intel MPI's Hydra launcher (mpiexec).
#include <string>

#include "accel/runtime/env/readers.h"
#include "accel/runtime/env/variables.h"

namespace accel::launch_env {

bool ReadPmi(const DistributedEnvironment::Lookup& lookup,
             DistributedEnvironment* env) {
  Variables vars(lookup, "an MPI launcher with PMI (MPICH, Intel MPI)");
  if (!vars.AllOrNone({"PMI_RANK", "PMI_SIZE"})) return false;
  env->engine = "PMI";
  env->rank = vars.Int("PMI_RANK");
  env->world_size = vars.Int("PMI_SIZE");
  if (vars.AllOrNone({"MPI_LOCALRANKID", "MPI_LOCALNRANKS"})) {
    env->local_rank = vars.Int("MPI_LOCALRANKID");
    env->local_world_size = vars.Int("MPI_LOCALNRANKS");
  } else {
    env->local_rank = env->rank;
    env->local_world_size = env->world_size;
  }
  PlaceOnMachines(vars, "MPI_LOCALNRANKS", "PMI_SIZE",
                  "mpiexec -genv MASTER_ADDR host0 ...", env);
  return true;
}

}  // namespace accel::launch_env
