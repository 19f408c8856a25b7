// torchrun's contract, which accel's own launcher, Kubernetes' PyTorchJob
// and hand-started ranks follow too.
#include <string>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/env/readers.h"
#include "accel/runtime/env/variables.h"

namespace accel::launch_env {

bool ReadTorchrun(const DistributedEnvironment::Lookup& lookup,
                  DistributedEnvironment* env) {
  Variables vars(lookup, "torchrun or accel launch");
  if (!vars.AllOrNone({"RANK", "WORLD_SIZE"})) return false;
  env->engine =
      vars.Get("TORCHELASTIC_RUN_ID") ? "torchrun" : "RANK/WORLD_SIZE";
  env->rank = vars.Int("RANK");
  env->world_size = vars.Int("WORLD_SIZE");
  env->local_rank = vars.OptionalInt("LOCAL_RANK").value_or(env->rank);
  env->local_world_size =
      vars.OptionalInt("LOCAL_WORLD_SIZE").value_or(env->world_size);
  const std::optional<int> group = vars.OptionalInt("GROUP_RANK");
  env->machine_rank =
      group
          ? *group
          : env->rank / (env->local_world_size > 0 ? env->local_world_size : 1);
  if (const char* restarts = vars.Get("TORCHELASTIC_RESTART_COUNT")) {
    env->restart_count = ParseInt("TORCHELASTIC_RESTART_COUNT", restarts);
  }
  const char* agent_store = vars.Get("TORCHELASTIC_USE_AGENT_STORE");
  env->use_agent_store =
      agent_store != nullptr && std::string(agent_store) == "True";
  if (const char* run_id = vars.Get("TORCHELASTIC_RUN_ID")) {
    env->job_id = std::string("torchrun-") + run_id;
  }
  return true;
}

}  // namespace accel::launch_env
