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
// Flags (mirroring `accelerate launch`; a program may define any of these
// names itself, see program_flags.h): --num_processes, --num_machines,
// --machine_rank,
// --main_process_ip, --main_process_port, --num_cpu_threads_per_process,
// --max_restarts, --mixed_precision, --gradient_accumulation_steps,
// --report_to, --logging_dir, --cpu, --zero_stage,
// --fsdp_transformer_layer_cls_to_wrap, and
// accel's --backend, --timeout_s, --rendezvous_timeout_s and
// --collective_checks. With
// --num_processes > 1 and no launch environment, InitProgram starts the ranks
// through accel::Launch, waits for them and exits with the launcher's exit
// code; inside a rank it returns.
#pragma once

#include <gflags/gflags.h>

#include "accel/runtime/launch/launch.h"
#include "accel/runtime/launch/program_flags.h"

// The calling module's handle for its static destructors (crtbegin.o's;
// GCC declares it so itself once a static object has a destructor).
extern void* __dso_handle __attribute__((__visibility__("hidden")));

namespace accel {

namespace internal {
void InitProgram(int* argc, char*** argv, void* program_module);
}  // namespace internal

// Reads the launch configuration file (see launch_config.h), parses flags
// (removing them from argv) and self-launches when asked to. Inline so that
// it names the program's own module: a rank forked from the zygote runs the
// program's destructors at exit but not LibTorch's (see zygote.h).
inline void InitProgram(int* argc, char*** argv) {
  internal::InitProgram(argc, argv, &__dso_handle);
}

// The configuration file's values as the flags' defaults, before the
// command line is parsed; prints the error and exits with code 2 for a bad
// file. InitProgram and the launcher call it.
void UseLaunchConfig(int argc, char** argv);

// Under `bazel run`, enters the directory it was started from
// ($BUILD_WORKING_DIRECTORY), so that relative paths are the user's, not
// Bazel's runfiles tree; throws UsageError when it cannot. InitProgram
// calls it; tools that parse their own flags call it themselves.
void EnterUserDirectory();

// LaunchOptions from the flags above.
LaunchOptions LaunchOptionsFromFlags();

// Runs `body`, turning any exception into a one-line message on stderr
// ("error: ...") and exit code 1 (see error_report.h; an exception that
// escapes main without it ends the same way).
int RunAndReportErrors(int (*body)(int, char**), int argc, char** argv);

}  // namespace accel
