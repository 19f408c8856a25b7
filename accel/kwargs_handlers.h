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
// scaler, autocast's autocast); setting those fields directly does the
// same. As in Accelerate, at most one handler of each kind.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <variant>

#include "accel/grad_scaler.h"
#include "accel/gradient_sync.h"

namespace accel {

// Accelerate's DistributedDataParallelKwargs: how the prepared model's
// gradients are reduced (accel/gradient_sync.h says what each does).
struct DistributedDataParallelKwargs {
  bool broadcast_buffers = true;
  int bucket_cap_mb = 25;  // > 0.
  bool find_unused_parameters = false;
  // accel's default; torch's and Accelerate's is false (the gradients are
  // then copies, one more gradient's worth of memory).
  bool gradient_as_bucket_view = true;
  bool static_graph = false;
  // FP16 or BF16 compression of each bucket, or PowerSGD
  // (accel/gradient_sync.h), with PowerSGD's options.
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

using KwargsHandler =
    std::variant<DistributedDataParallelKwargs, InitProcessGroupKwargs,
                 GradScalerKwargs, AutocastKwargs>;

}  // namespace accel
