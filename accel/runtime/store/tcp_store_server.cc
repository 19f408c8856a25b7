// The TCP store's server: one thread polls every connection (see
// tcp_store.h).
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <set>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"
#include "accel/runtime/base/net.h"
#include "accel/runtime/store/tcp_store.h"
#include "accel/runtime/store/wire.h"

namespace accel {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using store_wire::DecodeLength;
using store_wire::Framed;
using store_wire::kMaxLeavingText;
using store_wire::kMaxUnauthenticatedMessage;
using store_wire::kProtocolVersion;
using store_wire::Op;
using store_wire::Reader;
using store_wire::SecretsEqual;
using store_wire::Status;
using store_wire::Writer;

constexpr size_t kMaxRejectedKept = 16;
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

struct TcpStoreServer::State {
  struct Connection {
    std::string address;
    Clock::time_point accepted_at;
    bool authenticated = false;
    int rank = -1;
    bool said_goodbye = false;
    bool left = false;  // Its departure was recorded by kLeaving.
    bool close_after_flush = false;
    std::string in;
    std::string out;
  };
  struct Waiter {
    int fd;
    uint64_t id;
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };

  explicit State(const TcpStoreServerOptions& options) : options(options) {}

  const TcpStoreServerOptions& options;
  std::map<std::string, std::string> values;
  std::map<int, std::string> departures;
  std::map<int, Connection> connections;  // By file descriptor.
  std::map<int, int> rank_fds;            // Connected ranks.
  std::vector<Waiter> waiters;
  Clock::time_point accept_paused_until;

  // Read by other threads.
  mutable std::mutex shared_mutex;
  std::deque<RejectedClient> rejected;
  std::map<int, std::string> rank_addresses;

  bool HasAll(const std::vector<std::string>& keys) const {
    for (const auto& key : keys) {
      if (values.count(key) == 0) return false;
    }
    return true;
  }

  void Reply(int fd, const Writer& response) {
    connections[fd].out += Framed(response.bytes());
  }

  static Writer Response(uint64_t id, Status status) {
    Writer writer;
    writer.U64(id).U8(static_cast<uint8_t>(status));
    return writer;
  }

  void Reject(int fd, uint64_t id, Status status, int rank,
              const std::string& reason) {
    Connection& conn = connections[fd];
    ACCEL_VLOG(1) << "store: refused a connection from " << conn.address
                  << " claiming rank " << rank << ": " << reason;
    Reply(fd, Response(id, status));
    conn.close_after_flush = true;
    std::lock_guard<std::mutex> lock(shared_mutex);
    rejected.push_back({conn.address, rank, reason});
    if (rejected.size() > kMaxRejectedKept) rejected.pop_front();
  }

  void WakeWaiters() {
    auto ready = [&](const Waiter& w) {
      if (!HasAll(w.keys)) return false;
      Reply(w.fd, Response(w.id, Status::kOk));
      return true;
    };
    waiters.erase(std::remove_if(waiters.begin(), waiters.end(), ready),
                  waiters.end());
  }

  void ExpireWaiters(Clock::time_point now) {
    auto expired = [&](const Waiter& w) {
      if (w.deadline > now) return false;
      Writer response = Response(w.id, Status::kTimeout);
      std::vector<std::string> missing;
      for (const auto& key : w.keys) {
        if (values.count(key) == 0) missing.push_back(key);
      }
      response.U64(missing.size());
      for (const auto& key : missing) response.Str(key);
      Reply(w.fd, response);
      return true;
    };
    waiters.erase(std::remove_if(waiters.begin(), waiters.end(), expired),
                  waiters.end());
  }

  void Hello(int fd, uint64_t id, Reader& reader) {
    Connection& conn = connections[fd];
    const std::string presented = reader.Str();
    const int rank = static_cast<int>(static_cast<int64_t>(reader.U64()));
    const std::string job_id = reader.Str();
    // Before version 2 the hello ended here.
    const uint64_t version = reader.remaining() >= 8 ? reader.U64() : 1;
    if (version != kProtocolVersion) {
      Reject(fd, id, Status::kOtherVersion, rank,
             "another accel (store protocol version " +
                 std::to_string(version) + ", this one speaks " +
                 std::to_string(kProtocolVersion) + ")");
      return;
    }
    if (!SecretsEqual(presented, options.secret)) {
      Reject(fd, id, Status::kDenied, rank, "another run secret");
      return;
    }
    if (job_id != options.job_id) {
      Reject(fd, id, Status::kOtherJob, rank,
             "another job (the same run secret, another job id)");
      return;
    }
    if (rank >= 0 && rank_fds.count(rank) != 0) {
      Reject(fd, id, Status::kRankTaken, rank,
             "rank " + std::to_string(rank) + " is already connected from " +
                 connections[rank_fds[rank]].address);
      return;
    }
    conn.authenticated = true;
    conn.rank = rank;
    if (rank >= 0) {
      rank_fds[rank] = fd;
      std::lock_guard<std::mutex> lock(shared_mutex);
      rank_addresses[rank] = conn.address;
    }
    ACCEL_VLOG(1) << "store: "
                  << (rank >= 0 ? "rank " + std::to_string(rank)
                                : std::string("a client"))
                  << " connected from " << conn.address;
    Reply(fd, Response(id, Status::kOk));
  }

  // Handles one request; throws on a malformed one.
  void Handle(int fd, const std::string& message) {
    Reader reader(message);
    const uint64_t id = reader.U64();
    const auto op = static_cast<Op>(reader.U8());
    if (!connections[fd].authenticated && op != Op::kHello) {
      throw std::runtime_error("request before hello");
    }
    switch (op) {
      case Op::kHello:
        if (connections[fd].authenticated) {
          throw std::runtime_error("second hello");
        }
        Hello(fd, id, reader);
        return;
      case Op::kSet: {
        const std::string key = reader.Str();
        values[key] = reader.Str();
        Reply(fd, Response(id, Status::kOk));
        WakeWaiters();
        return;
      }
      case Op::kGet: {
        auto it = values.find(reader.Str());
        if (it == values.end()) {
          Reply(fd, Response(id, Status::kMissing));
        } else {
          Reply(fd, Response(id, Status::kOk).Str(it->second));
        }
        return;
      }
      case Op::kWait: {
        const uint64_t count = reader.U64();
        if (count > message.size()) throw std::length_error("bad key count");
        Waiter waiter{fd, id, {}, {}};
        for (uint64_t i = 0; i < count; ++i)
          waiter.keys.push_back(reader.Str());
        const auto timeout =
            milliseconds(std::min<uint64_t>(reader.U64(), uint64_t{1} << 40));
        waiter.deadline = Clock::now() + timeout;
        if (HasAll(waiter.keys)) {
          Reply(fd, Response(id, Status::kOk));
        } else {
          waiters.push_back(std::move(waiter));
        }
        return;
      }
      case Op::kAdd: {
        const std::string key = reader.Str();
        const auto delta = static_cast<int64_t>(reader.U64());
        int64_t current = 0;
        auto it = values.find(key);
        if (it != values.end()) {
          try {
            current = std::stoll(it->second);
          } catch (const std::exception&) {
            current = 0;
          }
        }
        const int64_t result = static_cast<int64_t>(
            static_cast<uint64_t>(current) + static_cast<uint64_t>(delta));
        values[key] = std::to_string(result);
        Reply(fd, Response(id, Status::kOk).U64(static_cast<uint64_t>(result)));
        WakeWaiters();
        return;
      }
      case Op::kDepartures: {
        Writer response = Response(id, Status::kOk);
        response.U64(departures.size());
        for (const auto& [rank, how] : departures) {
          response.U64(static_cast<uint64_t>(static_cast<int64_t>(rank)))
              .Str(how);
        }
        Reply(fd, response);
        return;
      }
      case Op::kGoodbye:
        connections[fd].said_goodbye = true;
        return;
      case Op::kLeaving: {
        std::string how = reader.Str();
        if (how.size() > kMaxLeavingText) how.resize(kMaxLeavingText);
        Connection& conn = connections[fd];
        if (conn.rank >= 0) {
          departures[conn.rank] = how;
          conn.left = true;
        }
        Reply(fd, Response(id, Status::kOk));
        return;
      }
    }
    throw std::runtime_error("unknown request");
  }

  // `unreachable`: the connection failed because the peer's machine stopped
  // answering (rather than closing it).
  void Drop(int fd, bool unreachable) {
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
    waiters.erase(std::remove_if(waiters.begin(), waiters.end(),
                                 [fd](const Waiter& w) { return w.fd == fd; }),
                  waiters.end());
    connections.erase(it);
    close(fd);
  }

  // The unauthenticated connection accepted first, or -1.
  int OldestUnauthenticated(size_t* count) const {
    int oldest = -1;
    *count = 0;
    for (const auto& [fd, conn] : connections) {
      if (conn.authenticated) continue;
      ++*count;
      if (oldest < 0 || conn.accepted_at < connections.at(oldest).accepted_at) {
        oldest = fd;
      }
    }
    return oldest;
  }

  void Accept(int listen_fd) {
    while (true) {
      const int fd =
          accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) {
          // Make room by closing a stranger, else let the backlog wait a
          // moment (polling the listener now would spin).
          size_t count = 0;
          const int oldest = OldestUnauthenticated(&count);
          if (oldest >= 0) {
            Drop(oldest, false);
            continue;
          }
          accept_paused_until = Clock::now() + kAcceptPause;
          const std::string reason =
              "rank 0 ran out of file descriptors (ulimit -n " +
              OpenFileLimit() + ") while accepting connections";
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
      Connection& conn = connections[fd];
      conn.address = net::PeerAddress(fd);
      conn.accepted_at = Clock::now();
      size_t count = 0;
      const int oldest = OldestUnauthenticated(&count);
      if (count > options.max_unauthenticated) Drop(oldest, false);
    }
  }

  void DropSilentStrangers(Clock::time_point now) {
    std::vector<int> expired;
    for (const auto& [fd, conn] : connections) {
      if (!conn.authenticated &&
          now - conn.accepted_at >= options.auth_timeout) {
        expired.push_back(fd);
      }
    }
    for (int fd : expired) Drop(fd, false);
  }

  // Milliseconds until the next deadline (waiters, silent strangers, the
  // accept pause), or -1 for none.
  int PollTimeout(Clock::time_point now) const {
    Clock::time_point next = Clock::time_point::max();
    for (const auto& w : waiters) next = std::min(next, w.deadline);
    for (const auto& [fd, conn] : connections) {
      if (!conn.authenticated) {
        next = std::min(next, conn.accepted_at + options.auth_timeout);
      }
    }
    if (accept_paused_until > now) next = std::min(next, accept_paused_until);
    if (next == Clock::time_point::max()) return -1;
    const auto left =
        std::chrono::duration_cast<milliseconds>(next - now).count() + 1;
    return static_cast<int>(std::clamp<int64_t>(left, 0, 1000000));
  }
};

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
  std::vector<pollfd> fds;
  while (true) {
    const auto now = Clock::now();
    fds.clear();
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    const short listen_events = now >= state.accept_paused_until ? POLLIN : 0;
    fds.push_back({listen_fd_, listen_events, 0});
    for (const auto& [fd, conn] : state.connections) {
      const short events =
          static_cast<short>((conn.close_after_flush ? 0 : POLLIN) |
                             (conn.out.empty() ? 0 : POLLOUT));
      fds.push_back({fd, events, 0});
    }
    if (poll(fds.data(), fds.size(), state.PollTimeout(now)) < 0 &&
        errno != EINTR) {
      break;
    }
    if (fds[0].revents != 0) break;
    std::vector<std::pair<int, bool>> to_drop;  // fd, unreachable
    for (size_t i = 2; i < fds.size(); ++i) {
      const int fd = fds[i].fd;
      const short revents = fds[i].revents;
      auto found = state.connections.find(fd);
      if (found == state.connections.end()) continue;
      State::Connection& conn = found->second;
      if (revents & (POLLIN | POLLHUP | POLLERR)) {
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
        if (revents & POLLERR && error == 0) error = SocketError(fd);
        try {
          while (conn.in.size() >= 4 && !conn.close_after_flush) {
            const size_t length = DecodeLength(conn.in.data());
            const size_t limit = conn.authenticated
                                     ? state.options.max_message_bytes
                                     : kMaxUnauthenticatedMessage;
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
      }
    }
    for (const auto& [fd, unreachable] : to_drop) state.Drop(fd, unreachable);
    // New connections after the old ones are served, so that a stranger
    // being evicted never delays a rank's request.
    if (fds[1].revents & POLLIN) state.Accept(listen_fd_);
    state.DropSilentStrangers(Clock::now());
    state.ExpireWaiters(Clock::now());
  }
}

}  // namespace accel
