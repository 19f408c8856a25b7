#include "accel/runtime/comm/registry.h"

#include <map>
#include <mutex>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, BackendFactory> factories;
  std::map<std::string, BackendProbe> probes;
  std::map<std::string, BackendEnvironment> environments;
};

Registry& GetRegistry() {
  static Registry* registry = new Registry();  // Never destroyed: see static
                                               // registration order.
  return *registry;
}

}  // namespace

void RegisterBackend(const std::string& name, BackendFactory factory,
                     BackendProbe usable) {
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  if (!registry.factories.emplace(name, std::move(factory)).second) {
    throw UsageError("backend '" + name + "' is registered twice");
  }
  registry.probes[name] = std::move(usable);
}

std::string ResolveBackend(const std::string& name, bool cpu_only) {
  if (name != "auto") return name;
  for (const char* candidate : {"nccl", "mpi", "gloo"}) {
    if (cpu_only && std::string(candidate) == "nccl") continue;
    BackendProbe probe;
    {
      Registry& registry = GetRegistry();
      std::lock_guard<std::mutex> lock(registry.mutex);
      auto it = registry.probes.find(candidate);
      if (it != registry.probes.end()) probe = it->second;
    }
    if (probe && probe()) return candidate;
  }
  return "gloo";
}

bool BackendUsable(const std::string& name) {
  BackendProbe probe;
  {
    Registry& registry = GetRegistry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    auto it = registry.probes.find(name);
    if (it == registry.probes.end()) return false;
    probe = it->second;
  }
  return probe && probe();
}

void RegisterBackendEnvironment(const std::string& name,
                                BackendEnvironment environment) {
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.environments[name] = std::move(environment);
}

DistributedEnvironment EnvironmentForBackend(
    const std::string& name, const DistributedEnvironment& env) {
  BackendEnvironment environment;
  {
    Registry& registry = GetRegistry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    auto it = registry.environments.find(name);
    if (it != registry.environments.end()) environment = it->second;
  }
  return environment ? environment(env) : env;
}

std::vector<std::string> RegisteredBackends() {
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  std::vector<std::string> names;
  for (const auto& entry : registry.factories) names.push_back(entry.first);
  return names;
}

std::unique_ptr<Communicator> CreateCommunicator(
    const std::string& name, const BackendContext& context) {
  BackendFactory factory;
  {
    Registry& registry = GetRegistry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    auto it = registry.factories.find(name);
    if (it != registry.factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string available;
    for (const auto& known : RegisteredBackends()) {
      available += (available.empty() ? "" : ", ") + known;
    }
    throw UsageError("unknown backend '" + name + "'; available backends: " +
                     (available.empty() ? "(none linked)" : available));
  }
  return std::make_unique<Communicator>(factory(context), context, factory);
}

}  // namespace accel
