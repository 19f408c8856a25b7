// Accelerate's kwargs handlers as option structs, so that a Python program's
// Accelerator(kwargs_handlers=[...]) ports line by line:
//
//   accel::DistributedDataParallelKwargs ddp_kwargs;
//   ddp_kwargs.find_unused_parameters = true;
//   accel::InitProcessGroupKwargs process_group_kwargs;
//   process_group_kwargs.timeout = std::chrono::minutes(30);
//   accel::AcceleratorOptions options;
//   options.kwargs_handlers = {ddp_kwargs, process_group_kwargs};
//   accel::Accelerator accelerator(options);
//
// Each handler sets the AcceleratorOptions fields it names (the DDP one
// gradient_sync, the process group's backend and timeout, the scaler's
// scaler, autocast's autocast, the profiler's profile); setting those
// fields directly does the same. As in Accelerate, at most one handler of
// each kind.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <variant>

#include "accel/optim/grad_scaler.h"
#include "accel/parallel/gradient_sync.h"

namespace accel {

// Accelerate's DistributedDataParallelKwargs: how the prepared model's
// gradients are reduced (accel/parallel/gradient_sync.h says what each does).
struct DistributedDataParallelKwargs {
  bool broadcast_buffers = true;
  int bucket_cap_mb = 25;  // > 0.
  bool find_unused_parameters = false;
  // accel's default; torch's and Accelerate's is false (the gradients are
  // then copies, one more gradient's worth of memory).
  bool gradient_as_bucket_view = true;
  bool static_graph = false;
  // FP16 or BF16 compression of each bucket, or PowerSGD
  // (accel/parallel/gradient_sync.h), with PowerSGD's options.
  DDPCommunicationHookType comm_hook = DDPCommunicationHookType::kNo;
  PowerSgdOptions comm_state_option;
};

// Accelerate's InitProcessGroupKwargs: the backend (empty: --backend's)
// and the default timeout of every collective (empty: --timeout_s's).
struct InitProcessGroupKwargs {
  std::string backend;
  std::optional<std::chrono::milliseconds> timeout;
};

// Accelerate's GradScalerKwargs has GradScalerOptions' fields and names
// (init_scale, growth_factor, backoff_factor, growth_interval, enabled).
using GradScalerKwargs = GradScalerOptions;

// Accelerate's AutocastKwargs: whether mixed precision's autocast runs at
// all, and whether it keeps the casted weights for the scope (LibTorch's
// default, true, when empty).
struct AutocastKwargs {
  bool enabled = true;
  std::optional<bool> cache_enabled;
};

class Profiler;

// torch.profiler.schedule's steps: skip_first steps first, then cycles of
// `wait` steps unrecorded, `warmup` steps with the profiler running but
// kept out of the trace, and `active` recorded steps; after each cycle the
// trace is ready. repeat = 0: cycles until the profiler stops.
struct ProfileSchedule {
  int wait = 0;
  int warmup = 0;
  int active = 1;  // >= 1.
  int repeat = 0;
  int skip_first = 0;
};

// Accelerate's ProfileKwargs, for accel::Profiler (accel/profiler.h): CPU
// activity only (Debian's LibTorch has no Kineto, so no CUDA timeline).
struct ProfileKwargs {
  // Each operator's input shapes (key_averages(true) groups by them).
  bool record_shapes = false;
  // The CPU memory each operator allocates (the table's memory columns).
  bool profile_memory = false;
  // Empty: one trace from construction to stop().
  std::optional<ProfileSchedule> schedule_option;
  // Called when a trace is ready (the end of each scheduled cycle, or
  // stop()); the profiler's key_averages() and export_chrome_trace() then
  // show that trace.
  std::function<void(Profiler&)> on_trace_ready;
  // Non-empty: stop() writes <output_trace_dir>/profile_<process_index>.json
  // (a Chrome trace, as Accelerate's) and waits for every process.
  std::string output_trace_dir;
};

using KwargsHandler =
    std::variant<DistributedDataParallelKwargs, InitProcessGroupKwargs,
                 GradScalerKwargs, AutocastKwargs, ProfileKwargs>;

}  // namespace accel
