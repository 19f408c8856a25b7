#include "accel/runtime/comm/process_group.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "accel/runtime/base/error_report.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"
#include "accel/runtime/base/net.h"
#include "accel/runtime/base/startup_trace.h"
#include "accel/runtime/comm/registry.h"
#include "accel/runtime/env/env_value.h"
#include "accel/runtime/store/rendezvous.h"
#include "accel/runtime/store/tcp_store.h"

namespace accel {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long rank 0 keeps the store up at exit for the others to leave.
constexpr auto kShutdownGrace = std::chrono::seconds(5);
// Bound on telling the store why this rank leaves.
constexpr auto kLeavingTimeout = std::chrono::seconds(1);
// How long rank 0, failing, keeps the store up for the others to diagnose.
constexpr auto kFatalGrace = std::chrono::seconds(3);

std::mutex g_connector_mutex;
AgentStoreConnector& Connector() {
  static AgentStoreConnector connector;
  return connector;
}

// Waits until the ranks other than rank 0 (this one, which hosts the store
// and may have recorded its own departure) have left the store, for at most
// `grace`.
void AwaitDepartures(Store& store, int others, milliseconds grace) {
  const auto deadline = Clock::now() + grace;
  try {
    while (Clock::now() < deadline) {
      std::map<int, Departure> departed = store.departures();
      departed.erase(0);
      if (static_cast<int>(departed.size()) >= others) return;
      std::this_thread::sleep_for(milliseconds(20));
    }
  } catch (const Error&) {
    // Shutting down anyway.
  }
}

int64_t ElapsedMs(Clock::time_point since) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - since).count();
}

// accel's launcher starts the clock of the rendezvous when it starts the
// ranks: on a machine too busy to start them all in time the job fails
// within the timeout, rather than each late rank waiting it out anew.
Clock::time_point DeadlineFromLaunch(const ProcessGroupOptions& options,
                                     const std::string& where) {
  const auto now = Clock::now();
  const std::optional<int64_t> launched_ns =
      EnvInt64("ACCEL_LAUNCH_STEADY_NS", 0);
  if (!launched_ns) return Clock::time_point::max();
  const Clock::time_point launched{std::chrono::duration_cast<Clock::duration>(
      std::chrono::nanoseconds(*launched_ns))};
  // Another machine's clock (a copied environment) means nothing here.
  if (launched > now || now - launched > std::chrono::hours(1)) {
    return Clock::time_point::max();
  }
  const auto deadline = launched + options.rendezvous_timeout;
  if (deadline <= now) {
    char text[256];
    std::snprintf(text, sizeof(text),
                  "started %.1f s after the launcher started the job, past "
                  "the rendezvous timeout (%.1f s): this machine is too busy "
                  "to start its ranks in time; start fewer processes or "
                  "raise --rendezvous_timeout_s",
                  ElapsedMs(launched) / 1000.0,
                  options.rendezvous_timeout.count() / 1000.0);
    throw TimeoutError(where + text);
  }
  return deadline;
}

milliseconds Left(Clock::time_point deadline) {
  return std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(
                                       deadline - Clock::now()));
}

std::shared_ptr<Store> ConnectAgentStore(const DistributedEnvironment& env,
                                         milliseconds timeout) {
  AgentStoreConnector connector;
  {
    std::lock_guard<std::mutex> lock(g_connector_mutex);
    connector = Connector();
  }
  if (!connector) {
    throw UsageError(
        "torchrun started this process in its default mode "
        "(TORCHELASTIC_USE_AGENT_STORE=True): its agent serves a c10d store "
        "on MASTER_PORT, which only programs linked with //accel (the "
        "LibTorch layer) can join; use `torchrun --standalone` or accel's "
        "launcher for runtime-only programs");
  }
  return connector(env, timeout);
}

std::shared_ptr<Store> ConnectStore(const DistributedEnvironment& env,
                                    const ProcessGroupOptions& options,
                                    Clock::time_point deadline) {
  if (env.world_size == 1) return std::make_shared<InMemoryStore>();
  if (env.use_agent_store) return ConnectAgentStore(env, Left(deadline));
  std::unique_ptr<TcpStoreServer> server;
  if (env.rank == 0) {
    TcpStoreServerOptions server_options;
    server_options.host = env.master_addr;
    server_options.port = env.master_port;
    server_options.listen_fd = env.store_listen_fd;
    server_options.secret = env.run_secret;
    server_options.job_id = env.job_id;
    server_options.network_timeout = options.network_timeout;
    // Every rank connects at once at start-up: room for all of them before
    // the oldest silent connections are dropped.
    server_options.max_unauthenticated =
        std::max<size_t>(server_options.max_unauthenticated,
                         static_cast<size_t>(env.world_size) + 16);
    server = std::make_unique<TcpStoreServer>(server_options);
    ACCEL_VLOG(1) << "serving the rendezvous store on " << env.master_addr
                  << ":" << server->port() << " for " << env.world_size
                  << " ranks";
    if (env.run_secret.empty() && !net::IsLoopback(env.master_addr)) {
      ACCEL_LOG(WARNING)
          << "rank 0's rendezvous store on " << env.master_addr << ":"
          << server->port()
          << " has no ACCEL_RUN_SECRET: anyone who can reach that port can "
             "join or change it; export the same secret on every rank (e.g. "
             "ACCEL_RUN_SECRET=$(openssl rand -hex 16))";
    }
  }
  TcpStoreOptions store_options;
  store_options.secret = env.run_secret;
  store_options.job_id = env.job_id;
  store_options.rank = env.rank;
  store_options.connect_timeout = Left(deadline);
  store_options.network_timeout = options.network_timeout;
  auto store = std::make_shared<TcpStore>(env.master_addr, env.master_port,
                                          store_options);
  if (server) store->AdoptServer(std::move(server));
  return store;
}

// Where this rank's data connections listen. On one machine each rank
// takes its own loopback address (127.0.0.0/8 is all loopback): Gloo gives
// every pair its own listening port, and 256 ranks need 65,280 of them at
// once, more than one address's ephemeral ports (28,232 by default).
std::string DataAddress(const DistributedEnvironment& env) {
  if (env.world_size == 1) return "127.0.0.1";
  if (!net::IsLoopback(env.master_addr)) {
    return net::LocalAddressToward(env.master_addr);
  }
  // 127.0.0.1 stays the store's.
  return "127.0." + std::to_string(env.local_rank / 250) + "." +
         std::to_string(env.local_rank % 250 + 2);
}

}  // namespace

void SetAgentStoreConnector(AgentStoreConnector connector) {
  std::lock_guard<std::mutex> lock(g_connector_mutex);
  Connector() = std::move(connector);
}

std::unique_ptr<ProcessGroup> ProcessGroup::Join(
    const DistributedEnvironment& given_env,
    const ProcessGroupOptions& options) {
  auto deadline = Clock::now() + options.rendezvous_timeout;
  std::unique_ptr<ProcessGroup> group(new ProcessGroup());
  const std::string backend = ResolveBackend(options.backend);
  // An unknown backend, or one that cannot run here (nccl without a GPU),
  // fails on every rank with its own explanation before anyone waits on the
  // network: creating it without a store throws that explanation.
  if (!BackendUsable(backend)) {
    BackendContext alone;
    alone.rank = given_env.rank;
    alone.size = given_env.world_size;
    alone.local_rank = given_env.local_rank;
    alone.local_size = given_env.local_world_size;
    CreateCommunicator(backend, alone);
  }
  if (options.rendezvous_timeout.count() <= 0) {
    throw UsageError("the rendezvous timeout must be positive, found " +
                     std::to_string(options.rendezvous_timeout.count()) +
                     " ms");
  }
  // An MPI launcher knows the ranks and can agree on the store itself.
  group->env_ = EnvironmentForBackend(backend, given_env);
  const DistributedEnvironment& env = group->env_;

  const std::string where = "rank " + std::to_string(env.rank) + "/" +
                            std::to_string(env.world_size) + ": ";
  SetLogRank(env.rank, env.world_size);
  deadline = std::min(deadline, DeadlineFromLaunch(options, where));
  const auto started = Clock::now();
  ACCEL_VLOG(1) << "joining a job of " << env.world_size << " ranks"
                << (env.engine.empty() ? "" : " started by " + env.engine)
                << " (local rank " << env.local_rank << "/"
                << env.local_world_size << ", restart " << env.restart_count
                << ") through the store at " << env.master_addr << ":"
                << env.master_port << ", backend " << backend;
  BackendContext context;
  context.host = DataAddress(env);
  try {
    group->store_ = ConnectStore(env, options, deadline);
    auto* tcp = dynamic_cast<TcpStore*>(group->store_.get());
    TcpStoreServer* hosted = tcp != nullptr ? tcp->server() : nullptr;
    group->hosts_store_ = hosted != nullptr;
    ACCEL_VLOG(1) << "connected to the rendezvous store after "
                  << ElapsedMs(started) << " ms";
    if (env.world_size > 1) {
      MeetAtStore(*group->store_, env, context.host, deadline, hosted);
      ACCEL_VLOG(1) << "all " << env.world_size << " ranks joined after "
                    << ElapsedMs(started) << " ms";
    }
  } catch (const TimeoutError& e) {
    throw TimeoutError(where + "rendezvous failed: " + e.what());
  } catch (const UsageError& e) {
    throw UsageError(where + "rendezvous failed: " + e.what());
  } catch (const PeerError& e) {
    throw PeerError(where + "rendezvous failed: " + e.what(), e.failed_rank());
  }
  group->data_address_ = context.host;
  context.rank = env.rank;
  context.size = env.world_size;
  context.local_rank = env.local_rank;
  context.local_size = env.local_world_size;
  context.store = std::make_shared<PrefixStore>(
      backend + "/" + std::to_string(env.restart_count), group->store_);
  context.options = options.communicator;
  context.connect_timeout = Left(deadline);
  group->communicator_ = CreateCommunicator(backend, context);
  ACCEL_VLOG(1) << backend << " connected " << env.world_size
                << " ranks (data on " << context.host << ") after "
                << ElapsedMs(started) << " ms";
  group->WatchFatalErrors();
  TraceStartup("rendezvous");
  return group;
}

std::unique_ptr<ProcessGroup> ProcessGroup::Join(const std::string& backend) {
  ProcessGroupOptions options;
  options.backend = backend;
  return Join(DistributedEnvironment::FromProcess(), options);
}

void ProcessGroup::WatchFatalErrors() {
  if (env_.world_size <= 1) return;
  // An error that ends the process through std::terminate tells the
  // others what it was.
  std::weak_ptr<Store> store = store_;
  const bool hosts = hosts_store_;
  const int others = env_.world_size - 1;
  fatal_hook_ =
      AddFatalErrorHook([store, hosts, others](const std::string& message) {
        auto alive = store.lock();
        if (!alive) return;
        alive->WithRequestTimeout(kLeavingTimeout)
            ->leave({Departure::Kind::kFailed, message});
        // The store dies with this process: let the others read the job's
        // state first (what each rank called), so that they report the cause
        // rather than only that rank 0 is gone. Bounded; they leave once they
        // have failed too.
        if (hosts) AwaitDepartures(*alive, others, kFatalGrace);
      });
}

std::unique_ptr<ProcessGroup> ProcessGroup::JoinStore(
    const DistributedEnvironment& env, const ProcessGroupOptions& options) {
  std::unique_ptr<ProcessGroup> group(new ProcessGroup());
  group->env_ = env;
  const std::string where = "rank " + std::to_string(env.rank) + "/" +
                            std::to_string(env.world_size) + ": ";
  SetLogRank(env.rank, env.world_size);
  if (env.use_agent_store) {
    throw UsageError(where +
                     "fault tolerance needs accel's launcher (or its store "
                     "on rank 0): torchrun's agent restarts every rank");
  }
  const auto deadline = Clock::now() + options.rendezvous_timeout;
  try {
    group->store_ = ConnectStore(env, options, deadline);
  } catch (const Error&) {
    RethrowWithPrefix(where + "connecting to the job's store failed: ");
  }
  auto* tcp = dynamic_cast<TcpStore*>(group->store_.get());
  group->hosts_store_ = tcp != nullptr && tcp->server() != nullptr;
  group->data_address_ = DataAddress(env);
  group->WatchFatalErrors();
  return group;
}

Communicator& ProcessGroup::communicator() {
  if (!communicator_) {
    throw UsageError(
        "this process joined its job's store only "
        "(ProcessGroup::JoinStore): it has no communicator");
  }
  return *communicator_;
}

ProcessGroup::~ProcessGroup() {
  ACCEL_VLOG(1) << "leaving the job"
                << (std::uncaught_exceptions() > 0 ? " after an error" : "");
  if (fatal_hook_ >= 0) RemoveFatalErrorHook(fatal_hook_);
  if (std::uncaught_exceptions() > 0 && env_.world_size > 1 && store_) {
    // Leaving because of an error: the others say so rather than "a peer
    // failed" (the message itself is this rank's to print).
    try {
      store_->WithRequestTimeout(kLeavingTimeout)
          ->leave({Departure::Kind::kExitedWithError, ""});
    } catch (const std::exception&) {
      // The store may be gone already.
    }
  }
  communicator_.reset();
  if (!hosts_store_) return;
  // The store lives in rank 0: give the others a moment to say goodbye so
  // that their last request does not meet a closed socket.
  AwaitDepartures(*store_, env_.world_size - 1, kShutdownGrace);
}

}  // namespace accel
