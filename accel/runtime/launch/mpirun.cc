#include "accel/runtime/launch/mpirun.h"

#include <unistd.h>

#include <cstdlib>
#include <sstream>

namespace accel {
namespace {

// The first executable `name` on PATH, or `name` itself.
std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream folders(path != nullptr ? path : "/usr/bin:/bin");
  std::string folder;
  while (std::getline(folders, folder, ':')) {
    const std::string candidate = (folder.empty() ? "." : folder) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return name;
}

}  // namespace

bool StartedByMpiLauncher(
    const std::function<const char*(const char*)>& getenv) {
  auto lookup = [&](const char* name) {
    return getenv ? getenv(name) : std::getenv(name);
  };
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    if (lookup(name) != nullptr) return true;
  }
  return false;
}

std::vector<std::string> MpirunCommand(
    int num_processes, const std::vector<std::string>& program,
    const std::vector<std::string>& exported) {
  const char* mpirun = std::getenv("ACCEL_MPIRUN");
  std::vector<std::string> command;
  // PMIx's shared-memory data store (gds ds21) fails with "PMIX ERROR ...
  // dstore_segment.c" when several jobs start at once on a busy machine;
  // its hash store holds a single machine's job as well. A user's own
  // choice stays.
  if (std::getenv("PMIX_MCA_gds") == nullptr) {
    command = {"/usr/bin/env", "PMIX_MCA_gds=hash"};
  }
  command.insert(
      command.end(),
      {mpirun != nullptr ? std::string(mpirun) : FindInPath("mpirun"), "-np",
       std::to_string(num_processes), "--oversubscribe", "--bind-to", "none"});
  if (geteuid() == 0) command.push_back("--allow-run-as-root");
  for (const auto& name : exported) {
    command.push_back("-x");
    command.push_back(name);
  }
  command.insert(command.end(), program.begin(), program.end());
  return command;
}

}  // namespace accel
