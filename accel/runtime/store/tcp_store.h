// The rendezvous store across processes: rank 0 runs a TcpStoreServer, every
// rank (rank 0 too) talks to it through a TcpStore client.
//
//   accel::TcpStoreServer server({.host = "127.0.0.1", .port = 0,
//                                 .secret = run_secret, .job_id = job});
//   accel::TcpStore store("127.0.0.1", server.port(),
//                         {.secret = run_secret, .job_id = job, .rank = 0});
//   store.set("hello", "world");
//
// Why our own store rather than c10d::TCPStore: a client must present the
// run's secret and job id before it can read or write anything, and each
// rank may be connected once, so a stranger (or a second job that shares an
// exported ACCEL_RUN_SECRET) can neither join nor pose as a rank; malformed
// or oversized messages, and connections that never say hello, cost only
// their sender; and the server notices which rank's process went away
// (departures()), which turns "connection reset" in a collective into
// "rank 1 crashed", and whose machine vanished from the network (TCP
// keepalive), which turns a silent hang into "rank 2 is unreachable". c10d's
// store also drags LibTorch headers into the communication core.
//
// Requests carry ids, so several threads share one connection without
// waiting for each other: a diagnostic request never queues behind another
// thread's long wait, and a request that timed out (rank 0 stopped) does not
// break the connection for the next one.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "accel/runtime/store/store.h"

namespace accel {

struct TcpStoreServerOptions {
  std::string host = "127.0.0.1";  // Address to listen on.
  int port = 0;                    // 0 picks a free port.
  // A socket that already listens (handed over by the launcher, which held
  // the port from the moment it chose it); host and port are then unused.
  int listen_fd = -1;
  std::string secret;  // Clients must present it; may be empty.
  std::string job_id;  // And this; tells apart jobs that share a secret.
  size_t max_message_bytes = 64 << 20;
  // Connections that have not said hello within auth_timeout are closed,
  // and at most max_unauthenticated of them are kept (the oldest go first),
  // so that idle strangers cannot exhaust rank 0's file descriptors.
  std::chrono::milliseconds auth_timeout = std::chrono::seconds(5);
  size_t max_unauthenticated = 64;
  // A client whose machine stops acknowledging TCP traffic for this long
  // counts as departed ("unreachable"); a stopped process does not (its
  // kernel still answers).
  std::chrono::milliseconds network_timeout = std::chrono::seconds(20);
};

// A process that tried to join and was turned away.
struct RejectedClient {
  std::string address;  // Its IP address.
  int rank = -1;        // The rank it claimed.
  std::string reason;   // "another run secret", "another job", ...
};

class TcpStoreServer {
 public:
  explicit TcpStoreServer(TcpStoreServerOptions options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }

  // The most recent clients turned away (at most 16), oldest first.
  std::vector<RejectedClient> rejected() const;

  // The IP address each connected rank's connection comes from.
  std::map<int, std::string> rank_addresses() const;

 private:
  struct State;
  void Serve();

  TcpStoreServerOptions options_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  std::unique_ptr<State> state_;
  std::thread thread_;
};

struct TcpStoreOptions {
  std::string secret;
  std::string job_id;
  int rank = -1;  // Reported to the server so that it can name departures.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(30);
  // Bound on a request that does not wait for keys; waits add their own
  // timeout to it.
  std::chrono::milliseconds request_timeout = std::chrono::seconds(30);
  // See TcpStoreServerOptions::network_timeout; applies to the connection
  // to rank 0 (its machine vanishing).
  std::chrono::milliseconds network_timeout = std::chrono::seconds(20);
};

class TcpStore : public Store {
 public:
  TcpStore(std::string host, int port, TcpStoreOptions options);
  ~TcpStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> try_get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::map<int, Departure> departures() override;
  void leave(const Departure& how) override;
  std::shared_ptr<Store> WithRequestTimeout(
      std::chrono::milliseconds timeout) override;

  // Keeps `server` alive as long as this client's connection (rank 0 owns
  // both), and gives access to it.
  void AdoptServer(std::unique_ptr<TcpStoreServer> server);
  TcpStoreServer* server();

 private:
  class Connection;
  TcpStore(std::shared_ptr<Connection> connection,
           std::chrono::milliseconds request_timeout);
  std::string Call(const std::string& request,
                   std::chrono::milliseconds extra_wait);

  std::shared_ptr<Connection> connection_;
  std::chrono::milliseconds request_timeout_;
};

}  // namespace accel
