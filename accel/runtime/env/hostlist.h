// Expands SLURM's compressed host lists.
//
//   ExpandHostList("node[01-03,07],login")
//       == {"node01", "node02", "node03", "node07", "login"}
//   ExpandHostList("rack[1-2]-gpu[1-2]")
//       == {"rack1-gpu1", "rack1-gpu2", "rack2-gpu1", "rack2-gpu2"}
//
// Leading zeros set the width ("[08-10]" gives 08, 09, 10), as in
// `scontrol show hostnames`. A malformed list is a UsageError.
#pragma once

#include <string>
#include <vector>

namespace accel::launch_env {

std::vector<std::string> ExpandHostList(const std::string& list);

// Expands "2(x3),1" (SLURM_STEP_TASKS_PER_NODE) to {2, 2, 2, 1}.
std::vector<int> ExpandTasksPerNode(const std::string& list);

}  // namespace accel::launch_env
