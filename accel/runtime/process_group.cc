#include "accel/runtime/process_group.h"

#include <thread>

#include "accel/runtime/errors.h"
#include "accel/runtime/net.h"
#include "accel/runtime/registry.h"
#include "accel/runtime/tcp_store.h"

namespace accel {
namespace {

// How long rank 0 keeps the store up at exit for the others to leave.
constexpr auto kShutdownGrace = std::chrono::seconds(5);

std::shared_ptr<Store> ConnectStore(const DistributedEnvironment& env,
                                    std::chrono::milliseconds timeout) {
  if (env.world_size == 1) return std::make_shared<InMemoryStore>();
  std::unique_ptr<TcpStoreServer> server;
  if (env.rank == 0) {
    TcpStoreServerOptions server_options;
    server_options.host = env.master_addr;
    server_options.port = env.master_port;
    server_options.secret = env.run_secret;
    server = std::make_unique<TcpStoreServer>(server_options);
  }
  TcpStoreOptions options;
  options.secret = env.run_secret;
  options.rank = env.rank;
  options.connect_timeout = timeout;
  auto store =
      std::make_shared<TcpStore>(env.master_addr, env.master_port, options);
  if (server) store->AdoptServer(std::move(server));
  return store;
}

}  // namespace

std::unique_ptr<ProcessGroup> ProcessGroup::Join(
    const DistributedEnvironment& env, const ProcessGroupOptions& options) {
  std::unique_ptr<ProcessGroup> group(new ProcessGroup());
  group->env_ = env;
  const std::string backend = ResolveBackend(options.backend);
  // Validate the backend name before anyone waits on the network.
  bool known = false;
  for (const auto& name : RegisteredBackends()) known |= name == backend;
  if (!known) CreateCommunicator(backend, BackendContext{});

  const std::string where = "rank " + std::to_string(env.rank) + "/" +
                            std::to_string(env.world_size) + ": ";
  try {
    group->store_ = ConnectStore(env, options.rendezvous_timeout);
  } catch (const TimeoutError& e) {
    throw TimeoutError(where + "rendezvous failed: " + e.what());
  } catch (const UsageError& e) {
    throw UsageError(where + "rendezvous failed: " + e.what());
  }
  BackendContext context;
  context.rank = env.rank;
  context.size = env.world_size;
  context.local_rank = env.local_rank;
  context.store = std::make_shared<PrefixStore>(
      backend + "/" + std::to_string(env.restart_count), group->store_);
  context.host = net::LocalAddressToward(env.master_addr);
  context.options = options.communicator;
  group->communicator_ = CreateCommunicator(backend, context);
  return group;
}

std::unique_ptr<ProcessGroup> ProcessGroup::Join(const std::string& backend) {
  ProcessGroupOptions options;
  options.backend = backend;
  return Join(DistributedEnvironment::FromProcess(), options);
}

ProcessGroup::~ProcessGroup() {
  communicator_.reset();
  if (env_.rank != 0 || env_.world_size == 1 || store_ == nullptr) return;
  // The store lives in rank 0: give the others a moment to say goodbye so
  // that their last request does not meet a closed socket.
  const auto deadline = std::chrono::steady_clock::now() + kShutdownGrace;
  try {
    while (std::chrono::steady_clock::now() < deadline) {
      if (static_cast<int>(store_->departures().size()) >= env_.world_size - 1)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const Error&) {
    // Shutting down anyway.
  }
}

}  // namespace accel
