// The TCP store's server: one thread serves every connection through epoll
// (see tcp_store.h). Each request costs O(log N) in the number of
// connections, keys and waiters, so that thousands of ranks joining at once
// cost the server O(N log N) in all: waiters are filed under the first key
// they miss, deadlines and silent connections kept in order. This file holds
// the connections and the serving loop; the requests are
// tcp_store_server_requests.cc's.
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"
#include "accel/runtime/base/net.h"
#include "accel/runtime/store/tcp_store.h"
#include "accel/runtime/store/tcp_store_server_state.h"
#include "accel/runtime/store/wire.h"

namespace accel {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long the server stops accepting after running out of descriptors.
constexpr auto kAcceptPause = milliseconds(100);

int SocketError(int fd) {
  int error = 0;
  socklen_t len = sizeof(error);
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
  return error;
}

std::string OpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return "unknown";
  return std::to_string(limit.rlim_cur);
}

}  // namespace

void TcpStoreServer::State::Drop(int fd, bool unreachable) {
  auto it = connections.find(fd);
  if (it == connections.end()) return;
  const Connection& conn = it->second;
  if (conn.authenticated && conn.rank >= 0) {
    auto owner = rank_fds.find(conn.rank);
    if (owner != rank_fds.end() && owner->second == fd) {
      rank_fds.erase(owner);
      if (!conn.left) {
        departures[conn.rank] =
            (conn.said_goodbye ? Departure{Departure::Kind::kExited, ""}
             : unreachable
                 ? Departure{Departure::Kind::kUnreachable, conn.address}
                 : Departure{Departure::Kind::kCrashed, ""})
                .ToString();
      }
      ACCEL_VLOG(1) << "store: rank " << conn.rank << " disconnected ("
                    << departures[conn.rank] << ")";
    }
  }
  const std::set<uint64_t> its_waiters = conn.waiters;
  for (uint64_t serial : its_waiters) RemoveWaiter(serial);
  if (!conn.authenticated) unauthenticated.erase({conn.accepted_at, fd});
  connections.erase(it);
  // Before the close: a copy of the socket in a forked child of this
  // process would keep it registered, reporting events for an fd that is
  // no longer ours (or is a new connection's).
  epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
}

void TcpStoreServer::State::Flush(std::vector<std::pair<int, bool>>& to_drop) {
  std::vector<int> fds;
  fds.swap(to_flush);
  for (int fd : fds) {
    auto found = connections.find(fd);
    if (found == connections.end()) continue;
    Connection& conn = found->second;
    conn.flush_queued = false;
    if (!conn.out.empty()) {
      const ssize_t n =
          send(fd, conn.out.data(), conn.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        conn.out.erase(0, static_cast<size_t>(n));
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        to_drop.push_back({fd, net::IsUnreachableError(errno)});
        continue;
      }
    }
    if (conn.close_after_flush && conn.out.empty()) {
      to_drop.push_back({fd, false});
      continue;
    }
    const bool want_output = !conn.out.empty();
    if (want_output != conn.output_polled || conn.close_after_flush) {
      epoll_event event{};
      event.events = (conn.close_after_flush ? 0u : uint32_t{EPOLLIN}) |
                     (want_output ? uint32_t{EPOLLOUT} : 0u);
      event.data.fd = fd;
      if (epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd, &event) != 0) {
        to_drop.push_back({fd, false});  // Its output would stall.
        continue;
      }
      conn.output_polled = want_output;
    }
  }
}

int TcpStoreServer::State::OldestUnauthenticated() const {
  return unauthenticated.empty() ? -1 : unauthenticated.begin()->second;
}

void TcpStoreServer::State::Accept(int listen_fd) {
  while (true) {
    const int fd =
        accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        // Make room by closing a stranger, else let the backlog wait a
        // moment (polling the listener now would spin).
        const int oldest = OldestUnauthenticated();
        if (oldest >= 0) {
          Drop(oldest, false);
          continue;
        }
        accept_paused_until = Clock::now() + kAcceptPause;
        const std::string reason =
            "rank 0 ran out of file descriptors (ulimit -n " + OpenFileLimit() +
            ") while accepting connections";
        std::lock_guard<std::mutex> lock(shared_mutex);
        if (rejected.empty() || rejected.back().reason != reason) {
          rejected.push_back({"", -1, reason});
          if (rejected.size() > kMaxRejectedKept) rejected.pop_front();
        }
      }
      return;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    net::SetNetworkTimeout(fd, options.network_timeout);
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event) != 0) {
      // Unserved, it would only wait for its auth timeout: refuse it now.
      ACCEL_LOG(WARNING) << "store: cannot watch a new connection: "
                         << std::strerror(errno);
      close(fd);
      continue;
    }
    Connection& conn = connections[fd];
    conn.address = net::PeerAddress(fd);
    conn.accepted_at = Clock::now();
    unauthenticated.insert({conn.accepted_at, fd});
    if (unauthenticated.size() > options.max_unauthenticated) {
      Drop(OldestUnauthenticated(), false);
    }
  }
}

void TcpStoreServer::State::DropSilentStrangers(Clock::time_point now) {
  while (!unauthenticated.empty() &&
         now - unauthenticated.begin()->first >= options.auth_timeout) {
    Drop(unauthenticated.begin()->second, false);
  }
}

int TcpStoreServer::State::PollTimeout(Clock::time_point now) const {
  Clock::time_point next = Clock::time_point::max();
  if (!deadlines.empty()) next = deadlines.begin()->first;
  if (!unauthenticated.empty()) {
    next =
        std::min(next, unauthenticated.begin()->first + options.auth_timeout);
  }
  if (accept_paused_until > now) next = std::min(next, accept_paused_until);
  if (next == Clock::time_point::max()) return -1;
  const auto left =
      std::chrono::duration_cast<milliseconds>(next - now).count() + 1;
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1000000));
}

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options)
    : options_(std::move(options)), state_(std::make_unique<State>(options_)) {
  if (options_.listen_fd >= 0) {
    listen_fd_ = options_.listen_fd;
    fcntl(listen_fd_, F_SETFD, FD_CLOEXEC);
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) !=
        0) {
      throw UsageError("store server: the listening socket handed over (fd " +
                       std::to_string(listen_fd_) +
                       ") is not a socket: " + std::strerror(errno));
    }
    port_ = addr.ss_family == AF_INET6
                ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  } else {
    listen_fd_ = net::Listen(options_.host, options_.port, &port_);
  }
  fcntl(listen_fd_, F_SETFL, fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
  if (pipe2(wake_pipe_, O_CLOEXEC) != 0) {
    close(listen_fd_);
    throw Error(std::string("store server: pipe failed: ") +
                std::strerror(errno));
  }
  thread_ = std::thread([this] { Serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  const char byte = 0;
  ssize_t ignored = write(wake_pipe_[1], &byte, 1);
  (void)ignored;
  thread_.join();
  for (auto& [fd, conn] : state_->connections) close(fd);
  close(listen_fd_);
  close(wake_pipe_[0]);
  close(wake_pipe_[1]);
}

std::vector<RejectedClient> TcpStoreServer::rejected() const {
  std::lock_guard<std::mutex> lock(state_->shared_mutex);
  return {state_->rejected.begin(), state_->rejected.end()};
}

std::map<int, std::string> TcpStoreServer::rank_addresses() const {
  std::lock_guard<std::mutex> lock(state_->shared_mutex);
  return state_->rank_addresses;
}

void TcpStoreServer::Serve() {
  State& state = *state_;
  state.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (state.epoll_fd < 0) {
    ACCEL_LOG(ERROR) << "store server: epoll_create1 failed: "
                     << std::strerror(errno);
    return;
  }
  auto watch = [&](int fd, uint32_t events) {
    epoll_event event{};
    event.events = events;
    event.data.fd = fd;
    epoll_ctl(state.epoll_fd, EPOLL_CTL_ADD, fd, &event);
  };
  watch(wake_pipe_[0], EPOLLIN);
  watch(listen_fd_, EPOLLIN);
  bool listening = true;
  std::vector<epoll_event> events(512);
  while (true) {
    const auto now = Clock::now();
    // After running out of descriptors, stop listening for a moment
    // (a listener left readable would spin).
    const bool listen = now >= state.accept_paused_until;
    if (listen != listening) {
      epoll_event event{};
      event.events = listen ? uint32_t{EPOLLIN} : 0u;
      event.data.fd = listen_fd_;
      epoll_ctl(state.epoll_fd, EPOLL_CTL_MOD, listen_fd_, &event);
      listening = listen;
    }
    const int ready =
        epoll_wait(state.epoll_fd, events.data(),
                   static_cast<int>(events.size()), state.PollTimeout(now));
    if (ready < 0 && errno != EINTR) break;
    bool stop = false, accept = false;
    std::vector<std::pair<int, bool>> to_drop;  // fd, unreachable
    for (int i = 0; i < std::max(ready, 0); ++i) {
      const int fd = events[i].data.fd;
      const uint32_t revents = events[i].events;
      if (fd == wake_pipe_[0]) {
        stop = true;
        break;
      }
      if (fd == listen_fd_) {
        accept = true;
        continue;
      }
      auto found = state.connections.find(fd);
      if (found == state.connections.end()) continue;
      State::Connection& conn = found->second;
      if ((revents & EPOLLIN && !conn.close_after_flush) ||
          revents & (EPOLLHUP | EPOLLERR)) {
        char buffer[65536];
        bool closed = false;
        int error = 0;
        while (true) {
          const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
          if (n > 0) {
            conn.in.append(buffer, static_cast<size_t>(n));
            if (static_cast<size_t>(n) < sizeof(buffer)) break;
            continue;
          }
          if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
          error = n < 0 ? errno : 0;
          closed = true;
          break;
        }
        if (revents & EPOLLERR && error == 0) error = SocketError(fd);
        try {
          while (conn.in.size() >= 4 && !conn.close_after_flush) {
            const size_t length = store_wire::DecodeLength(conn.in.data());
            const size_t limit = conn.authenticated
                                     ? state.options.max_message_bytes
                                     : store_wire::kMaxUnauthenticatedMessage;
            if (length < 9 || length > limit) {
              throw std::length_error("bad message length");
            }
            if (conn.in.size() < 4 + length) break;
            const std::string message = conn.in.substr(4, length);
            conn.in.erase(0, 4 + length);
            state.Handle(fd, message);
          }
        } catch (const std::exception&) {
          // A peer that speaks garbage loses its connection, nothing else.
          closed = true;
        }
        if (closed) {
          to_drop.push_back({fd, net::IsUnreachableError(error)});
          continue;
        }
      }
      if (revents & EPOLLOUT && !conn.flush_queued) {
        conn.flush_queued = true;
        state.to_flush.push_back(fd);
      }
    }
    if (stop) break;
    for (const auto& [fd, unreachable] : to_drop) state.Drop(fd, unreachable);
    // New connections after the old ones are served, so that a stranger
    // being evicted never delays a rank's request.
    if (accept) state.Accept(listen_fd_);
    state.DropSilentStrangers(Clock::now());
    state.ExpireWaiters(Clock::now());
    to_drop.clear();
    state.Flush(to_drop);
    for (const auto& [fd, unreachable] : to_drop) state.Drop(fd, unreachable);
    // A full round: the next may bring more at once.
    if (ready == static_cast<int>(events.size()))
      events.resize(events.size() * 2);
  }
  close(state.epoll_fd);
  state.epoll_fd = -1;
}

}  // namespace accel
