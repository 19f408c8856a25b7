#include "accel/runtime/env/environment.h"

#include <cstdlib>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/env/env_value.h"
#include "accel/runtime/env/readers.h"
#include "accel/runtime/env/variables.h"

namespace accel {
namespace {

// "RANK must be in [0, WORLD_SIZE) = [0, 2), found 2".
void CheckIndex(const char* name, int value, const char* size_name, int size) {
  if (value < 0 || value >= size) {
    throw UsageError(std::string(name) + " must be in [0, " + size_name +
                     ") = [0, " + std::to_string(size) + "), found " +
                     std::to_string(value));
  }
}

void Validate(const launch_env::Reader& reader,
              const DistributedEnvironment& env) {
  if (env.world_size < 1) {
    throw UsageError(std::string(reader.world_size_variable) +
                     " must be at least 1, found " +
                     std::to_string(env.world_size));
  }
  CheckIndex(reader.rank_variable, env.rank, reader.world_size_variable,
             env.world_size);
  if (env.local_world_size < 1 || env.local_world_size > env.world_size) {
    throw UsageError(std::string(reader.local_world_size_variable) +
                     " must be in [1, " + reader.world_size_variable + "=" +
                     std::to_string(env.world_size) + "], found " +
                     std::to_string(env.local_world_size));
  }
  CheckIndex(reader.local_rank_variable, env.local_rank,
             reader.local_world_size_variable, env.local_world_size);
}

}  // namespace

DistributedEnvironment DistributedEnvironment::Parse(const Lookup& getenv) {
  DistributedEnvironment env;
  // Checked alone as in a job: the same variables give the same errors at
  // any number of processes.
  if (const char* secret = getenv("ACCEL_RUN_SECRET")) env.run_secret = secret;
  CheckEnvLength("ACCEL_RUN_SECRET", env.run_secret, kMaxRunSecretBytes);
  if (const char* job = getenv("ACCEL_JOB_ID")) env.job_id = job;
  CheckEnvLength("ACCEL_JOB_ID", env.job_id, kMaxJobIdBytes);
  CheckOmpNumThreads(getenv("OMP_NUM_THREADS"));
  const launch_env::Reader* matched = nullptr;
  for (const auto& reader : launch_env::Readers()) {
    if (reader.read(getenv, &env)) {
      matched = &reader;
      break;
    }
  }
  if (matched == nullptr) return env;
  env.launched = true;
  Validate(*matched, env);
  const char* addr = getenv("MASTER_ADDR");
  const char* port = getenv("MASTER_PORT");
  if (matched->needs_master_variables && env.world_size > 1 &&
      (addr == nullptr || port == nullptr)) {
    throw UsageError(
        std::string("environment variable ") +
        (addr == nullptr ? "MASTER_ADDR" : "MASTER_PORT") +
        " is missing; with WORLD_SIZE=" + std::to_string(env.world_size) +
        " rank 0's address and port are required (set by `bazel run "
        "//tools:launch`, torchrun, or a program's --num_processes flag)");
  }
  // Explicit settings beat what an engine implies.
  if (addr != nullptr) {
    env.master_addr = addr;
    if (env.master_addr.empty()) throw UsageError("MASTER_ADDR is empty");
  }
  if (port != nullptr) {
    env.master_port = launch_env::ParseInt("MASTER_PORT", port);
  }
  if (env.master_port < 1 || env.master_port > 65535) {
    throw UsageError("MASTER_PORT must be in [1, 65535], found " +
                     std::to_string(env.master_port));
  }
  if (const char* fd = getenv("ACCEL_STORE_LISTEN_FD")) {
    env.store_listen_fd = launch_env::ParseInt("ACCEL_STORE_LISTEN_FD", fd);
    if (env.store_listen_fd < 0) {
      throw UsageError(
          "environment variable ACCEL_STORE_LISTEN_FD must not be negative, "
          "found " +
          std::to_string(env.store_listen_fd));
    }
  }
  return env;
}

DistributedEnvironment DistributedEnvironment::FromProcess() {
  return Parse([](const char* name) { return std::getenv(name); });
}

}  // namespace accel
