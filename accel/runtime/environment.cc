#include "accel/runtime/environment.h"

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "accel/runtime/errors.h"

namespace accel {
namespace {

const char* const kHint =
    " (set by `bazel run //tools:launch`, torchrun, or a program's "
    "--num_processes flag)";

int ParseInt(const char* name, const char* text) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || errno != 0 ||
      value < std::numeric_limits<int>::min() ||
      value > std::numeric_limits<int>::max()) {
    throw UsageError(std::string("environment variable ") + name +
                     " must be an integer, found '" + text + "'");
  }
  return static_cast<int>(value);
}

}  // namespace

DistributedEnvironment DistributedEnvironment::Parse(const Lookup& getenv) {
  DistributedEnvironment env;
  const char* rank = getenv("RANK");
  const char* world_size = getenv("WORLD_SIZE");
  if (rank == nullptr && world_size == nullptr) return env;
  if (rank == nullptr || world_size == nullptr) {
    throw UsageError(
        std::string("environment variable ") +
        (rank == nullptr ? "RANK" : "WORLD_SIZE") + " is missing while " +
        (rank == nullptr ? "WORLD_SIZE" : "RANK") + " is set" + kHint);
  }
  env.launched = true;
  env.world_size = ParseInt("WORLD_SIZE", world_size);
  env.rank = ParseInt("RANK", rank);
  if (env.world_size < 1) {
    throw UsageError("WORLD_SIZE must be at least 1, found " +
                     std::to_string(env.world_size));
  }
  if (env.rank < 0 || env.rank >= env.world_size) {
    throw UsageError("RANK must be in [0, WORLD_SIZE) = [0, " +
                     std::to_string(env.world_size) + "), found " +
                     std::to_string(env.rank));
  }
  const char* local_rank = getenv("LOCAL_RANK");
  const char* local_world_size = getenv("LOCAL_WORLD_SIZE");
  env.local_rank = local_rank ? ParseInt("LOCAL_RANK", local_rank) : env.rank;
  env.local_world_size = local_world_size
                             ? ParseInt("LOCAL_WORLD_SIZE", local_world_size)
                             : env.world_size;
  if (env.local_world_size < 1 || env.local_world_size > env.world_size) {
    throw UsageError("LOCAL_WORLD_SIZE must be in [1, WORLD_SIZE=" +
                     std::to_string(env.world_size) + "], found " +
                     std::to_string(env.local_world_size));
  }
  if (env.local_rank < 0 || env.local_rank >= env.local_world_size) {
    throw UsageError("LOCAL_RANK must be in [0, LOCAL_WORLD_SIZE) = [0, " +
                     std::to_string(env.local_world_size) + "), found " +
                     std::to_string(env.local_rank));
  }
  const char* addr = getenv("MASTER_ADDR");
  const char* port = getenv("MASTER_PORT");
  if (env.world_size > 1 && (addr == nullptr || port == nullptr)) {
    throw UsageError(
        std::string("environment variable ") +
        (addr == nullptr ? "MASTER_ADDR" : "MASTER_PORT") +
        " is missing; with WORLD_SIZE=" + std::to_string(env.world_size) +
        " rank 0's address and port are required" + kHint);
  }
  if (addr != nullptr) {
    env.master_addr = addr;
    if (env.master_addr.empty()) throw UsageError("MASTER_ADDR is empty");
  }
  if (port != nullptr) {
    env.master_port = ParseInt("MASTER_PORT", port);
    if (env.master_port < 1 || env.master_port > 65535) {
      throw UsageError("MASTER_PORT must be in [1, 65535], found " +
                       std::to_string(env.master_port));
    }
  }
  if (const char* secret = getenv("ACCEL_RUN_SECRET")) env.run_secret = secret;
  if (const char* restarts = getenv("TORCHELASTIC_RESTART_COUNT")) {
    env.restart_count = ParseInt("TORCHELASTIC_RESTART_COUNT", restarts);
  }
  return env;
}

DistributedEnvironment DistributedEnvironment::FromProcess() {
  return Parse([](const char* name) { return std::getenv(name); });
}

}  // namespace accel
