// Typed access to a process's environment for the launch-environment
// readers, with errors that name the variable and the engine.
//
//   accel::launch_env::Variables vars(lookup, "SLURM");
//   if (!vars.AllOrNone({"SLURM_PROCID", "SLURM_NTASKS"})) return false;
//   int rank = vars.Int("SLURM_PROCID");
#pragma once

#include <initializer_list>
#include <optional>
#include <string>

#include "accel/runtime/env/environment.h"

namespace accel::launch_env {

class Variables {
 public:
  Variables(const DistributedEnvironment::Lookup& lookup, std::string engine)
      : lookup_(lookup), engine_(std::move(engine)) {}

  // The value, or null when unset.
  const char* Get(const char* name) const { return lookup_(name); }

  // False when none of `names` is set, true when all are. A partial set
  // means the process was started by this engine but cannot be placed: a
  // UsageError that lists what was found and what is missing.
  bool AllOrNone(std::initializer_list<const char*> names) const;

  // A required integer; UsageError when unset or not an integer.
  int Int(const char* name) const;
  std::optional<int> OptionalInt(const char* name) const;

  const std::string& engine() const { return engine_; }

 private:
  const DistributedEnvironment::Lookup& lookup_;
  std::string engine_;
};

// For MPI launchers, which do not say where rank 0 runs: sets
// env->machine_rank from the local size, and on several machines requires
// MASTER_ADDR (UsageError naming the sizes and `how_to_pass` it on).
void PlaceOnMachines(const Variables& vars, const char* local_size_variable,
                     const char* size_variable, const std::string& how_to_pass,
                     DistributedEnvironment* env);

// Parses `text` as a decimal int; UsageError naming `name` otherwise.
int ParseInt(const char* name, const char* text);

// The port Lightning derives from a job id, so that every rank of a job
// agrees on it without talking: 15000 + the id's last four digits.
int PortFromJobId(const std::string& job_id);

}  // namespace accel::launch_env
