#include "accel/runtime/store/tcp_store.h"

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

namespace accel {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Wire format: every message is a little-endian u32 length followed by that
// many bytes. A request is a u64 id, an Op and its fields; its response is
// the same id, a Status and its fields. Ids let several threads share one
// connection; waits are answered when their keys arrive, out of order.
enum class Op : uint8_t {
  kHello = 1,  // secret, rank, job id
  kSet,        // key, value
  kGet,        // key
  kWait,       // count, keys..., timeout in ms
  kAdd,        // key, delta
  kDepartures,
  kGoodbye,  // no response
  kLeaving,  // how the rank is leaving ("exited with an error"...)
};

enum class Status : uint8_t {
  kOk = 0,
  kMissing,
  kTimeout,
  kDenied,     // Another run secret.
  kOtherJob,   // Same secret, another job id.
  kRankTaken,  // That rank is connected already.
};

constexpr size_t kMaxUnauthenticatedMessage = 4096;
// How a rank says it is leaving, as its peers' errors will quote it.
constexpr size_t kMaxLeavingText = 600;
constexpr size_t kMaxResponseBytes = size_t{1} << 30;
constexpr size_t kMaxRejectedKept = 16;
// How long the server stops accepting after running out of descriptors.
constexpr auto kAcceptPause = milliseconds(100);

class Writer {
 public:
  Writer& U8(uint8_t v) {
    bytes_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& U64(uint64_t v) {
    for (int i = 0; i < 8; ++i)
      bytes_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  Writer& Str(const std::string& s) {
    U64(s.size());
    bytes_ += s;
    return *this;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// `body` with its length prefix.
std::string Framed(const std::string& body) {
  std::string framed(4, '\0');
  const uint32_t n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) framed[i] = static_cast<char>(n >> (8 * i));
  return framed + body;
}

// Reads fields of a message; a malformed message throws.
class Reader {
 public:
  explicit Reader(const std::string& bytes) : bytes_(bytes) {}
  uint8_t U8() {
    Need(1);
    return static_cast<uint8_t>(bytes_[pos_++]);
  }
  uint64_t U64() {
    Need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) {
      v |= static_cast<uint64_t>(static_cast<uint8_t>(bytes_[pos_ + i]))
           << (8 * i);
    }
    pos_ += 8;
    return v;
  }
  std::string Str() {
    const uint64_t n = U64();
    Need(n);
    std::string s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }

 private:
  void Need(uint64_t n) const {
    if (n > bytes_.size() - pos_) throw std::length_error("truncated message");
  }
  const std::string& bytes_;
  size_t pos_ = 0;
};

uint32_t DecodeLength(const char* p) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) {
    n |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  }
  return n;
}

// Compares secrets in time independent of where they differ.
bool SecretsEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

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

// ---------------------------------------------------------------------------
// Server

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
          departures[conn.rank] = conn.said_goodbye ? "exited"
                                  : unreachable
                                      ? "unreachable at " + conn.address
                                      : "crashed";
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

// ---------------------------------------------------------------------------
// Client

// One connection to the server, shared by a TcpStore and its
// WithRequestTimeout views. A reader thread files each response under its
// request id; callers wait for theirs with their own deadline.
class TcpStore::Connection {
 public:
  Connection(std::string host, int port, const TcpStoreOptions& options)
      : host_(std::move(host)), port_(port) {
    try {
      Join(options);
    } catch (...) {
      if (fd_ >= 0) close(fd_);
      throw;
    }
    reader_ = std::thread([this] { ReadLoop(); });
  }

  ~Connection() {
    {
      std::lock_guard<std::mutex> lock(send_mutex_);
      const std::string goodbye = Framed(
          Writer().U64(0).U8(static_cast<uint8_t>(Op::kGoodbye)).bytes());
      send(fd_, goodbye.data(), goodbye.size(), MSG_NOSIGNAL);
    }
    shutdown(fd_, SHUT_RDWR);
    reader_.join();
    close(fd_);
    // server (rank 0 only) goes after the client has said goodbye.
    server.reset();
  }

  std::string Describe() const {
    return "rendezvous store at " + host_ + ":" + std::to_string(port_) +
           " (hosted by rank 0)";
  }

  // Sends `request` (an Op and its fields) and returns the response's Status
  // and fields.
  std::string Call(const std::string& request, milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    uint64_t id;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ThrowIfFailed();
      id = next_id_++;
      expected_.insert(id);
    }
    try {
      Send(Framed(Writer().U64(id).bytes() + request), deadline, timeout);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      expected_.erase(id);
      throw;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    const bool answered = arrived_.wait_until(
        lock, deadline, [&] { return responses_.count(id) != 0 || failed_; });
    expected_.erase(id);
    auto it = responses_.find(id);
    if (it != responses_.end()) {
      std::string response = std::move(it->second);
      responses_.erase(it);
      return response;
    }
    if (!answered) throw NotAnswering(timeout);
    ThrowIfFailed();
    throw Error("store: no response and no error");  // Not reached.
  }

  std::unique_ptr<TcpStoreServer> server;

 private:
  // Connects and says hello, again if the server closed the connection
  // before answering (it evicts the oldest silent connections under a flood
  // of strangers).
  void Join(const TcpStoreOptions& options) {
    const auto deadline = Clock::now() + options.connect_timeout;
    const std::string hello = Framed(
        Writer()
            .U64(0)
            .U8(static_cast<uint8_t>(Op::kHello))
            .Str(options.secret)
            .U64(static_cast<uint64_t>(static_cast<int64_t>(options.rank)))
            .Str(options.job_id)
            .bytes());
    network_timeout_ = options.network_timeout;
    auto backoff = milliseconds(10);
    const auto started = Clock::now();
    int attempts = 0;
    while (true) {
      ++attempts;
      const auto left =
          std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      // Connect's message adds the address.
      fd_ = net::Connect(host_, port_, std::max(left, milliseconds(1)),
                         "rendezvous store (hosted by rank 0)");
      net::SetNetworkTimeout(fd_, options.network_timeout);
      char header[4];
      std::string body;
      net::SendAll(fd_, hello.data(), hello.size(), Describe());
      net::RecvStatus status = net::RecvAll(fd_, header, 4, deadline);
      if (status == net::RecvStatus::kOk) {
        const uint32_t length = DecodeLength(header);
        if (length < 9 || length > 64) {
          status = net::RecvStatus::kClosed;
        } else {
          body.resize(length);
          status = net::RecvAll(fd_, body.data(), length, deadline);
        }
      }
      if (status == net::RecvStatus::kOk) {
        CheckHelloReply(static_cast<Status>(body[8]), options);
        ACCEL_VLOG(1) << "connected to the " << Describe() << " in "
                      << std::chrono::duration_cast<milliseconds>(Clock::now() -
                                                                  started)
                             .count()
                      << " ms (" << attempts
                      << (attempts == 1 ? " attempt)" : " attempts)");
        break;
      }
      close(fd_);
      fd_ = -1;
      if (status == net::RecvStatus::kTimedOut ||
          Clock::now() + backoff >= deadline) {
        throw TimeoutError("the " + Describe() +
                           " did not answer this process's hello within " +
                           std::to_string(options.connect_timeout.count()) +
                           " ms");
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, milliseconds(200));
    }
    fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
  }

  void CheckHelloReply(Status status, const TcpStoreOptions& options) {
    if (status == Status::kOk) return;
    close(fd_);
    fd_ = -1;
    const std::string port = std::to_string(port_);
    switch (status) {
      case Status::kDenied:
        throw UsageError(
            Describe() +
            " rejected this process: it belongs to another run (the run "
            "secret in ACCEL_RUN_SECRET differs; rank 0 reports it too). "
            "Export the same ACCEL_RUN_SECRET on every machine, or, if "
            "another job uses port " +
            port + ", choose another with --main_process_port");
      case Status::kOtherJob:
        throw UsageError(
            Describe() +
            " belongs to another job that shares this run secret (the job "
            "ids differ): is another job using port " +
            port + "? Choose another with --main_process_port");
      case Status::kRankTaken:
        throw UsageError(Describe() + " already has a rank " +
                         std::to_string(options.rank) +
                         ": is another job using port " + port +
                         " with the same ACCEL_RUN_SECRET? Choose another "
                         "with --main_process_port");
      default:
        throw UsageError(Describe() + " refused this process");
    }
  }

  void Send(const std::string& frame, Clock::time_point deadline,
            milliseconds timeout) {
    std::lock_guard<std::mutex> lock(send_mutex_);
    size_t sent = 0;
    while (sent < frame.size()) {
      const ssize_t n =
          send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN) {
        Fail(errno);
        std::lock_guard<std::mutex> state(mutex_);
        ThrowIfFailed();
      }
      const auto left =
          std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      pollfd pfd{fd_, POLLOUT, 0};
      if (left.count() <= 0 ||
          poll(&pfd, 1, static_cast<int>(left.count())) == 0) {
        // A frame cut short would garble every later request.
        if (sent > 0) Fail(ETIMEDOUT, /*stopped=*/true);
        throw NotAnswering(timeout);
      }
    }
  }

  void ReadLoop() {
    std::string inbox;
    char buffer[65536];
    while (true) {
      pollfd pfd{fd_, POLLIN, 0};
      if (poll(&pfd, 1, -1) < 0) {
        if (errno == EINTR) continue;
        Fail(errno);
        return;
      }
      const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) {
        Fail(n == 0 ? 0 : errno);
        return;
      }
      inbox.append(buffer, static_cast<size_t>(n));
      while (inbox.size() >= 4) {
        const size_t length = DecodeLength(inbox.data());
        if (length < 9 || length > kMaxResponseBytes) {
          Fail(EPROTO);
          return;
        }
        if (inbox.size() < 4 + length) break;
        uint64_t id = 0;
        for (int i = 0; i < 8; ++i) {
          id |= static_cast<uint64_t>(static_cast<uint8_t>(inbox[4 + i]))
                << (8 * i);
        }
        {
          std::lock_guard<std::mutex> lock(mutex_);
          // Answers to requests that timed out are dropped.
          if (expected_.count(id) != 0) {
            responses_[id] = inbox.substr(12, length - 8);
          }
        }
        inbox.erase(0, 4 + length);
        arrived_.notify_all();
      }
    }
  }

  void Fail(int error, bool stopped = false) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (failed_) return;
      failed_ = true;
      error_ = error;
      stopped_ = stopped;
    }
    arrived_.notify_all();
  }

  // Requires mutex_.
  void ThrowIfFailed() const {
    if (!failed_) return;
    if (stopped_) {
      throw TimeoutError("the connection to the " + Describe() +
                         " was given up earlier: rank 0 stopped answering");
    }
    if (net::IsUnreachableError(error_)) {
      throw PeerError(
          "lost the connection to the " + Describe() +
              ": rank 0's machine stopped answering on the network for " +
              std::to_string(network_timeout_.count() / 1000) + " s (" +
              std::strerror(error_) + "); it is down or unreachable",
          0);
    }
    throw PeerError("lost the connection to the " + Describe() +
                        ": rank 0 exited or crashed" +
                        (error_ == 0 || error_ == ECONNRESET
                             ? std::string()
                             : std::string(" (") + std::strerror(error_) + ")"),
                    0);
  }

  TimeoutError NotAnswering(milliseconds timeout) const {
    return TimeoutError("the " + Describe() + " did not answer within " +
                        std::to_string(timeout.count()) +
                        " ms: rank 0's process is stopped or overloaded "
                        "(its machine still answers on the network)");
  }

  const std::string host_;
  const int port_;
  int fd_ = -1;
  milliseconds network_timeout_{0};
  std::mutex send_mutex_;  // Held only while writing one request.
  std::thread reader_;

  std::mutex mutex_;
  std::condition_variable arrived_;
  uint64_t next_id_ = 1;
  std::set<uint64_t> expected_;
  std::map<uint64_t, std::string> responses_;
  bool failed_ = false;
  bool stopped_ = false;
  int error_ = 0;
};

TcpStore::TcpStore(std::string host, int port, TcpStoreOptions options)
    : connection_(std::make_shared<Connection>(std::move(host), port, options)),
      request_timeout_(options.request_timeout) {}

TcpStore::TcpStore(std::shared_ptr<Connection> connection,
                   milliseconds request_timeout)
    : connection_(std::move(connection)), request_timeout_(request_timeout) {}

TcpStore::~TcpStore() = default;

void TcpStore::AdoptServer(std::unique_ptr<TcpStoreServer> server) {
  connection_->server = std::move(server);
}

TcpStoreServer* TcpStore::server() { return connection_->server.get(); }

std::shared_ptr<Store> TcpStore::WithRequestTimeout(milliseconds timeout) {
  return std::shared_ptr<TcpStore>(new TcpStore(connection_, timeout));
}

std::string TcpStore::Call(const std::string& request,
                           milliseconds extra_wait) {
  return connection_->Call(request, request_timeout_ + extra_wait);
}

void TcpStore::leave(const std::string& how) {
  Call(Writer().U8(static_cast<uint8_t>(Op::kLeaving)).Str(how).bytes(),
       milliseconds(0));
}

void TcpStore::set(const std::string& key, const std::string& value) {
  Call(Writer().U8(static_cast<uint8_t>(Op::kSet)).Str(key).Str(value).bytes(),
       milliseconds(0));
}

std::optional<std::string> TcpStore::try_get(const std::string& key) {
  const std::string reply =
      Call(Writer().U8(static_cast<uint8_t>(Op::kGet)).Str(key).bytes(),
           milliseconds(0));
  Reader reader(reply);
  if (static_cast<Status>(reader.U8()) != Status::kOk) return std::nullopt;
  return reader.Str();
}

void TcpStore::wait(const std::vector<std::string>& keys,
                    milliseconds timeout) {
  Writer request;
  request.U8(static_cast<uint8_t>(Op::kWait)).U64(keys.size());
  for (const auto& key : keys) request.Str(key);
  request.U64(static_cast<uint64_t>(std::max<int64_t>(0, timeout.count())));
  const std::string reply = Call(request.bytes(), timeout);
  Reader reader(reply);
  if (static_cast<Status>(reader.U8()) == Status::kOk) return;
  std::vector<std::string> missing(reader.U64());
  for (auto& key : missing) key = reader.Str();
  throw TimeoutError("store: timed out after " +
                     std::to_string(timeout.count()) + " ms waiting for keys " +
                     JoinKeys(missing));
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  const std::string reply = Call(Writer()
                                     .U8(static_cast<uint8_t>(Op::kAdd))
                                     .Str(key)
                                     .U64(static_cast<uint64_t>(delta))
                                     .bytes(),
                                 milliseconds(0));
  Reader reader(reply);
  reader.U8();
  return static_cast<int64_t>(reader.U64());
}

std::map<int, std::string> TcpStore::departures() {
  const std::string reply =
      Call(Writer().U8(static_cast<uint8_t>(Op::kDepartures)).bytes(),
           milliseconds(0));
  Reader reader(reply);
  reader.U8();
  std::map<int, std::string> result;
  const uint64_t count = reader.U64();
  for (uint64_t i = 0; i < count; ++i) {
    const int rank = static_cast<int>(static_cast<int64_t>(reader.U64()));
    result[rank] = reader.Str();
  }
  return result;
}

}  // namespace accel
