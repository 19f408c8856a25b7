#include "accel/runtime/base/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

// Unique among the threads and processes that may save the same file.
std::string TemporaryName(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".partial." + std::to_string(getpid()) + "." +
         std::to_string(counter++);
}

// Empties the folder `name` (opened without following a link) under
// `parent` as RemoveOwnedTree describes, then removes it if nothing stayed.
void RemoveOwnedIn(int parent, const std::string& name,
                   const std::string& relative,
                   const std::function<bool(const std::string&)>& owned,
                   Removal* removal) {
  std::vector<std::string>* kept = &removal->kept;
  const size_t kept_before = kept->size();
  const int fd = openat(parent, name.c_str(),
                        O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  const std::string shown = relative.empty() ? "." : relative;
  if (fd < 0) {
    kept->push_back(shown + " (" + std::strerror(errno) + ")");
    return;
  }
  DIR* folder = fdopendir(fd);
  if (folder == nullptr) {
    close(fd);
    kept->push_back(shown + " (" + std::strerror(errno) + ")");
    return;
  }
  std::vector<std::string> entries;
  while (const dirent* entry = readdir(folder)) {
    const std::string entry_name = entry->d_name;
    if (entry_name != "." && entry_name != "..") entries.push_back(entry_name);
  }
  for (const std::string& entry : entries) {
    const std::string path = relative.empty() ? entry : relative + "/" + entry;
    struct stat info;
    if (fstatat(fd, entry.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0) {
      kept->push_back(path);
    } else if (S_ISDIR(info.st_mode)) {
      RemoveOwnedIn(fd, entry, path, owned, removal);
    } else if ((!S_ISLNK(info.st_mode) &&
                (!S_ISREG(info.st_mode) || !owned(entry))) ||
               unlinkat(fd, entry.c_str(), 0) != 0) {
      kept->push_back(path);
    } else {
      ++removal->removed;
    }
  }
  closedir(folder);  // Closes fd.
  if (kept->size() == kept_before &&
      unlinkat(parent, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    kept->push_back(shown + " (" + std::strerror(errno) + ")");
  }
}

}  // namespace

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), temporary_(TemporaryName(path_)) {
  fd_ = open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) Fail("create");
}

AtomicFile::~AtomicFile() { Discard(); }

void AtomicFile::Discard() {
  if (fd_ < 0) return;
  close(fd_);
  fd_ = -1;
  std::remove(temporary_.c_str());
}

std::string ErrnoText(int error) {
  std::string text = std::strerror(error);
  rlimit limit{};
  if (error == EFBIG && getrlimit(RLIMIT_FSIZE, &limit) == 0 &&
      limit.rlim_cur != RLIM_INFINITY) {
    text += " (the file-size limit, ulimit -f, is " +
            std::to_string(limit.rlim_cur) + " bytes)";
  }
  return text;
}

void AtomicFile::Fail(const std::string& action) {
  const std::string reason = ErrnoText(errno);
  Discard();
  throw CheckpointError("cannot " + action + " '" + temporary_ + "' (for '" +
                        path_ + "'): " + reason);
}

void AtomicFile::Write(const void* data, size_t size) {
  if (fd_ < 0) {
    throw CheckpointError("AtomicFile::Write after Commit or a failure of '" +
                          path_ + "'");
  }
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t written = write(fd_, bytes, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      Fail("write");
    }
    bytes += written;
    size -= static_cast<size_t>(written);
  }
}

void AtomicFile::Commit() {
  if (fd_ < 0) {
    throw CheckpointError("AtomicFile::Commit twice or after a failure of '" +
                          path_ + "'");
  }
  if (fsync(fd_) != 0) Fail("flush");
  if (close(fd_) != 0) {
    fd_ = -1;
    const std::string reason = std::strerror(errno);
    std::remove(temporary_.c_str());
    throw CheckpointError("cannot close '" + temporary_ + "': " + reason);
  }
  fd_ = -1;
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary_.c_str());
    throw CheckpointError("cannot rename '" + temporary_ + "' to '" + path_ +
                          "': " + reason);
  }
  const int folder =
      open(FolderOf(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (folder >= 0) {
    fsync(folder);  // Best effort: some file systems refuse it.
    close(folder);
  }
}

void WriteFileAtomically(const std::string& path, std::string_view contents) {
  AtomicFile file(path);
  file.Write(contents);
  file.Commit();
}

void MakeDirectories(const std::string& dir) {
  std::string path;
  size_t start = 0;
  while (start <= dir.size()) {
    size_t slash = dir.find('/', start);
    if (slash == std::string::npos) slash = dir.size();
    path = dir.substr(0, slash);
    start = slash + 1;
    if (path.empty()) continue;  // The root of an absolute path.
    if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      throw CheckpointError("cannot create folder '" + path +
                            "': " + std::strerror(errno));
    }
  }
  struct stat info;
  if (stat(dir.c_str(), &info) != 0) {
    // Something is there (mkdir said so) but cannot be followed: a link
    // loop, a dangling link, a path too long to resolve.
    const int error = errno;
    throw CheckpointError(
        "cannot create folder '" + dir + "': " + std::strerror(error) +
        (error == ELOOP ? " (a symbolic link loop)"
         : error == ENOENT
             ? " (a symbolic link to something that does not exist)"
             : ""));
  }
  if (!S_ISDIR(info.st_mode)) {
    throw CheckpointError("cannot create folder '" + dir +
                          "': a file of that name is in the way");
  }
}

bool IsWritableFolder(const std::string& dir) {
  struct stat info;
  if (stat(dir.c_str(), &info) != 0) return false;
  if (!S_ISDIR(info.st_mode)) {
    errno = ENOTDIR;
    return false;
  }
  return access(dir.c_str(), W_OK | X_OK) == 0;
}

std::string FolderOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string ReadSmallFile(const std::string& path, uint64_t max_bytes,
                          const char* kind) {
  const auto fail = [&](const std::string& defect) {
    throw CheckpointError(std::string(kind) + " '" + path + "': " + defect);
  };
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open: " + ErrnoText(errno));
  std::string text;
  struct stat info;
  const bool regular = fstat(fd, &info) == 0 && S_ISREG(info.st_mode);
  const uint64_t size = regular ? static_cast<uint64_t>(info.st_size) : 0;
  if (regular && size <= max_bytes) {
    text.resize(size);
    size_t done = 0;
    while (done < size) {
      const ssize_t got = read(fd, text.data() + done, size - done);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      done += static_cast<size_t>(got);
    }
    text.resize(done);
  }
  close(fd);
  if (!regular) fail("not a regular file");
  if (size > max_bytes) {
    fail(std::to_string(size) + " bytes, more than the " +
         std::to_string(max_bytes) + " such a file can plausibly hold");
  }
  if (text.size() != size) fail("could not be read whole (changed meanwhile?)");
  return text;
}

std::string WhyNotARegularFile(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) return std::strerror(errno);
  if (S_ISREG(info.st_mode)) return "";
  return S_ISDIR(info.st_mode)                            ? "a folder"
         : S_ISFIFO(info.st_mode)                         ? "a FIFO"
         : S_ISCHR(info.st_mode) || S_ISBLK(info.st_mode) ? "a device"
                                                          : "not a file";
}

bool IsFile(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

std::vector<std::string> ListFolder(const std::string& dir) {
  DIR* folder = opendir(dir.c_str());
  if (folder == nullptr) {
    throw CheckpointError("cannot list folder '" + dir +
                          "': " + std::strerror(errno));
  }
  std::vector<std::string> names;
  while (const dirent* entry = readdir(folder)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(folder);
  std::sort(names.begin(), names.end());
  return names;
}

Removal RemoveOwnedTree(
    const std::string& dir,
    const std::function<bool(const std::string& name)>& owned) {
  Removal removal;
  struct stat info;
  if (lstat(dir.c_str(), &info) != 0) return removal;
  if (S_ISLNK(info.st_mode)) {
    if (unlink(dir.c_str()) != 0) {
      removal.kept.push_back(".");
    } else {
      ++removal.removed;
    }
  } else if (!S_ISDIR(info.st_mode)) {
    removal.kept.push_back(".");
  } else {
    RemoveOwnedIn(AT_FDCWD, dir, "", owned, &removal);
  }
  return removal;
}

}  // namespace accel
