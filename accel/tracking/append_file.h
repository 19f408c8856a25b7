// A file that trackers append records to: each Append is one write() to the
// kernel, so a record logged before a crash (of this process) is in the file,
// and readers (tensorboard, tail -f) see whole records as they come.
//
//   accel::AppendFile file(run_dir + "/metrics.jsonl");  // creates run_dir
//   file.Append("{\"step\": 1}\n");
//   file.Close();
//
// Errors are accel::Error naming the file, what failed and the system's
// reason (a full disk, a folder without write permission).
#pragma once

#include <string>
#include <string_view>

namespace accel {

class AppendFile {
 public:
  // Creates the folder and its parents, then opens (creating) the file.
  explicit AppendFile(std::string path);
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  void Append(std::string_view bytes);
  // Later Appends are errors; closing twice is not.
  void Close();

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace accel
