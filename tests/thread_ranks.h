// Runs one function per rank, each rank a thread with its own communicator,
// all meeting over one in-memory store: fast collective tests in one process.
//
//   accel::testing::RunRanks("gloo", 3, [](accel::Communicator& comm) {
//     comm.barrier();
//   });
//
// A failure on any rank fails the test with that rank's message.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "accel/runtime/comm/communicator.h"

namespace accel::testing {

struct RankOptions {
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // Connecting the ranks has its own bound: a test's short collective
  // timeout must not fail the connection on a loaded machine (ASan beside
  // other tests took over 500 ms).
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(30);
  bool check_collectives = true;  // CommunicatorOptions::check_collectives.
};

void RunRanks(const std::string& backend, int world_size,
              const std::function<void(Communicator&)>& body,
              const RankOptions& options = {});

// RunRanks' signature, for suites that let a backend run its ranks another
// way (tests/conformance.h).
using RankRunner = void (*)(const std::string& backend, int world_size,
                            const std::function<void(Communicator&)>& body,
                            const RankOptions& options);

}  // namespace accel::testing
