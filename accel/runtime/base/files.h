// Files that are written whole or not at all, and the folders they go in.
//
// AtomicFile writes a file so that readers see either its old contents or
// the complete new ones, never a mix: a crash or an error mid-write leaves
// the old file whole (checkpoints and saved weights rely on this).
//
//   accel::AtomicFile file(dir + "/model.safetensors");
//   file.Write(header);
//   file.Write(tensor_bytes, tensor_size);
//   file.Commit();  // Now visible under its name. Without Commit, the
//                   // destructor removes the partial file.
//
//   accel::WriteFileAtomically(dir + "/index.json", text);  // All in one go.
//   accel::MakeDirectories("checkpoints/checkpoint_3");     // mkdir -p
//   for (const std::string& name : accel::ListFolder(dir)) ...  // Sorted.
//   accel::RemoveOwnedTree(old_checkpoint, IsMine);  // Never through links.
//
// The bytes go to a temporary file beside the final one (same file system,
// so the rename is atomic), which is flushed to disk, renamed over the final
// name, and then the folder is flushed so the rename survives a power loss.
// Errors are CheckpointError naming the file and the system's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace accel {

class AtomicFile {
 public:
  // Creates the temporary file; the folder must exist.
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void Write(const void* data, size_t size);
  void Write(std::string_view bytes) { Write(bytes.data(), bytes.size()); }
  // Flushes and renames into place. Nothing may be written afterwards.
  void Commit();

  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void Fail(const std::string& action);
  void Discard();

  std::string path_;
  std::string temporary_;
  int fd_ = -1;
};

void WriteFileAtomically(const std::string& path, std::string_view contents);

// strerror(error), with what the system's limit is when one was hit: "File
// too large (the file-size limit, ulimit -f, is 8192 bytes)".
std::string ErrnoText(int error);

// Creates `dir` and its missing parents (mkdir -p); CheckpointError names the
// folder that could not be created and why.
void MakeDirectories(const std::string& dir);

// The folder `path` is in: "a/b" for "a/b/c", "." for "c", "/" for "/c".
std::string FolderOf(const std::string& path);

// The whole of regular file `path`, which must hold at most `max_bytes`;
// CheckpointError naming `kind` ("index") and the file otherwise.
std::string ReadSmallFile(const std::string& path, uint64_t max_bytes,
                          const char* kind);

// Whether `path` names an existing file (not a folder).
bool IsFile(const std::string& path);

// "" when `path` is a regular file, else why not: its stat error
// ("No such file or directory") or what it is ("a folder", "a FIFO", "a
// device", "not a file"). A reader calls it before open(), which blocks on
// a FIFO.
std::string WhyNotARegularFile(const std::string& path);

// Whether `dir` is a folder that this process can create files in; errno
// tells why not.
bool IsWritableFolder(const std::string& dir);

// The names in folder `dir` (without "." and ".."), sorted; CheckpointError
// when it cannot be read.
std::vector<std::string> ListFolder(const std::string& dir);

// Removes what the program wrote in folder `dir`, and the folder once that
// leaves it empty. Unlike `rm -r`, it never follows a symbolic link: a link
// (named `dir` itself, or found inside) is removed as a link and what it
// points to is left alone. Inside `dir` and its real subfolders it removes
// the regular files whose names `owned` accepts; anything else (another
// kind of file, a file `owned` rejects, one that cannot be removed) stays,
// and so do the folders that hold it.
struct Removal {
  // What stayed, as paths under `dir` ("notes.txt", "data/x"); empty when
  // `dir` is gone or never existed.
  std::vector<std::string> kept;
  size_t removed = 0;  // Files and links removed.
};
Removal RemoveOwnedTree(
    const std::string& dir,
    const std::function<bool(const std::string& name)>& owned);

}  // namespace accel
