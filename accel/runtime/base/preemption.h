// Stop signals that a program answers by saving and leaving, as clusters
// expect before they kill a job: SLURM's `--signal=USR1@60`, Kubernetes'
// SIGTERM with a grace period, an ssh hangup or Ctrl-C passed on by the
// launcher. The Accelerator's check_preemption() builds on it:
//
//   if (accelerator.check_preemption()) {     // the same step on every rank
//     accelerator.save_state();
//     return accel::kPreemptedExitCode;       // 75: "try again later"
//   }
//
// InstallPreemptionHandlers() (the Accelerator calls it) catches SIGTERM,
// SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 where they have their default action.
// Until the program first asks (StartHandlingPreemption, on its first
// check_preemption), a caught signal still does what it did before: the
// process dies of it at once, so a program that never checks stops as
// promptly as ever. Once the program asks, the first signal is only
// recorded; a second one ends the process at once (an impatient user, or a
// program stuck before its next check).
#pragma once

namespace accel {

// What a program that saved and left after a stop signal exits with
// (EX_TEMPFAIL); the launcher exits with it too when every rank did.
inline constexpr int kPreemptedExitCode = 75;

// Idempotent. Signals that the program handles or ignores stay as they are.
void InstallPreemptionHandlers();

// From now on, caught stop signals are recorded rather than fatal.
void StartHandlingPreemption();

// The first stop signal received since StartHandlingPreemption, or 0.
int PendingPreemptionSignal();

// "SIGTERM", "SIGUSR1", ... ("signal 42" for others).
const char* SignalName(int signal_number);

}  // namespace accel
