// The launch environment of one process, with torchrun's contract: RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (plus
// accel's ACCEL_RUN_SECRET and torchelastic's TORCHELASTIC_RESTART_COUNT).
//
//   accel::DistributedEnvironment env =
//       accel::DistributedEnvironment::FromProcess();
//   if (!env.launched) { /* one process, no rendezvous */ }
//
// With none of the variables set the program is a single process. Missing or
// inconsistent values are a UsageError that names the variable.
#pragma once

#include <functional>
#include <string>

namespace accel {

struct DistributedEnvironment {
  bool launched = false;  // Whether RANK/WORLD_SIZE were present.
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string run_secret;
  int restart_count = 0;

  using Lookup = std::function<const char*(const char*)>;
  static DistributedEnvironment Parse(const Lookup& getenv);
  static DistributedEnvironment FromProcess();
};

}  // namespace accel
