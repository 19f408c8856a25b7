// What an Accelerator is made with, as Accelerate's Accelerator(...)
// arguments: backend, mixed precision, gradient accumulation, timeouts,
// checkpoint naming, trackers.
//
//   accel::AcceleratorOptions options = accel::AcceleratorOptions::FromFlags();
//   options.project_dir = "run";   // what the program decides
//   accel::Accelerator accelerator(options);
//
// Options built by hand take the flags the user gave where the program left
// the default (AdoptGivenFlags, which the Accelerator calls), so that the
// launch configuration reaches the Accelerator as in Accelerate.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accel/kwargs_handlers.h"
#include "accel/optim/grad_scaler.h"
#include "accel/parallel/gradient_sync.h"
#include "accel/runtime/comm/device_mesh.h"

namespace accel {

// --mixed_precision's values, read once.
enum class MixedPrecision { kNo, kBf16, kFp16 };
// "no" -> kNo, "bf16", "fp16"; UsageError for anything else.
MixedPrecision ParseMixedPrecision(const std::string& text);

// Accelerate's FSDP sharding strategy as a ZeRO stage: FULL_SHARD (or 1) is
// 3, SHARD_GRAD_OP (2) is 2, NO_SHARD (3) is 0, HYBRID_SHARD (4) is 3 and
// HYBRID_SHARD_ZERO2 (5) is 2, sharded within each machine and replicated
// across machines (IsHybridShardingStrategy, HybridShardingConfig).
int ParseShardingStrategy(const std::string& text);
bool IsHybridShardingStrategy(const std::string& text);
// FSDP's hybrid sharding as a device mesh: dp_shard = the processes of one
// machine, dp_replicate = the machines. UsageError when the processes do
// not split evenly over machines.
ParallelismConfig HybridShardingConfig(int num_processes,
                                       int processes_per_machine);
// The stage --zero_stage, or --use_fsdp with --fsdp_sharding_strategy,
// asks for; a UsageError naming the flags when they disagree.
int ZeroStageFromFlags();

// The parallelism config the flags and environment give: the
// --parallelism_config_*_size flags (each given one), over Accelerate's
// PARALLELISM_CONFIG_* variables; nullopt when none of them, nor
// --use_parallelism_config or ACCELERATE_USE_PARALLELISM_CONFIG=true, is
// given.
std::optional<ParallelismConfig> ParallelismConfigFromFlags();

// Accelerate's DataLoaderConfiguration: what prepare() changes in every
// data loader it prepares, over the loader's own DataLoaderOptions.
struct DataLoaderConfiguration {
  // Each batch is split across processes (batch_size is the global batch),
  // whatever the loader's own split_batches says.
  bool split_batches = false;
  // When false, the last batches are not padded to the same count on every
  // process, whatever the loader's own even_batches says.
  bool even_batches = true;
  // Only the main process reads the data: it makes every process's batch
  // and sends it; the others read no sample (for a dataset only one
  // machine can read, or a costly get()). Needs even_batches.
  bool dispatch_batches = false;
  // accel's loaders always shuffle from their seed and always record their
  // position for save_state: false asks for what accel does not have
  // (a UsageError says so).
  bool use_seedable_sampler = true;
  bool use_stateful_dataloader = true;
  // When set, the shuffling seed of every prepared loader (each keeps its
  // own DataLoaderOptions::seed otherwise).
  std::optional<uint64_t> data_seed;
  // Batches for a GPU in pinned memory with asynchronous copies; false
  // turns the loaders' pin_memory off.
  bool non_blocking = true;
};

// FSDP's MixedPrecisionPolicy (Accelerate's FullyShardedDataParallelPlugin
// mixed_precision_policy): what the prepared model computes, reduces and
// keeps its buffers in. Unset members follow mixed_precision: under ZeRO
// stages 1-3 with more than one process, bf16 (fp16 on a GPU) gives
// param_dtype and reduce_dtype of that type, as Accelerate's
// set_mixed_precision does for FSDP; under DDP nothing (autocast alone).
//   param_dtype: under ZeRO stages 1-3, the dtype parameters are gathered
//     and computed in, the optimizer stepping master shards of their own
//     dtype (accel/parallel/zero.h); under DDP, autocast's compute dtype
//     (the parameters, whole on every rank, are the master copy).
//   reduce_dtype: the dtype gradients are averaged in (DDP's buckets and
//     ZeRO's reduce-scatters); by default param_dtype under ZeRO, the
//     gradients' own under DDP.
//   buffer_dtype: floating-point buffers are cast to it at prepare.
struct MixedPrecisionPolicy {
  std::optional<c10::ScalarType> param_dtype = std::nullopt;
  std::optional<c10::ScalarType> reduce_dtype = std::nullopt;
  std::optional<c10::ScalarType> buffer_dtype = std::nullopt;
  // FSDP2's cast_forward_inputs, for ZeRO stage 3's units: a unit's
  // floating-point tensor arguments are cast to param_dtype before its
  // forward runs (a float32 mask or feature tensor meets bf16 weights
  // without a dtype error). Tensors inside vectors or tuples, and those
  // passed by non-const reference, are passed as they are.
  bool cast_forward_inputs = true;
};

struct AcceleratorOptions {
  // "gloo", "nccl", or "auto": nccl when it is linked and a GPU is visible.
  std::string backend = "auto";
  // Accelerate's cpu=True: train on the CPU even where GPUs are visible
  // (device() is the CPU; "auto" never picks nccl, and "nccl" is refused).
  bool cpu = false;
  // "no", "bf16" (autocast to bfloat16, CPU or GPU) or "fp16" (autocast to
  // float16 on a GPU, with loss scaling; LibTorch 1.13's CPU autocast has no
  // float16, so on a CPU only the loss scaling runs).
  std::string mixed_precision = "no";
  // Parameters, gradient reduction and buffers in other dtypes (above).
  MixedPrecisionPolicy mixed_precision_policy;
  GradScalerOptions scaler;  // fp16's loss scaler.
  // Micro-batches per optimizer step inside accumulate(); backward divides
  // the loss by it.
  int gradient_accumulation_steps = 1;
  // When above 0: every prepared optimizer's step first clips the
  // gradients' total norm to this (DeepSpeed's gradient_clipping, which its
  // JSON configuration sets; --gradient_clipping), after unscaling them
  // under fp16. Under ZeRO the norm is over every rank's shards.
  double gradient_clipping = 0;
  // The last batch of a data loader always ends an accumulation cycle.
  bool sync_with_dataloader = true;
  // How prepared data loaders shard (Accelerate's dataloader_config).
  DataLoaderConfiguration dataloader_config;
  // Default timeout of every collective (per call: CollectiveOptions).
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // How long ranks wait for each other to start.
  std::chrono::milliseconds rendezvous_timeout = std::chrono::minutes(1);
  // How long a machine may stop answering before its ranks count as gone.
  std::chrono::milliseconds network_timeout = std::chrono::seconds(20);
  // When set, set_seed(*seed) at construction.
  std::optional<uint64_t> seed;
  GradientSyncOptions gradient_sync;
  // Automatic checkpoint naming: save_state() with no folder writes
  // <project_dir>/checkpoints/checkpoint_<n>, keeping the newest
  // `total_limit` complete ones (0 keeps all).
  std::string project_dir;
  int total_limit = 0;
  // Compare every collective across ranks (see CommunicatorOptions).
  bool check_collectives = true;
  // Experiment trackers that init_trackers starts (Accelerate's log_with):
  // "jsonl", "tensorboard", any registered tracker, or "all" of them.
  // Checked at construction.
  std::vector<std::string> log_with;
  // Where the trackers write (<logging_dir>/<project_name>); empty: the
  // project_dir.
  std::string logging_dir;
  // Keep freed memory in the process for reuse
  // (accel/runtime/base/host_memory.h): large CPU tensors then cost no page
  // faults after the first step.
  bool reuse_host_memory = true;
  // ZeRO sharding of the training state (accel/parallel/zero.h), as DeepSpeed's
  // zero_stage: 0 is DDP; 1 shards the optimizer state; 2 also the
  // gradients; 3 also the parameters, unit by unit. With one process
  // nothing is sharded.
  int zero_stage = 0;
  // Whether the stage is Accelerate's FSDP (--use_fsdp): it only names the
  // run (distributed_type() FSDP rather than DEEPSPEED).
  bool use_fsdp = false;
  // FSDP's HYBRID_SHARD strategies (--fsdp_sharding_strategy): without a
  // parallelism_config, ZeRO shards within each machine and replicates
  // across machines (HybridShardingConfig); on one machine it is the
  // stage alone. Needs zero_stage 1-3.
  bool hybrid_shard = false;
  // Accelerate's parallelism_config: the processes laid out on a device
  // mesh, dp_replicate x dp_shard x cp x tp (accel/runtime/comm/
  // device_mesh.h). Unset: no mesh; every process is a data-parallel rank
  // and ZeRO shards over all of them. Set (with several processes): ZeRO
  // shards within dp_shard (x cp) and replicates across dp_replicate
  // (hybrid sharding, HSDP: gradients reduce-scattered in the shard
  // group, then all-reduced across replicas); data loaders shard over the
  // data-parallel ranks (dp_replicate x dp_shard), so that the ranks of a
  // tp or cp group get the same batches; gather, gather_for_metrics,
  // reduce and pad_across_processes run over those ranks, and gradients
  // are averaged over dp x cp. dp_shard_size above 1 needs zero_stage 1-3.
  // All ones is plain data parallelism over every process.
  std::optional<ParallelismConfig> parallelism_config;
  // Stage 3: the class of the layers that become units (Accelerate's
  // fsdp_transformer_layer_cls_to_wrap, e.g. "TransformerEncoderLayer");
  // empty: the modules marked with accel::fully_shard, else the children of
  // the model's outermost Sequentials and ModuleLists (see
  // accel/parallel/sharded_units.h).
  std::string fsdp_layer_to_wrap;
  // Gradients that do not depend on the process count
  // (accel/parallel/invariant_reduction.h): each global batch in this many
  // micro-batches (0: off; else a power of two that the process count
  // divides), which the loop runs through accelerator.micro_batches(batch).
  // Not with ZeRO, gradient accumulation or a DDP comm hook.
  int invariant_micro_batches = 0;
  // Mixed precision's autocast (Accelerate's AutocastKwargs).
  AutocastKwargs autocast;
  // What accel::Profiler(accelerator) profiles (Accelerate's ProfileKwargs
  // handler; accel/profiler.h).
  ProfileKwargs profile;
  // Accelerate's kwargs_handlers (accel/kwargs_handlers.h): each sets the
  // fields above that it names, at construction, before the flags are
  // adopted. UsageError for two of one kind or a bucket_cap_mb <= 0.
  std::vector<KwargsHandler> kwargs_handlers;

  // --backend, --mixed_precision, --gradient_accumulation_steps,
  // --gradient_clipping, --timeout_s, --rendezvous_timeout_s,
  // --collective_checks, --report_to,
  // --logging_dir, --reuse_host_memory, --cpu, --zero_stage (or --use_fsdp
  // with --fsdp_sharding_strategy) and
  // --fsdp_transformer_layer_cls_to_wrap, --invariant_micro_batches,
  // --parallelism_config_*_size (see accel/runtime/launch/program.h).
  static AcceleratorOptions FromFlags();

  // Sets the fields kwargs_handlers name (the Accelerator calls it first).
  void ApplyKwargsHandlers();
  // UsageError naming the option for a value out of range.
  void Validate() const;
  // Takes the flag-backed options the user gave (command line or launch
  // configuration) where these are at AcceleratorOptions' defaults, and
  // says (on the main process) which ones the program overrode.
  void AdoptGivenFlags(bool is_main_process);
};

}  // namespace accel
