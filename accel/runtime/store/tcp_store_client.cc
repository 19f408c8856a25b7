// The TCP store's client: one connection shared by a TcpStore and its
// WithRequestTimeout views (see tcp_store.h).
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

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using store_wire::DecodeLength;
using store_wire::Framed;
using store_wire::kMaxResponseBytes;
using store_wire::kProtocolVersion;
using store_wire::Op;
using store_wire::Reader;
using store_wire::Status;
using store_wire::Writer;

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
            .U64(kProtocolVersion)
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
            "secret in ACCEL_RUN_SECRET differs; rank 0 reports it too when "
            "it waits for this rank). "
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
      case Status::kOtherVersion:
        throw UsageError(Describe() +
                         " speaks another version of the store protocol: "
                         "the job's machines run different accel builds; "
                         "run the same one everywhere");
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
      throw UnreachableError(
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

void TcpStore::leave(const Departure& how) {
  // The server keeps the text: the wire carries it as every store's.
  Call(Writer().U8(Op::kLeaving).Str(how.ToString()).bytes(), milliseconds(0));
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

std::map<int, Departure> TcpStore::departures() {
  const std::string reply =
      Call(Writer().U8(static_cast<uint8_t>(Op::kDepartures)).bytes(),
           milliseconds(0));
  Reader reader(reply);
  reader.U8();
  std::map<int, Departure> result;
  const uint64_t count = reader.U64();
  for (uint64_t i = 0; i < count; ++i) {
    const int rank = static_cast<int>(static_cast<int64_t>(reader.U64()));
    result[rank] = Departure::FromString(reader.Str());
  }
  return result;
}

}  // namespace accel
