// Private to accel-test (self_test.cc): the known job's checks, each run
// on every rank with one PASS or FAIL line, and the temporary folder they
// use. The checks themselves are self_test_checks.cc's.
//
//   accel::self_test_internal::SelfTest test(accelerator);
//   return test.Run();  // 0: every check passed
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "accel/accelerator.h"

namespace accel::self_test_internal {

// Set for the ranks accel-test starts itself, which know how many to
// expect; under another launcher (accel-launch, torchrun, mpirun) that
// launcher's count is the expectation.
constexpr char kOwnRanks[] = "ACCEL_TEST_OWN_RANKS";

// What one rank found in one check: `problem` is empty when it passed
// there, else "expected ..., found ...".
struct Outcome {
  std::string found;
  std::string problem;
};

// A folder for the checkpoint and the barrier's markers, made by the main
// process and removed by it at the end (also when a check throws).
class TemporaryFolder {
 public:
  explicit TemporaryFolder(accel::Accelerator& accelerator);
  ~TemporaryFolder();
  TemporaryFolder(const TemporaryFolder&) = delete;
  TemporaryFolder& operator=(const TemporaryFolder&) = delete;

  const std::string& path() const { return path_; }

  // What stayed (empty when the folder is gone); the main process's work.
  std::vector<std::string> Remove();

 private:
  bool owner_;
  std::string path_;
};

class SelfTest {
 public:
  explicit SelfTest(accel::Accelerator& accelerator)
      : accelerator_(accelerator),
        folder_(accelerator),
        start_(std::chrono::steady_clock::now()) {}

  // Every check, then the summary on the main process; the exit code (the
  // same on every rank).
  int Run();

 private:
  // Runs `body` on every rank and prints, on the main process, PASS with
  // what it found, or FAIL with each rank's problem. Every rank learns
  // every verdict, so all of them end with the same exit code.
  void Check(const std::string& name, const std::function<Outcome()>& body);

  // The checks (self_test_checks.cc).
  Outcome ProcessState();
  Outcome Gather();
  Outcome Reduce();
  Outcome Broadcast();
  Outcome WaitForEveryone();
  void DataLoaderChecks();
  void TrainingChecks();

  accel::Accelerator& accelerator_;
  TemporaryFolder folder_;
  const std::chrono::steady_clock::time_point start_;
  int checks_ = 0;
  std::vector<std::string> failed_;
};

}  // namespace accel::self_test_internal
