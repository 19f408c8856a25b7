// Milestones of a process's life, for //tools/bench:startup: nothing happens
// unless the environment variable ACCEL_STARTUP_TRACE names a file, to which
// each call appends one line:
//
//   <event> <rank, -1 outside a rank> <CLOCK_REALTIME ns> <VmHWM kB>
//
//   accel::TraceStartup("rendezvous");
//
// accel marks "main" (InitProgram), "rendezvous" (the ranks met), "first_
// collective", "save_begin"/"save_end" (each save_state) and "exit".
#pragma once

namespace accel {

void TraceStartup(const char* event);

}  // namespace accel
