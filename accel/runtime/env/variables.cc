#include "accel/runtime/env/variables.h"

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <vector>

#include "accel/runtime/base/errors.h"

namespace accel::launch_env {

bool Variables::AllOrNone(std::initializer_list<const char*> names) const {
  std::vector<std::string> found, missing;
  for (const char* name : names) {
    if (const char* value = Get(name)) {
      found.push_back(std::string(name) + "=" + value);
    } else {
      missing.push_back(name);
    }
  }
  if (found.empty()) return false;
  if (missing.empty()) return true;
  auto join = [](const std::vector<std::string>& items) {
    std::string text;
    for (const auto& item : items) text += (text.empty() ? "" : ", ") + item;
    return text;
  };
  throw UsageError("this process looks started by " + engine_ + " (found " +
                   join(found) + ") but " + join(missing) +
                   (missing.size() == 1 ? " is" : " are") +
                   " missing, so its place in the job is unknown; start it "
                   "with " +
                   engine_ +
                   " itself, or unset those variables to run one "
                   "process");
}

int Variables::Int(const char* name) const {
  const char* value = Get(name);
  if (value == nullptr) {
    throw UsageError(engine_ + ": environment variable " + name +
                     " is missing");
  }
  return ParseInt(name, value);
}

std::optional<int> Variables::OptionalInt(const char* name) const {
  const char* value = Get(name);
  if (value == nullptr) return std::nullopt;
  return ParseInt(name, value);
}

void PlaceOnMachines(const Variables& vars, const char* local_size_variable,
                     const char* size_variable, const std::string& how_to_pass,
                     DistributedEnvironment* env) {
  if (env->local_world_size > 0) {
    env->machine_rank = env->rank / env->local_world_size;
  }
  // On one machine rank 0 runs here.
  if (vars.Get("MASTER_ADDR") != nullptr ||
      env->local_world_size >= env->world_size) {
    return;
  }
  throw UsageError(vars.engine() + " started " +
                   std::to_string(env->world_size) +
                   " processes over several machines (" + local_size_variable +
                   "=" + std::to_string(env->local_world_size) + " < " +
                   size_variable + "=" + std::to_string(env->world_size) +
                   ") but does not say where rank 0 runs: set MASTER_ADDR to "
                   "rank 0's host and pass it on, e.g. `" +
                   how_to_pass + "`");
}

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

int PortFromJobId(const std::string& job_id) {
  int last_digits = 0;
  int scale = 1;
  for (auto it = job_id.rbegin(); it != job_id.rend() && scale <= 1000; ++it) {
    if (*it < '0' || *it > '9') break;
    last_digits += (*it - '0') * scale;
    scale *= 10;
  }
  return 15000 + last_digits;
}

}  // namespace accel::launch_env
