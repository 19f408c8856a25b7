// accel's diagnostics, through glog and its flags, each line prefixed by the
// rank:
//
//   ACCEL_LOG(INFO) << "skipped checkpoint " << dir;
//     // accel: note: [rank 1/2] skipped checkpoint
//     run/checkpoints/checkpoint_3
//   ACCEL_LOG(WARNING) << "rank 0's store has no ACCEL_RUN_SECRET";
//     // accel: warning: [rank 0/2] rank 0's store has no ACCEL_RUN_SECRET
//   ACCEL_VLOG(1) << "all 2 ranks joined in 12 ms";           // --v=1
//     // I20261201 10:21:06.506862 21407 process_group.cc:130] [rank 0/2] all
//     // 2 ranks joined in 12 ms
//
// Levels, as NCCL_DEBUG=INFO and TORCH_DISTRIBUTED_DEBUG give their users:
//   default  notes and warnings only, one short line each (no glog prefix);
//   --v=1    and rendezvous, store and connection events;
//   --v=2    and every collective: sequence number, operation, bytes,
//            duration and call site (one line when it ends).
// --vmodule=tcp_store=1 turns on one file's; --minloglevel=1 hides notes, 2
// warnings too. With --v or --vmodule every accel line carries glog's prefix
// (time, thread, file:line).
//
// Lines go to stderr through glog's LogMessage into accel's own sink, not to
// glog's log files or global sinks: a program's own glog set-up (files,
// InitGoogleLogging or not) is left as it is.
#pragma once

#include <glog/logging.h>

#include <string>

namespace accel {

// "rank 1/2" once this process knows its rank in a job of several (from
// SetLogRank, or the launcher's RANK and WORLD_SIZE), else "".
std::string RankLabel();
// Called when the process group forms (MPI and SLURM ranks do not come from
// RANK/WORLD_SIZE).
void SetLogRank(int rank, int world_size);

namespace logging_internal {

// ACCEL_LOG's lines ("accel: note: ..." by default) and ACCEL_VLOG's
// (glog's format).
google::LogSink* NoteSink();
google::LogSink* VerboseSink();

}  // namespace logging_internal
}  // namespace accel

// ACCEL_LOG(INFO) for notes, ACCEL_LOG(WARNING), ACCEL_LOG(ERROR).
#define ACCEL_LOG(severity)                                             \
  LOG_TO_SINK_BUT_NOT_TO_LOGFILE(::accel::logging_internal::NoteSink(), \
                                 severity)

// Verbose diagnostics: 1 for rendezvous and connections, 2 per collective.
// The stream is not evaluated unless the level is on.
#define ACCEL_VLOG(level)                       \
  static_cast<void>(0),                         \
      !VLOG_IS_ON(level)                        \
          ? (void)0                             \
          : google::LogMessageVoidify() &       \
                LOG_TO_SINK_BUT_NOT_TO_LOGFILE( \
                    ::accel::logging_internal::VerboseSink(), INFO)
