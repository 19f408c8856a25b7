// srun's variables. Only a job step started by srun counts: a batch script
// (sbatch) or an salloc shell also sees SLURM_PROCID=0 and SLURM_NTASKS, but
// it is one process, not rank 0 of many.
#include <string>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/env/hostlist.h"
#include "accel/runtime/env/readers.h"
#include "accel/runtime/env/variables.h"

namespace accel::launch_env {
namespace {

// Step ids SLURM gives to what srun did not start: the batch script, the
// extern step and an interactive step (SLURM_BATCH_SCRIPT and friends).
bool IsSrunStep(const std::string& step_id) {
  return step_id != "4294967294" && step_id != "4294967295" &&
         step_id != "4294967292" && step_id != "batch" && step_id != "extern";
}

}  // namespace

bool ReadSlurm(const DistributedEnvironment::Lookup& lookup,
               DistributedEnvironment* env) {
  Variables vars(lookup, "SLURM's srun");
  const char* step = vars.Get("SLURM_STEP_ID");
  if (step == nullptr) step = vars.Get("SLURM_STEPID");
  if (step == nullptr || !IsSrunStep(step)) {
    const std::optional<int> tasks = vars.OptionalInt("SLURM_NTASKS");
    if (vars.Get("SLURM_JOB_ID") != nullptr && tasks && *tasks > 1) {
      env->warnings.push_back(
          "SLURM allocated " + std::to_string(*tasks) +
          " tasks (SLURM_NTASKS) but srun did not start this process (no "
          "SLURM_STEP_ID): it runs as one process; start it with `srun " +
          std::string("PROGRAM`") + " to run one rank per task");
    }
    return false;
  }
  const char* tasks_per_node = vars.Get("SLURM_STEP_TASKS_PER_NODE");
  const char* tasks_per_node_name = "SLURM_STEP_TASKS_PER_NODE";
  if (tasks_per_node == nullptr && vars.Get("SLURM_TASKS_PER_NODE")) {
    tasks_per_node = vars.Get("SLURM_TASKS_PER_NODE");
    tasks_per_node_name = "SLURM_TASKS_PER_NODE";
  }
  const char* ntasks_name = vars.Get("SLURM_STEP_NUM_TASKS")
                                ? "SLURM_STEP_NUM_TASKS"
                                : "SLURM_NTASKS";
  const char* nodelist_name = vars.Get("SLURM_STEP_NODELIST")
                                  ? "SLURM_STEP_NODELIST"
                                  : "SLURM_JOB_NODELIST";
  const std::string step_id = step;
  if (!vars.AllOrNone({"SLURM_PROCID", ntasks_name, "SLURM_LOCALID",
                       "SLURM_NODEID", tasks_per_node_name, nodelist_name,
                       "SLURM_JOB_ID"})) {
    // AllOrNone found none: still a partial set, since the step id is set.
    throw UsageError(
        "this process looks started by SLURM's srun (found SLURM_STEP_ID=" +
        step_id +
        ") but SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, "
        "SLURM_STEP_TASKS_PER_NODE, SLURM_JOB_NODELIST and SLURM_JOB_ID are "
        "missing, so its place in the job is unknown");
  }
  env->engine = "SLURM";
  env->rank = vars.Int("SLURM_PROCID");
  env->world_size = vars.Int(ntasks_name);
  env->local_rank = vars.Int("SLURM_LOCALID");
  env->machine_rank = vars.Int("SLURM_NODEID");
  const std::vector<int> per_node = ExpandTasksPerNode(tasks_per_node);
  if (env->machine_rank < 0 ||
      env->machine_rank >= static_cast<int>(per_node.size())) {
    throw UsageError("SLURM_NODEID=" + std::to_string(env->machine_rank) +
                     " has no entry in " + tasks_per_node_name + "=" +
                     tasks_per_node);
  }
  env->local_world_size = per_node[env->machine_rank];
  const std::vector<std::string> hosts =
      ExpandHostList(vars.Get(nodelist_name));
  // Tasks are placed node by node, so rank 0 runs on the first host.
  env->master_addr = hosts.front();
  const std::string job = vars.Get("SLURM_JOB_ID");
  env->master_port = PortFromJobId(job);
  env->job_id = "slurm-" + job + "." + step_id;
  return true;
}

}  // namespace accel::launch_env
