// The rendezvous store across processes: rank 0 runs a TcpStoreServer, every
// rank (rank 0 too) talks to it through a TcpStore client.
//
//   accel::TcpStoreServer server({.host = "127.0.0.1", .port = 0,
//                                 .secret = run_secret});
//   accel::TcpStore store("127.0.0.1", server.port(),
//                         {.secret = run_secret, .rank = 0});
//   store.set("hello", "world");
//
// Why our own store rather than c10d::TCPStore: a client must present the
// run's secret before it can read or write anything, malformed or oversized
// messages only cost the sender its connection, and the server notices which
// rank's process went away (departures()), which turns "connection reset" in
// a collective into "rank 1 crashed". c10d's store also drags LibTorch
// headers into the communication core.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "accel/runtime/store.h"

namespace accel {

struct TcpStoreServerOptions {
  std::string host = "127.0.0.1";  // Address to listen on.
  int port = 0;                    // 0 picks a free port.
  std::string secret;              // Clients must present it; may be empty.
  size_t max_message_bytes = 64 << 20;
};

class TcpStoreServer {
 public:
  explicit TcpStoreServer(TcpStoreServerOptions options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }

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
  int rank = -1;  // Reported to the server so that it can name departures.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(30);
  // Bound on a non-waiting request; waits add their own timeout to it.
  std::chrono::milliseconds request_timeout = std::chrono::seconds(30);
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
  std::map<int, std::string> departures() override;

  // Keeps `server` alive as long as this client (rank 0 owns both).
  void AdoptServer(std::unique_ptr<TcpStoreServer> server);

 private:
  std::string Call(const std::string& request,
                   std::chrono::milliseconds extra_wait);
  std::string Describe() const;

  std::string host_;
  int port_;
  TcpStoreOptions options_;
  std::mutex mutex_;
  int fd_ = -1;
  std::unique_ptr<TcpStoreServer> server_;
};

}  // namespace accel
