#include "accel/runtime/tcp_store.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "accel/runtime/errors.h"
#include "accel/runtime/net.h"

namespace accel {
namespace {

using Clock = std::chrono::steady_clock;

// Wire format: every message is a little-endian u32 length followed by that
// many bytes; a request's first byte is its Op, a response's its Status.
enum class Op : uint8_t {
  kHello = 1,  // secret, rank
  kSet,        // key, value
  kGet,        // key
  kWait,       // count, keys..., timeout in ms
  kAdd,        // key, delta
  kDepartures,
  kGoodbye,  // no response
};

enum class Status : uint8_t { kOk = 0, kMissing, kTimeout, kDenied };

constexpr size_t kMaxUnauthenticatedMessage = 4096;

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
  // The message with its length prefix.
  std::string Framed() const {
    std::string framed(4, '\0');
    const uint32_t n = static_cast<uint32_t>(bytes_.size());
    for (int i = 0; i < 4; ++i) framed[i] = static_cast<char>(n >> (8 * i));
    return framed + bytes_;
  }

 private:
  std::string bytes_;
};

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

}  // namespace

struct TcpStoreServer::State {
  struct Connection {
    bool authenticated = false;
    int rank = -1;
    bool said_goodbye = false;
    bool close_after_flush = false;
    std::string in;
    std::string out;
  };
  struct Waiter {
    int fd;
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };

  std::map<std::string, std::string> values;
  std::map<int, std::string> departures;
  std::map<int, Connection> connections;  // By file descriptor.
  std::vector<Waiter> waiters;

  bool HasAll(const std::vector<std::string>& keys) const {
    for (const auto& key : keys) {
      if (values.count(key) == 0) return false;
    }
    return true;
  }

  void Reply(int fd, const Writer& response) {
    connections[fd].out += response.Framed();
  }

  void WakeWaiters() {
    auto ready = [&](const Waiter& w) {
      if (!HasAll(w.keys)) return false;
      Reply(w.fd, Writer().U8(static_cast<uint8_t>(Status::kOk)));
      return true;
    };
    waiters.erase(std::remove_if(waiters.begin(), waiters.end(), ready),
                  waiters.end());
  }

  void ExpireWaiters(Clock::time_point now) {
    auto expired = [&](const Waiter& w) {
      if (w.deadline > now) return false;
      Writer response;
      response.U8(static_cast<uint8_t>(Status::kTimeout));
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

  // Handles one request; throws on a malformed one.
  void Handle(int fd, const std::string& message, const std::string& secret) {
    Connection& conn = connections[fd];
    Reader reader(message);
    const auto op = static_cast<Op>(reader.U8());
    if (!conn.authenticated && op != Op::kHello) {
      throw std::runtime_error("request before hello");
    }
    switch (op) {
      case Op::kHello: {
        const std::string presented = reader.Str();
        const int rank = static_cast<int>(static_cast<int64_t>(reader.U64()));
        if (!SecretsEqual(presented, secret)) {
          Reply(fd, Writer().U8(static_cast<uint8_t>(Status::kDenied)));
          conn.close_after_flush = true;
          return;
        }
        conn.authenticated = true;
        conn.rank = rank;
        Reply(fd, Writer().U8(static_cast<uint8_t>(Status::kOk)));
        return;
      }
      case Op::kSet: {
        const std::string key = reader.Str();
        values[key] = reader.Str();
        Reply(fd, Writer().U8(static_cast<uint8_t>(Status::kOk)));
        WakeWaiters();
        return;
      }
      case Op::kGet: {
        auto it = values.find(reader.Str());
        if (it == values.end()) {
          Reply(fd, Writer().U8(static_cast<uint8_t>(Status::kMissing)));
        } else {
          Reply(fd,
                Writer().U8(static_cast<uint8_t>(Status::kOk)).Str(it->second));
        }
        return;
      }
      case Op::kWait: {
        const uint64_t count = reader.U64();
        if (count > message.size()) throw std::length_error("bad key count");
        Waiter waiter{fd, {}, {}};
        for (uint64_t i = 0; i < count; ++i)
          waiter.keys.push_back(reader.Str());
        const auto timeout = std::chrono::milliseconds(
            std::min<uint64_t>(reader.U64(), uint64_t{1} << 40));
        waiter.deadline = Clock::now() + timeout;
        if (HasAll(waiter.keys)) {
          Reply(fd, Writer().U8(static_cast<uint8_t>(Status::kOk)));
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
        Reply(fd, Writer()
                      .U8(static_cast<uint8_t>(Status::kOk))
                      .U64(static_cast<uint64_t>(result)));
        WakeWaiters();
        return;
      }
      case Op::kDepartures: {
        Writer response;
        response.U8(static_cast<uint8_t>(Status::kOk)).U64(departures.size());
        for (const auto& [rank, how] : departures) {
          response.U64(static_cast<uint64_t>(static_cast<int64_t>(rank)))
              .Str(how);
        }
        Reply(fd, response);
        return;
      }
      case Op::kGoodbye:
        conn.said_goodbye = true;
        return;
    }
    throw std::runtime_error("unknown request");
  }

  void Drop(int fd) {
    auto it = connections.find(fd);
    if (it == connections.end()) return;
    if (it->second.authenticated && it->second.rank >= 0) {
      departures[it->second.rank] =
          it->second.said_goodbye ? "exited" : "crashed";
    }
    waiters.erase(std::remove_if(waiters.begin(), waiters.end(),
                                 [fd](const Waiter& w) { return w.fd == fd; }),
                  waiters.end());
    connections.erase(it);
    close(fd);
  }
};

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options)
    : options_(std::move(options)), state_(std::make_unique<State>()) {
  listen_fd_ = net::Listen(options_.host, options_.port, &port_);
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

void TcpStoreServer::Serve() {
  State& state = *state_;
  std::vector<pollfd> fds;
  while (true) {
    fds.clear();
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const auto& [fd, conn] : state.connections) {
      const short events =
          static_cast<short>((conn.close_after_flush ? 0 : POLLIN) |
                             (conn.out.empty() ? 0 : POLLOUT));
      fds.push_back({fd, events, 0});
    }
    int timeout_ms = -1;
    const auto now = Clock::now();
    for (const auto& w : state.waiters) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            w.deadline - now)
                            .count() +
                        1;
      const int bounded =
          static_cast<int>(std::clamp<int64_t>(left, 0, 1000000));
      timeout_ms = timeout_ms < 0 ? bounded : std::min(timeout_ms, bounded);
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) break;
    if (fds[0].revents != 0) break;
    if (fds[1].revents & POLLIN) {
      while (true) {
        const int fd =
            accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        state.connections[fd];
      }
    }
    std::vector<int> to_drop;
    for (size_t i = 2; i < fds.size(); ++i) {
      const int fd = fds[i].fd;
      const short revents = fds[i].revents;
      State::Connection& conn = state.connections[fd];
      if (revents & (POLLIN | POLLHUP | POLLERR)) {
        char buffer[65536];
        bool closed = false;
        while (true) {
          const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
          if (n > 0) {
            conn.in.append(buffer, static_cast<size_t>(n));
            if (static_cast<size_t>(n) < sizeof(buffer)) break;
            continue;
          }
          if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
          closed = true;
          break;
        }
        try {
          while (conn.in.size() >= 4 && !conn.close_after_flush) {
            const size_t length = DecodeLength(conn.in.data());
            const size_t limit = conn.authenticated
                                     ? options_.max_message_bytes
                                     : kMaxUnauthenticatedMessage;
            if (length == 0 || length > limit) {
              throw std::length_error("message too large");
            }
            if (conn.in.size() < 4 + length) break;
            const std::string message = conn.in.substr(4, length);
            conn.in.erase(0, 4 + length);
            state.Handle(fd, message, options_.secret);
          }
        } catch (const std::exception&) {
          // A peer that speaks garbage loses its connection, nothing else.
          closed = true;
        }
        if (closed) {
          to_drop.push_back(fd);
          continue;
        }
      }
      if (!conn.out.empty()) {
        const ssize_t n =
            send(fd, conn.out.data(), conn.out.size(), MSG_NOSIGNAL);
        if (n > 0) {
          conn.out.erase(0, static_cast<size_t>(n));
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
          to_drop.push_back(fd);
          continue;
        }
      }
      if (conn.close_after_flush && conn.out.empty()) to_drop.push_back(fd);
    }
    for (int fd : to_drop) state.Drop(fd);
    state.ExpireWaiters(Clock::now());
  }
}

TcpStore::TcpStore(std::string host, int port, TcpStoreOptions options)
    : host_(std::move(host)), port_(port), options_(std::move(options)) {
  fd_ = net::Connect(host_, port_, options_.connect_timeout, Describe());
  const std::string reply =
      Call(Writer()
               .U8(static_cast<uint8_t>(Op::kHello))
               .Str(options_.secret)
               .U64(static_cast<uint64_t>(static_cast<int64_t>(options_.rank)))
               .Framed(),
           std::chrono::milliseconds(0));
  if (static_cast<Status>(reply[0]) != Status::kOk) {
    close(fd_);
    fd_ = -1;
    throw UsageError(
        Describe() +
        " rejected this process: it belongs to another run (the run secret "
        "in ACCEL_RUN_SECRET differs). Is another job using port " +
        std::to_string(port_) + "? Choose another with --main_process_port");
  }
}

TcpStore::~TcpStore() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ >= 0) {
    const std::string goodbye =
        Writer().U8(static_cast<uint8_t>(Op::kGoodbye)).Framed();
    send(fd_, goodbye.data(), goodbye.size(), MSG_NOSIGNAL);
    close(fd_);
  }
  // server_ (rank 0 only) is destroyed after the client has said goodbye.
}

void TcpStore::AdoptServer(std::unique_ptr<TcpStoreServer> server) {
  server_ = std::move(server);
}

std::string TcpStore::Describe() const {
  return "rendezvous store at " + host_ + ":" + std::to_string(port_) +
         " (hosted by rank 0)";
}

std::string TcpStore::Call(const std::string& request,
                           std::chrono::milliseconds extra_wait) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) {
    throw PeerError("the connection to the " + Describe() + " was lost earlier",
                    0);
  }
  auto lost = [&](const std::string& why) {
    close(fd_);
    fd_ = -1;
    return PeerError("lost the connection to the " + Describe() + ": " + why,
                     0);
  };
  try {
    net::SendAll(fd_, request.data(), request.size(), Describe());
  } catch (const PeerError& e) {
    throw lost("rank 0 exited or crashed");
  }
  const auto deadline = Clock::now() + options_.request_timeout + extra_wait;
  char header[4];
  std::string body;
  net::RecvStatus status = net::RecvAll(fd_, header, 4, deadline);
  if (status == net::RecvStatus::kOk) {
    const uint32_t length = DecodeLength(header);
    if (length == 0 || length > (1u << 30)) throw lost("malformed response");
    body.resize(length);
    status = net::RecvAll(fd_, body.data(), length, deadline);
  }
  if (status == net::RecvStatus::kClosed) {
    throw lost("rank 0 exited or crashed");
  }
  if (status == net::RecvStatus::kTimedOut) {
    close(fd_);
    fd_ = -1;
    throw TimeoutError(
        "the " + Describe() + " did not answer within " +
        std::to_string((options_.request_timeout + extra_wait).count()) +
        " ms");
  }
  return body;
}

void TcpStore::set(const std::string& key, const std::string& value) {
  Call(Writer().U8(static_cast<uint8_t>(Op::kSet)).Str(key).Str(value).Framed(),
       std::chrono::milliseconds(0));
}

std::optional<std::string> TcpStore::try_get(const std::string& key) {
  const std::string reply =
      Call(Writer().U8(static_cast<uint8_t>(Op::kGet)).Str(key).Framed(),
           std::chrono::milliseconds(0));
  Reader reader(reply);
  if (static_cast<Status>(reader.U8()) != Status::kOk) return std::nullopt;
  return reader.Str();
}

void TcpStore::wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout) {
  Writer request;
  request.U8(static_cast<uint8_t>(Op::kWait)).U64(keys.size());
  for (const auto& key : keys) request.Str(key);
  request.U64(static_cast<uint64_t>(std::max<int64_t>(0, timeout.count())));
  const std::string reply = Call(request.Framed(), timeout);
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
                                     .Framed(),
                                 std::chrono::milliseconds(0));
  Reader reader(reply);
  reader.U8();
  return static_cast<int64_t>(reader.U64());
}

std::map<int, std::string> TcpStore::departures() {
  const std::string reply =
      Call(Writer().U8(static_cast<uint8_t>(Op::kDepartures)).Framed(),
           std::chrono::milliseconds(0));
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
