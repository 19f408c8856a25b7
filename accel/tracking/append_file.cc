#include "accel/tracking/append_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"

namespace accel {

AppendFile::AppendFile(std::string path) : path_(std::move(path)) {
  try {
    MakeDirectories(FolderOf(path_));
  } catch (const CheckpointError& e) {
    throw Error(std::string("cannot open '") + path_ +
                "' for logging: " + e.what());
  }
  fd_ = open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw Error("cannot open '" + path_ +
                "' for logging: " + std::strerror(errno));
  }
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) close(fd_);
}

void AppendFile::Append(std::string_view bytes) {
  if (fd_ < 0) throw Error("'" + path_ + "' was closed; cannot log to it");
  while (!bytes.empty()) {
    const ssize_t written = write(fd_, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write to '" + path_ + "': " + std::strerror(errno));
    }
    bytes.remove_prefix(static_cast<size_t>(written));
  }
}

void AppendFile::Close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (close(fd) != 0) {
    throw Error("cannot close '" + path_ + "': " + std::strerror(errno));
  }
}

}  // namespace accel
