// What every accel process (a rank, the supervisor, a tool) sets up before
// anything else, so that its surroundings cannot end it silently:
//
//   accel::PrepareProcess();  // InitProgram, the Accelerator and Launch call
//                             // it; linking it also runs it before main.
//
// - Closed standard streams (`prog >&- 2>&-`, daemons, some schedulers)
//   are opened on /dev/null. Otherwise the next file or socket opened takes
//   fd 1 or 2: rank 0's store socket became its stdout, and a progress bar
//   written there broke the job.
// - SIGPIPE is ignored: a console that goes away (`| head`, a closed ssh
//   session) makes writes to it fail instead of killing the process in the
//   middle of an epoch; training goes on.
// - SIGXFSZ is ignored: a file-size limit (`ulimit -f`) makes the write
//   that crosses it fail with EFBIG, which saving reports like any other
//   I/O error (and cleans up after), instead of killing the rank.
// - An ignored SIGCHLD (SIG_IGN or SA_NOCLDWAIT, which survive exec from a
//   parent that set them) goes back to the default: otherwise the kernel
//   reaps the ranks itself, and the launcher never learns that they ended
//   (it waited forever after training finished, and never reported a
//   killed rank). A program that wants it ignored sets it after
//   InitProgram and the Accelerator.
// Children started by the launcher inherit the ignored signals.
#pragma once

namespace accel {

// Idempotent; async-signal-safe enough to call before main.
void PrepareProcess();

}  // namespace accel
