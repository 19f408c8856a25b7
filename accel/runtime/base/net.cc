#include "accel/runtime/base/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>

#include "accel/runtime/base/errors.h"

namespace accel::net {
namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { freeaddrinfo(info); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfoPtr Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(),
                             service.c_str(), &hints, &result);
  if (rc != 0) {
    throw UsageError("cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  return AddrInfoPtr(result);
}

std::string Endpoint(const std::string& host, int port) {
  return host + ":" + std::to_string(port);
}

// The IP address of `addr` as text ("" if it has none).
std::string AddressText(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* ip =
      addr.ss_family == AF_INET6
          ? static_cast<const void*>(
                &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr)
          : static_cast<const void*>(
                &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr);
  return inet_ntop(addr.ss_family, ip, text, sizeof(text)) ? text : "";
}

int PortOf(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  }
  return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

}  // namespace

int Listen(const std::string& host, int port, int* bound_port) {
  AddrInfoPtr info = Resolve(host, port, /*passive=*/true);
  int last_errno = 0;
  for (addrinfo* ai = info.get(); ai != nullptr; ai = ai->ai_next) {
    int fd =
        socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    // The longest backlog the kernel allows (net.core.somaxconn, 4096 on
    // this kernel): every rank of a job connects to rank 0's store at once,
    // and a connection that finds the backlog full waits a second or more
    // for its SYN to be sent again.
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        listen(fd, SOMAXCONN) == 0) {
      if (bound_port != nullptr) *bound_port = PortOf(fd);
      return fd;
    }
    last_errno = errno;
    close(fd);
  }
  if (last_errno == EADDRINUSE) {
    throw UsageError("port " + std::to_string(port) + " on " + host +
                     " is already in use (another job, or a previous one "
                     "still shutting down); choose another with "
                     "--main_process_port=P, or --main_process_port=0 to "
                     "pick a free port");
  }
  throw UsageError("cannot listen on " + Endpoint(host, port) + ": " +
                   std::strerror(last_errno));
}

int Connect(const std::string& host, int port,
            std::chrono::milliseconds timeout, const std::string& what) {
  const auto deadline = Clock::now() + timeout;
  std::string last_error = "no address";
  auto backoff = std::chrono::milliseconds(10);
  // One attempt waits at most this long, so a SYN that was lost (a neighbour
  // entry not yet resolved, a full accept queue) costs a fresh attempt
  // rather than the kernel's retransmission schedule (1, 3, 7, 15, 31 s).
  auto attempt_limit = std::chrono::milliseconds(1000);
  while (true) {
    AddrInfoPtr info = Resolve(host, port, /*passive=*/false);
    for (addrinfo* ai = info.get(); ai != nullptr; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
                      ai->ai_protocol);
      if (fd < 0) continue;
      // A non-blocking connect bounds the wait for hosts that drop SYNs.
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
      int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd pfd{fd, POLLOUT, 0};
        const auto left =
            std::min(attempt_limit,
                     std::chrono::duration_cast<std::chrono::milliseconds>(
                         deadline - Clock::now()));
        const int ready = poll(&pfd, 1, std::max<int64_t>(0, left.count()));
        int err = ETIMEDOUT;
        socklen_t len = sizeof(err);
        if (ready == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
        // A slow path gets longer attempts; refusals retry at the backoff.
        if (err == ETIMEDOUT) {
          attempt_limit =
              std::min(attempt_limit * 2, std::chrono::milliseconds(8000));
        }
      }
      if (rc == 0) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return fd;
      }
      last_error = std::strerror(errno);
      close(fd);
    }
    if (Clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  throw TimeoutError("could not connect to the " + what + " at " +
                     Endpoint(host, port) + " within " +
                     std::to_string(timeout.count()) +
                     " ms (last error: " + last_error +
                     "); check that MASTER_ADDR/MASTER_PORT point at rank 0 "
                     "and that rank 0 is running");
}

void SendAll(int fd, const void* data, size_t size, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw PeerError("lost the connection to the " + what + ": " +
                      std::strerror(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

RecvStatus RecvAll(int fd, void* data, size_t size,
                   Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (left.count() <= 0) return RecvStatus::kTimedOut;
    pollfd pfd{fd, POLLIN, 0};
    const int ready =
        poll(&pfd, 1,
             static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;
    const ssize_t n = recv(fd, p, size, 0);
    if (n == 0) return RecvStatus::kClosed;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return RecvStatus::kClosed;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return RecvStatus::kOk;
}

std::string LocalAddressToward(const std::string& host) {
  AddrInfoPtr info = Resolve(host, 9, /*passive=*/false);
  for (addrinfo* ai = info.get(); ai != nullptr; ai = ai->ai_next) {
    // Connecting a UDP socket sends nothing; it only picks the route.
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    const bool ok =
        connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
    close(fd);
    if (!ok) continue;
    const std::string text = AddressText(local);
    if (!text.empty()) return text;
  }
  throw UsageError("no local network route toward '" + host + "'");
}

bool IsLoopback(const std::string& host) {
  AddrInfoPtr info = Resolve(host, 9, /*passive=*/false);
  for (addrinfo* ai = info.get(); ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<sockaddr_in*>(ai->ai_addr);
      if ((ntohl(in->sin_addr.s_addr) >> 24) != 127) return false;
    } else if (ai->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<sockaddr_in6*>(ai->ai_addr);
      if (!IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return false;
    }
  }
  return true;
}

void SetNetworkTimeout(int fd, std::chrono::milliseconds timeout) {
  const int total_s = std::max<int>(
      2,
      static_cast<int>(
          std::chrono::duration_cast<std::chrono::seconds>(timeout).count()));
  // Probe after a quarter of the budget of silence, then a few times more.
  const int idle_s = std::max(1, total_s / 4);
  const int interval_s = std::max(1, total_s / 8);
  const int probes = std::max(1, (total_s - idle_s) / interval_s);
  const int one = 1;
  const unsigned user_timeout_ms = static_cast<unsigned>(total_s) * 1000u;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
  // Keepalive covers idle connections; this covers unacknowledged data.
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms,
             sizeof(user_timeout_ms));
}

std::string PeerAddress(int fd) {
  sockaddr_storage peer{};
  socklen_t len = sizeof(peer);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) {
    return "";
  }
  return AddressText(peer);
}

bool IsUnreachableError(int error) {
  return error == ETIMEDOUT || error == EHOSTUNREACH || error == ENETUNREACH ||
         error == EHOSTDOWN;
}

int FindFreePort(const std::string& host) {
  int port = 0;
  const int fd = Listen(host, 0, &port);
  close(fd);
  return port;
}

}  // namespace accel::net
