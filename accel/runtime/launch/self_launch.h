// Whether an accel program should start its own ranks, and doing it:
// `train_demo --num_processes=2` runs two copies of itself through
// accel::Launch unless it already is a rank.
//
//   accel::SelfLaunchIfAsked(original_argv);  // returns only in a rank
//
// A process is a rank when an engine started it (see environment.h): then
// --num_processes, if given, must agree with the engine's world size. An
// environment that cannot be read (part of an engine's variables) is an
// error here, before anything runs, rather than N silent one-process runs.
// The ranks run the program's real path (not /proc/self/exe), so that ps,
// top and pgrep show its name.
//
// The program that launches need not stay a LibTorch-sized process while it
// waits for its ranks: when a launcher image is registered (//accel links
// one, see embedded_launcher.cc), it replaces itself with that small program
// (accel-launch, about 4 MiB resident), which supervises exactly as
// Launch() would here. Without one, or if that fails, Launch() runs in this
// process.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace accel {

// Exits with the launcher's exit code after a launch, with 1 after an
// error; returns when this process should go on as a rank (or alone).
// `program_module`: the program's __dso_handle, or null (see zygote.h).
void SelfLaunchIfAsked(std::vector<std::string> command,
                       void* program_module = nullptr);

// Registers the executable image (an ELF file's bytes, static storage) that
// SelfLaunchIfAsked runs in this process's place to supervise the ranks.
void SetLauncherImage(const char* data, size_t size);

// This executable's path, resolved; if the file was deleted (a rebuild),
// "/proc/self/fd/N" of a descriptor opened on it and inherited across exec.
std::string ExecutablePath();

}  // namespace accel
