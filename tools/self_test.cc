// accel test: a short known job at 2 processes that says PASS or FAIL in
// seconds, as `accelerate test` does, for checking an installation or a
// machine before a real run (the test suite takes many minutes).
//
//   $ bazel run //tools:self_test
//   $ accel-test [--num_processes=2] [--backend=auto|gloo|mpi|nccl]
//   accel-test: 2 processes, backend gloo, device cpu
//   PASS process state: ranks 0, 1 of 2, rank 0 the main process
//   ...
//   accel-test: PASS (10 checks in 0.2 s)
//
// It starts its own ranks (accel::InitProgram) and checks, each on every
// rank, with one line per check saying what it expected and found: the
// process state, the collectives (gather, reduce, broadcast,
// wait_for_everyone), the data loader's sharding and gather_for_metrics,
// training with DDP against one process on the global batch, and a
// save_state / load_state round trip in a temporary folder it removes.
// Exit code 0 when every check passed, 1 otherwise. The job has its own
// settings: the launch configuration is not read, so that PASS means the
// same on every machine.
#include "tools/self_test.h"

#include <gflags/gflags.h>
#include <stdlib.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "accel/accelerator.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"
#include "accel/runtime/env/environment.h"
#include "accel/runtime/launch/help.h"
#include "accel/runtime/launch/program.h"

namespace accel::self_test_internal {

TemporaryFolder::TemporaryFolder(accel::Accelerator& accelerator)
    : owner_(accelerator.is_main_process()) {
  std::vector<std::string> path = {""};
  if (owner_) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp") +
        "/accel-test-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      throw accel::Error("accel-test: cannot create a temporary folder " +
                         pattern + ": " + accel::ErrnoText(errno));
    }
    path[0] = pattern;
  }
  path_ = accelerator.broadcast_object_list(path)[0];
}

TemporaryFolder::~TemporaryFolder() {
  if (owner_) Remove();
}

std::vector<std::string> TemporaryFolder::Remove() {
  return accel::RemoveOwnedTree(path_, [](const std::string&) { return true; })
      .kept;
}

int SelfTest::Run() {
  const int n = accelerator_.num_processes();
  if (accelerator_.is_main_process()) {
    std::printf("accel-test: %d process%s, backend %s, device %s\n", n,
                n == 1 ? "" : "es", accelerator_.backend().c_str(),
                accelerator_.device().str().c_str());
  }
  Check("process state", [&] { return ProcessState(); });
  Check("gather", [&] { return Gather(); });
  Check("reduce", [&] { return Reduce(); });
  Check("broadcast", [&] { return Broadcast(); });
  Check("wait_for_everyone", [&] { return WaitForEveryone(); });
  DataLoaderChecks();
  TrainingChecks();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
          .count();
  if (accelerator_.is_main_process()) {
    if (failed_.empty()) {
      std::printf("accel-test: PASS (%d checks in %.1f s)\n", checks_, seconds);
    } else {
      std::string names;
      for (const std::string& name : failed_) {
        names += (names.empty() ? "" : ", ") + name;
      }
      std::printf("accel-test: FAIL (%zu of %d checks failed: %s; %.1f s)\n",
                  failed_.size(), checks_, names.c_str(), seconds);
    }
    std::fflush(stdout);
  }
  // The summary is out before any rank leaves: the launcher stops the
  // others once one exits with code 1.
  accelerator_.wait_for_everyone();
  accelerator_.end_training();
  return failed_.empty() ? 0 : 1;
}

void SelfTest::Check(const std::string& name,
                     const std::function<Outcome()>& body) {
  ++checks_;
  Outcome outcome;
  try {
    outcome = body();
  } catch (const std::exception& error) {
    outcome.problem = std::string("threw: ") + error.what();
  }
  const std::vector<std::string> problems =
      accelerator_.gather_object(std::vector<std::string>{outcome.problem});
  std::string failures;
  for (size_t rank = 0; rank < problems.size(); ++rank) {
    if (problems[rank].empty()) continue;
    failures += (failures.empty() ? "" : "; ") + std::string("rank ") +
                std::to_string(rank) + ": " + problems[rank];
  }
  if (!failures.empty()) failed_.push_back(name);
  if (accelerator_.is_main_process()) {
    std::printf("%s %s: %s\n", failures.empty() ? "PASS" : "FAIL", name.c_str(),
                failures.empty() ? outcome.found.c_str() : failures.c_str());
    std::fflush(stdout);
  }
}

}  // namespace accel::self_test_internal

namespace {

using accel::self_test_internal::kOwnRanks;
using accel::self_test_internal::SelfTest;

// The flags accel-test takes; the others of accel programs would change the
// known job (--zero_stage, --mixed_precision, ...).
const std::set<std::string> kFlags = {"num_processes", "backend",
                                      "main_process_port"};

int Main(int argc, char** argv) {
  accel::AcceleratorOptions options = accel::AcceleratorOptions::FromFlags();
  // A check that fails on one rank ends the job in a minute, not in the
  // default 5.
  options.timeout = std::chrono::seconds(60);
  accel::Accelerator accelerator(options);
  SelfTest test(accelerator);
  return test.Run();
}

// The flags on the command line, after checking that accel-test takes
// them (kFlags): one "error:" line and exit code 2 for anything else,
// before any rank starts.
std::set<std::string> FlagNames(const std::vector<std::string>& args) {
  std::set<std::string> names;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    std::string name = arg.size() > 1 && arg[0] == '-'
                           ? arg.substr(arg.find_first_not_of('-'))
                           : "";
    name = name.substr(0, name.find('='));
    if (kFlags.count(name) == 0) {
      std::fprintf(stderr,
                   "error: accel-test takes --num_processes, --backend and "
                   "--main_process_port (--help), found '%s'\n",
                   arg.c_str());
      std::exit(2);
    }
    names.insert(name);
    if (arg.find('=') == std::string::npos) ++i;  // "--backend gloo".
  }
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  accel::RegisterProgramFlags();
  // This tool's defaults, for --help (its ranks get them on their command
  // line below): 2 processes, and a free port, so that it never meets
  // another job's rendezvous.
  const std::map<std::string, std::string> defaults = {
      {"num_processes", "2"}, {"main_process_port", "0"}};
  for (const auto& [name, value] : defaults) {
    gflags::SetCommandLineOptionWithMode(name.c_str(), value.c_str(),
                                         gflags::SET_FLAGS_DEFAULT);
  }
  gflags::SetUsageMessage(
      "accel-test [--num_processes=2] [--backend=auto|gloo|mpi|nccl]: a "
      "short known job that says PASS or FAIL");
  accel::PrintHelpAndExitIfAsked(argc, argv, &kFlags);
  std::vector<std::string> args(argv, argv + argc);
  const std::set<std::string> given = FlagNames(args);
  // The known job's own settings, whatever a launch configuration says
  // (its ranks inherit this).
  setenv("ACCEL_CONFIG_FILE", "", /*overwrite=*/1);
  bool launched = true;  // A bad launch environment: InitProgram says why.
  try {
    launched = accel::DistributedEnvironment::FromProcess().launched;
  } catch (const accel::Error&) {
  }
  if (!launched) {
    setenv(kOwnRanks, "1", /*overwrite=*/1);
    // On the command line, not as gflags defaults: the launcher (which
    // this process becomes) and the ranks read them there.
    for (const auto& [name, value] : defaults) {
      if (given.count(name) == 0) {
        args.insert(args.begin() + 1, "--" + name + "=" + value);
      }
    }
  }
  std::vector<char*> pointers;
  for (std::string& arg : args) pointers.push_back(arg.data());
  pointers.push_back(nullptr);
  int count = static_cast<int>(args.size());
  char** values = pointers.data();
  accel::InitProgram(&count, &values);
  return accel::RunAndReportErrors(Main, count, values);
}
