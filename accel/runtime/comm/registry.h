// Creates communicators by backend name, so that accel never names a backend
// and programs choose one at run time (--backend=gloo|nccl|mpi). A backend
// registers a factory of its Transport (transport.h); CreateCommunicator
// puts the Communicator around it.
//
//   // In a backend's .cc (its cc_library has alwayslink = 1):
//   static const accel::BackendRegistration kRegistration(
//       "gloo", [](const accel::BackendContext& c) {
//         return std::make_unique<GlooTransport>(c);
//       });
//
//   // In a program:
//   auto comm = accel::CreateCommunicator("gloo", context);
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accel/runtime/comm/communicator.h"
#include "accel/runtime/env/environment.h"

namespace accel {

using BackendFactory =
    std::function<std::unique_ptr<Transport>(const BackendContext&)>;
// Whether the backend can run on this machine (e.g. a GPU is visible).
using BackendProbe = std::function<bool()>;

void RegisterBackend(
    const std::string& name, BackendFactory factory,
    BackendProbe usable = [] { return true; });

// "auto" becomes the first usable of "nccl" (not when `cpu_only`), "mpi"
// (usable when an MPI launcher started the process), "gloo"; other names
// are returned as they are (CreateCommunicator checks them).
std::string ResolveBackend(const std::string& name, bool cpu_only = false);

// For a backend whose launcher already knows the job (MPI under mpirun or
// srun): returns `env` with this process's rank, world size and local rank,
// and the rendezvous store's address agreed among the ranks when the
// environment gave none. ProcessGroup::Join applies it before the ranks
// meet; without one, `env` is used as it is.
using BackendEnvironment =
    std::function<DistributedEnvironment(const DistributedEnvironment& env)>;
void RegisterBackendEnvironment(const std::string& name,
                                BackendEnvironment environment);
DistributedEnvironment EnvironmentForBackend(const std::string& name,
                                             const DistributedEnvironment& env);

// Throws UsageError listing the registered names when `name` is unknown.
std::unique_ptr<Communicator> CreateCommunicator(const std::string& name,
                                                 const BackendContext& context);

std::vector<std::string> RegisteredBackends();

// Whether `name` is registered and its probe says it can run here.
bool BackendUsable(const std::string& name);

struct BackendRegistration {
  BackendRegistration(
      const std::string& name, BackendFactory factory,
      BackendProbe usable = [] { return true; }) {
    RegisterBackend(name, std::move(factory), std::move(usable));
  }
};

}  // namespace accel
