// Private to the TCP store's server (tcp_store_server*.cc): its state
// (values, waiters, connections) and what it does with them. The requests
// (hello, set, get, wait, add, ...) are tcp_store_server_requests.cc's; the
// connections (accept, flush, drop) and the serving loop
// tcp_store_server.cc's.
//
//   state.Handle(fd, message);  // Answers, through state.Reply.
//   state.Flush(to_drop);       // Sends what was answered.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "accel/runtime/store/tcp_store.h"
#include "accel/runtime/store/wire.h"

namespace accel {

struct TcpStoreServer::State {
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kMaxRejectedKept = 16;

  struct Connection {
    std::string address;
    Clock::time_point accepted_at;
    bool authenticated = false;
    int rank = -1;
    bool said_goodbye = false;
    bool left = false;  // Its departure was recorded by kLeaving.
    bool close_after_flush = false;
    bool flush_queued = false;   // In `to_flush`.
    bool output_polled = false;  // Registered for EPOLLOUT.
    std::string in;
    std::string out;
    std::set<uint64_t> waiters;  // Its waits, by serial number.
  };
  struct Waiter {
    int fd;
    uint64_t id;
    std::vector<std::string> keys;
    size_t missing = 0;  // keys[missing] is the first key not yet set.
    Clock::time_point deadline;
  };

  explicit State(const TcpStoreServerOptions& options) : options(options) {}

  const TcpStoreServerOptions& options;
  std::map<std::string, std::string> values;
  std::map<int, std::string> departures;
  std::unordered_map<int, Connection> connections;  // By file descriptor.
  std::map<int, int> rank_fds;                      // Connected ranks.
  std::map<uint64_t, Waiter> waiters;               // By serial number.
  uint64_t next_waiter = 0;
  // Each waiter under the first key it misses.
  std::unordered_map<std::string, std::set<uint64_t>> waiting_on;
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines;
  // Connections that have not said hello, oldest first.
  std::set<std::pair<Clock::time_point, int>> unauthenticated;
  // Connections with output to send at the end of this round.
  std::vector<int> to_flush;
  Clock::time_point accept_paused_until;
  int epoll_fd = -1;

  // Read by other threads.
  mutable std::mutex shared_mutex;
  std::deque<RejectedClient> rejected;
  std::map<int, std::string> rank_addresses;

  // Requests (tcp_store_server_requests.cc).
  void Reply(int fd, const store_wire::Writer& response);
  static store_wire::Writer Response(uint64_t id, store_wire::Status status);
  void Reject(int fd, uint64_t id, store_wire::Status status, int rank,
              const std::string& reason);
  // Files a waiter under its first missing key from keys[w.missing] on,
  // or answers it when it misses none; returns whether it still waits.
  bool FileOrAnswer(uint64_t serial, Waiter& w);
  void AddWaiter(Waiter waiter);
  // Forgets a waiter (answered, expired or its connection gone).
  void RemoveWaiter(uint64_t serial);
  // `key` was set: the waiters filed under it move on to their next missing
  // key, or are answered.
  void WakeWaiters(const std::string& key);
  void ExpireWaiters(Clock::time_point now);
  void Hello(int fd, uint64_t id, store_wire::Reader& reader);
  // Handles one request; throws on a malformed one.
  void Handle(int fd, const std::string& message);

  // Connections (tcp_store_server.cc).
  // `unreachable`: the connection failed because the peer's machine stopped
  // answering (rather than closing it).
  void Drop(int fd, bool unreachable);
  // Sends what each connection in `to_flush` has to send, as far as its
  // socket takes it; asks epoll to say when the rest can go. Returns the
  // connections to drop (fd, unreachable).
  void Flush(std::vector<std::pair<int, bool>>& to_drop);
  // The unauthenticated connection accepted first, or -1.
  int OldestUnauthenticated() const;
  void Accept(int listen_fd);
  void DropSilentStrangers(Clock::time_point now);
  // Milliseconds until the next deadline (waiters, silent strangers, the
  // accept pause), or -1 for none.
  int PollTimeout(Clock::time_point now) const;
};

}  // namespace accel
