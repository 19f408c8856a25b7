// Command-line set-up shared by every accel program, so that any of them can
// start its own ranks:
//
//   int main(int argc, char** argv) {
//     accel::InitProgram(&argc, &argv);  // may run N copies and exit
//     auto group = accel::ProcessGroup::Join(FLAGS_backend);
//     ...
//   }
//
//   $ bazel run //examples:gather_demo -- --num_processes=2
//
// Flags (mirroring `accelerate launch`): --num_processes, --num_machines,
// --machine_rank, --main_process_ip, --main_process_port, --backend,
// --num_threads, and for the Accelerator --timeout_s, --rendezvous_timeout_s
// and --seed. With
// --num_processes > 1 and no launch environment, InitProgram starts the ranks
// through accel::Launch, waits for them and exits with the launcher's exit
// code; inside a rank it returns.
#pragma once

#include <gflags/gflags.h>

#include "accel/runtime/launch.h"

DECLARE_int32(num_processes);
DECLARE_int32(num_machines);
DECLARE_int32(machine_rank);
DECLARE_string(main_process_ip);
DECLARE_int32(main_process_port);
DECLARE_string(backend);
DECLARE_int32(num_threads);
DECLARE_int32(timeout_s);
DECLARE_int32(rendezvous_timeout_s);
DECLARE_int64(seed);
DECLARE_bool(collective_checks);
DECLARE_int32(max_restarts);

namespace accel {

// Parses flags (removing them from argv) and self-launches when asked to.
void InitProgram(int* argc, char*** argv);

// LaunchOptions from the flags above.
LaunchOptions LaunchOptionsFromFlags();

// Runs `body`, turning an accel::Error into a one-line message on stderr
// ("error: ...") and exit code 1, so that users see the message, not a
// std::terminate trace.
int RunAndReportErrors(int (*body)(int, char**), int argc, char** argv);

}  // namespace accel
