// One reader per engine that can start the ranks of a job, tried in order
// by DistributedEnvironment::Parse (the order is documented in
// environment.h and docs/launching.md).
//
//   for (const auto& reader : accel::launch_env::Readers()) {
//     if (reader.read(lookup, &env)) break;
//   }
//
// A reader returns false when none of its engine's variables are set, fills
// `env` (rank, sizes, master address and port, job id) and returns true
// when they all are, and throws UsageError naming what it found and what is
// missing when only some are. Checks common to all engines (ranges, ports)
// are Parse's.
//
// To support another engine, write a reader in its own file and add it to
// Readers() where its variables are most specific.
#pragma once

#include <vector>

#include "accel/runtime/env/environment.h"

namespace accel::launch_env {

struct Reader {
  const char* engine;
  bool (*read)(const DistributedEnvironment::Lookup& lookup,
               DistributedEnvironment* env);
  // The variables behind rank, world_size, local_rank and local_world_size,
  // for messages about out-of-range values.
  const char* rank_variable;
  const char* world_size_variable;
  const char* local_rank_variable;
  const char* local_world_size_variable;
  // Whether MASTER_ADDR and MASTER_PORT must be set when world_size > 1
  // (other engines imply them).
  bool needs_master_variables = false;
};

bool ReadTorchrun(const DistributedEnvironment::Lookup& lookup,
                  DistributedEnvironment* env);
bool ReadOpenMpi(const DistributedEnvironment::Lookup& lookup,
                 DistributedEnvironment* env);
bool ReadPmi(const DistributedEnvironment::Lookup& lookup,
             DistributedEnvironment* env);
bool ReadSlurm(const DistributedEnvironment::Lookup& lookup,
               DistributedEnvironment* env);

// Most specific first: variables set for this very process by a launcher
// beat those it may have inherited from an allocation (mpirun inside an
// sbatch job inherits SLURM_PROCID from the batch step).
const std::vector<Reader>& Readers();

}  // namespace accel::launch_env
