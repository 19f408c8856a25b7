#include "backends/shm/shared_segment.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"
#include "accel/runtime/base/random_hex.h"

namespace accel {
namespace {

using Clock = std::chrono::steady_clock;

// How long local rank 0 listens to one connection for its request: a
// stranger that connects and says nothing must not hold up the job.
constexpr auto kRequestTimeout = std::chrono::seconds(2);

std::string SystemError(const char* what) {
  return std::string(what) + ": " + ErrnoText(errno);
}

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

// Abstract-namespace address: no file to remove when the process dies.
socklen_t AbstractAddress(const std::string& name, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof(addr->sun_path)) {
    throw Error("socket name too long: " + name);
  }
  std::memcpy(addr->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 +
                                name.size());
}

bool WaitReadable(int fd, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const int n = poll(&p, 1, RemainingMs(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) throw Error(SystemError("poll"));
  }
}

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// The request a local rank sends: the nonce, then its local rank.
struct Request {
  std::string nonce;
  int local_rank = -1;
};

// Reads "<nonce> <local rank>\n" from a connection, or nothing in time.
bool ReadRequest(int fd, Clock::time_point deadline, Request* request) {
  std::string text;
  char buffer[128];
  while (text.find('\n') == std::string::npos && text.size() < 256) {
    if (!WaitReadable(fd, deadline)) return false;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return false;
    text.append(buffer, static_cast<size_t>(n));
  }
  std::istringstream in(text);
  return static_cast<bool>(in >> request->nonce >> request->local_rank);
}

bool SameUser(int fd) {
  ucred credentials{};
  socklen_t length = sizeof(credentials);
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0 &&
         credentials.uid == getuid();
}

void SendDescriptor(int socket, int fd, uint64_t size) {
  char control[CMSG_SPACE(sizeof(int))] = {};
  iovec data{&size, sizeof(size)};
  msghdr message{};
  message.msg_iov = &data;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
  if (sendmsg(socket, &message, MSG_NOSIGNAL) != sizeof(size)) {
    throw PeerError(SystemError("sending the shared memory descriptor"));
  }
}

int ReceiveDescriptor(int socket, uint64_t* size) {
  char control[CMSG_SPACE(sizeof(int))] = {};
  iovec data{size, sizeof(*size)};
  msghdr message{};
  message.msg_iov = &data;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
  if (n != sizeof(*size)) return -1;
  for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
       header = CMSG_NXTHDR(&message, header)) {
    if (header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_RIGHTS) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(header), sizeof(int));
      return fd;
    }
  }
  return -1;
}

}  // namespace

SharedSegment::SharedSegment(int local_rank, int local_size, size_t bytes,
                             Store& store, std::chrono::milliseconds timeout)
    : size_(bytes) {
  if (local_rank < 0 || local_rank >= local_size || bytes == 0) {
    throw UsageError(
        "shared segment: local rank " + std::to_string(local_rank) + " of " +
        std::to_string(local_size) + ", " + std::to_string(bytes) + " bytes");
  }
  const auto deadline = Clock::now() + timeout;
  FileDescriptor fd(local_rank == 0
                        ? CreateAndServe(local_size, store, deadline)
                        : Fetch(local_rank, store, deadline));
  // MAP_POPULATE: page faults now rather than in the first collective.
  void* data = mmap(nullptr, size_, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (data == MAP_FAILED) throw Error(SystemError("mapping shared memory"));
  data_ = static_cast<char*>(data);
}

SharedSegment::~SharedSegment() {
  if (data_ != nullptr) munmap(data_, size_);
}

int SharedSegment::CreateAndServe(int local_size, Store& store,
                                  Clock::time_point deadline) {
  FileDescriptor file(memfd_create("accel-shm", MFD_CLOEXEC));
  if (file.get() < 0) throw Error(SystemError("memfd_create"));
  if (ftruncate(file.get(), static_cast<off_t>(size_)) != 0) {
    throw Error(SystemError(
        errno == EFBIG ? "sizing shared memory (counted against the file-size "
                         "limit)"
                       : "sizing shared memory (is /dev/shm full?)"));
  }
  if (local_size == 1) return file.release();

  FileDescriptor listener(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.get() < 0) throw Error(SystemError("unix socket"));
  const std::string name = "accel-shm-" + RandomHex(16);
  sockaddr_un addr;
  const socklen_t length = AbstractAddress(name, &addr);
  if (bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), length) != 0 ||
      listen(listener.get(), local_size) != 0) {
    throw Error(SystemError("listening on a unix socket"));
  }
  const std::string nonce = RandomHex(16);
  store.set("segment", name + " " + nonce);

  std::vector<bool> joined(local_size, false);
  joined[0] = true;
  int missing = local_size - 1;
  while (missing > 0) {
    if (!WaitReadable(listener.get(), deadline)) {
      std::string ranks;
      for (int r = 1; r < local_size; ++r) {
        if (!joined[r])
          ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      }
      throw TimeoutError("local rank(s) " + ranks +
                         " did not fetch the shared memory segment");
    }
    FileDescriptor peer(
        accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (peer.get() < 0) continue;
    Request request;
    const auto request_deadline = std::min(
        deadline, Clock::now() + std::chrono::milliseconds(kRequestTimeout));
    // A stranger (wrong nonce, another user, garbage) loses its connection.
    if (!ReadRequest(peer.get(), request_deadline, &request) ||
        request.nonce != nonce || !SameUser(peer.get()) ||
        request.local_rank <= 0 || request.local_rank >= local_size ||
        joined[request.local_rank]) {
      continue;
    }
    SendDescriptor(peer.get(), file.get(), size_);
    joined[request.local_rank] = true;
    --missing;
  }
  return file.release();
}

int SharedSegment::Fetch(int local_rank, Store& store,
                         Clock::time_point deadline) {
  const std::string published = store.get(
      "segment", std::chrono::milliseconds(std::max(1, RemainingMs(deadline))));
  std::istringstream in(published);
  std::string name, nonce;
  if (!(in >> name >> nonce)) {
    throw Error("malformed shared memory address '" + published + "'");
  }
  FileDescriptor connection(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (connection.get() < 0) throw Error(SystemError("unix socket"));
  sockaddr_un addr;
  const socklen_t length = AbstractAddress(name, &addr);
  if (connect(connection.get(), reinterpret_cast<sockaddr*>(&addr), length) !=
      0) {
    throw PeerError(SystemError(
        "local rank 0 of this host did not serve the shared memory segment "
        "(did it exit?); connecting"));
  }
  const std::string request = nonce + " " + std::to_string(local_rank) + "\n";
  if (send(connection.get(), request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    throw PeerError(SystemError("asking local rank 0 for shared memory"));
  }
  if (!WaitReadable(connection.get(), deadline)) {
    throw TimeoutError("local rank 0 did not send the shared memory segment");
  }
  uint64_t size = 0;
  const int fd = ReceiveDescriptor(connection.get(), &size);
  if (fd < 0) {
    throw PeerError(
        "local rank 0 closed the connection instead of sending the shared "
        "memory segment");
  }
  struct stat info;
  if (size != size_ || fstat(fd, &info) != 0 ||
      static_cast<uint64_t>(info.st_size) != size_) {
    close(fd);
    throw Error("shared memory segment has " + std::to_string(size) +
                " bytes, expected " + std::to_string(size_) +
                " (ranks disagree on its layout)");
  }
  return fd;
}

}  // namespace accel
