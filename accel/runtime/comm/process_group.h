// Joins this process to its job: reads the launch environment, meets the
// other ranks at rank 0's store, and creates the communicator by name.
//
//   auto group = accel::ProcessGroup::Join("gloo");   // from RANK etc.
//   accel::Communicator& comm = group->communicator();
//   comm.barrier();
//
// Rank 0 hosts the store at MASTER_ADDR:MASTER_PORT; the others connect to
// it, retrying until the rendezvous timeout, which bounds the whole join
// (store, meeting, the backend's connections). Under torchrun's default
// mode the store is torchrun's agent's (a c10d store), joined through the
// connector the LibTorch layer registers (accel/c10d_store.h). Data
// connections listen on the address that routes toward MASTER_ADDR, so the
// same code works across hosts.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "accel/runtime/comm/communicator.h"
#include "accel/runtime/env/environment.h"
#include "accel/runtime/store/store.h"

namespace accel {

struct ProcessGroupOptions {
  std::string backend = "auto";  // See ResolveBackend (registry.h).
  CommunicatorOptions communicator;
  // How long ranks wait for each other to arrive and connect.
  std::chrono::milliseconds rendezvous_timeout = std::chrono::seconds(60);
  // How long a machine may stop answering on the network before its ranks
  // count as departed ("unreachable"); see TcpStoreServerOptions.
  std::chrono::milliseconds network_timeout = std::chrono::seconds(20);
};

// Joins a store that another process serves (torchrun's agent): given the
// environment, the connection timeout and the network timeout.
using AgentStoreConnector = std::function<std::shared_ptr<Store>(
    const DistributedEnvironment& env, std::chrono::milliseconds timeout)>;

// Registered once by the layer that can speak the agent's protocol.
void SetAgentStoreConnector(AgentStoreConnector connector);

class ProcessGroup {
 public:
  static std::unique_ptr<ProcessGroup> Join(const DistributedEnvironment& env,
                                            const ProcessGroupOptions& options);
  static std::unique_ptr<ProcessGroup> Join(const std::string& backend);
  // Connects this process to its job's store (rank 0 hosts it, as in Join)
  // without waiting for the other ranks and without a communicator: the
  // replicas of a fault-tolerant job (accel/runtime/ft/replica.h) connect
  // per quorum, and a replacement joins while the others train.
  static std::unique_ptr<ProcessGroup> JoinStore(
      const DistributedEnvironment& env, const ProcessGroupOptions& options);
  ~ProcessGroup();

  const DistributedEnvironment& environment() const { return env_; }
  // Not after JoinStore (UsageError).
  Communicator& communicator();
  // The address this rank's data connections listen on.
  const std::string& data_address() const { return data_address_; }
  Store& store() { return *store_; }
  std::shared_ptr<Store> shared_store() { return store_; }

 private:
  ProcessGroup() = default;
  // Tells the others how this process ends when an error ends it.
  void WatchFatalErrors();
  DistributedEnvironment env_;
  std::shared_ptr<Store> store_;
  std::string data_address_;
  bool hosts_store_ = false;
  int fatal_hook_ = -1;  // AddFatalErrorHook's id.
  std::unique_ptr<Communicator> communicator_;
};

}  // namespace accel
