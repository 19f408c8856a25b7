// The meeting of every rank of a job at the store, before a backend
// connects its data paths: each rank announces itself and the address its
// peers will reach it at, then waits for all the others until a deadline
// that covers the whole join.
//
//   accel::MeetAtStore(*store, env, my_address, deadline, hosted_server);
//
// Why a separate meeting when a backend's own connection step also waits
// for every rank: it fails with the ranks (and machines) that never came,
// within --rendezvous_timeout_s, instead of a backend's "timed out waiting
// for key 3" after the collective timeout; and rank 0, which hosts the
// store, reports the processes it turned away (another run secret, another
// job) that claimed a rank not yet joined, once each, and goes on waiting
// for the real rank: a stranger's hello must not end the job. The timeout
// names the refusals of the ranks that never came.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "accel/runtime/env/environment.h"
#include "accel/runtime/store/store.h"

namespace accel {

class TcpStoreServer;

// Throws TimeoutError naming the ranks that did not arrive by `deadline`
// (and what `hosted`, rank 0's server, else null, refused that claimed
// them), or UsageError when `hosted` ran out of file descriptors.
// `my_address` is recorded for diagnostics.
void MeetAtStore(Store& store, const DistributedEnvironment& env,
                 const std::string& my_address,
                 std::chrono::steady_clock::time_point deadline,
                 TcpStoreServer* hosted);

}  // namespace accel
