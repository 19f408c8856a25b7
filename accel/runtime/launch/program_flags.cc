#include "accel/runtime/launch/program_flags.h"

#include <gflags/gflags.h>

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <mutex>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"

namespace accel {
namespace {

bool Parse(const std::string& text, int32_t* out) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 ||
      value < std::numeric_limits<int32_t>::min() ||
      value > std::numeric_limits<int32_t>::max()) {
    return false;
  }
  *out = static_cast<int32_t>(value);
  return true;
}

bool Parse(const std::string& text, double* out) {
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0) return false;
  *out = value;
  return true;
}

bool Parse(const std::string& text, bool* out) {
  if (text == "true" || text == "1") {
    *out = true;
  } else if (text == "false" || text == "0") {
    *out = false;
  } else {
    return false;
  }
  return true;
}

bool Parse(const std::string& text, std::string* out) {
  *out = text;
  return true;
}

const char* TypeName(int32_t*) { return "a whole number"; }
const char* TypeName(double*) { return "a number"; }
const char* TypeName(bool*) { return "true or false"; }
const char* TypeName(std::string*) { return "text"; }

}  // namespace

template <typename T>
void ProgramFlag<T>::Register() {
  if (registered_) return;
  gflags::CommandLineFlagInfo info;
  if (gflags::GetCommandLineFlagInfo(name_, &info)) return;  // The program's.
  // Only now: where the program defines the name, legacy_() is its variable.
  if (legacy_ != nullptr) {
    storage_ = legacy_();
    *storage_ = default_;
  }
  // gflags keeps the name, help and file name, and uses the two values as
  // its storage: they live as long as the process.
  gflags::FlagRegisterer registerer(name_, help_, __FILE__, storage_,
                                    &default_);
  (void)registerer;
  registered_ = true;
}

template <typename T>
bool ProgramFlag<T>::owned_by_program() const {
  gflags::CommandLineFlagInfo info;
  return !registered_ && gflags::GetCommandLineFlagInfo(name_, &info);
}

template <typename T>
T ProgramFlag<T>::value() const {
  if (registered_) return *storage_;
  // The program's own flag counts when the user gave it; its default is
  // the program's choice, not accel's (a script's --report_to=all default
  // started every tracker).
  if (!given()) return builtin_default_;
  std::string text;
  if (!gflags::GetCommandLineOption(name_, &text)) return builtin_default_;
  T parsed;
  if (Parse(text, &parsed)) return parsed;
  if (!warned_) {
    warned_ = true;
    ACCEL_LOG(WARNING) << "--" << name_ << " is the program's own flag, and "
                       << "its value \"" << text << "\" is not "
                       << TypeName(static_cast<T*>(nullptr)) << " as accel's --"
                       << name_ << " takes: accel goes on with its default";
  }
  return builtin_default_;
}

template <typename T>
bool ProgramFlag<T>::given() const {
  if (!config_path_.empty()) return true;
  gflags::CommandLineFlagInfo info;
  return gflags::GetCommandLineFlagInfo(name_, &info) && !info.is_default;
}

template <typename T>
bool ProgramFlag<T>::from_command_line() const {
  gflags::CommandLineFlagInfo info;
  return gflags::GetCommandLineFlagInfo(name_, &info) && !info.is_default;
}

template <typename T>
std::string ProgramFlag<T>::source() const {
  gflags::CommandLineFlagInfo info;
  if (gflags::GetCommandLineFlagInfo(name_, &info) && !info.is_default) {
    return "the command line";
  }
  return config_path_.empty() ? "its default"
                              : "the launch configuration " + config_path_;
}

template class ProgramFlag<int32_t>;
template class ProgramFlag<double>;
template class ProgramFlag<bool>;
template class ProgramFlag<std::string>;

}  // namespace accel

// The deprecated FLAGS_ variables (program_flags.h), weak: a program's own
// flag of the name is a strong definition and replaces accel's. Constant
// initialization only (no constructor runs), so that a replaced one leaves
// nothing behind.
namespace accel::legacy {
std::string strings[6];
}  // namespace accel::legacy
#define ACCEL_LEGACY_INT(name)                                  \
  namespace fLI {                                               \
  __attribute__((weak)) ::GFLAGS_NAMESPACE::int32 FLAGS_##name; \
  }
#define ACCEL_LEGACY_BOOL(name)            \
  namespace fLB {                          \
  __attribute__((weak)) bool FLAGS_##name; \
  }
#define ACCEL_LEGACY_STRING(name, index)                \
  namespace fLS {                                       \
  __attribute__((weak)) ::fLS::clstring& FLAGS_##name = \
      accel::legacy::strings[index];                    \
  }
ACCEL_LEGACY_INT(num_processes)
ACCEL_LEGACY_INT(num_machines)
ACCEL_LEGACY_INT(machine_rank)
ACCEL_LEGACY_STRING(main_process_ip, 0)
ACCEL_LEGACY_INT(main_process_port)
ACCEL_LEGACY_STRING(backend, 1)
ACCEL_LEGACY_INT(num_cpu_threads_per_process)
ACCEL_LEGACY_INT(timeout_s)
ACCEL_LEGACY_INT(rendezvous_timeout_s)
ACCEL_LEGACY_STRING(mixed_precision, 2)
ACCEL_LEGACY_INT(gradient_accumulation_steps)
ACCEL_LEGACY_BOOL(collective_checks)
ACCEL_LEGACY_INT(max_restarts)
ACCEL_LEGACY_INT(signal_grace_s)
ACCEL_LEGACY_INT(network_timeout_s)
ACCEL_LEGACY_STRING(report_to, 3)
ACCEL_LEGACY_STRING(config_file, 4)
ACCEL_LEGACY_STRING(logging_dir, 5)
ACCEL_LEGACY_BOOL(reuse_host_memory)
#undef ACCEL_LEGACY_INT
#undef ACCEL_LEGACY_BOOL
#undef ACCEL_LEGACY_STRING

namespace accel {
namespace flags {

// Where the deprecated variable of `name` is (see ProgramFlag::Register).
#define ACCEL_LEGACY_INT(name) [] { return &fLI::FLAGS_##name; }
#define ACCEL_LEGACY_BOOL(name) [] { return &fLB::FLAGS_##name; }
#define ACCEL_LEGACY_STRING(name) [] { return &fLS::FLAGS_##name; }

ProgramFlag<int32_t> num_processes(
    "num_processes", 1,
    "Total number of processes (ranks) to run, over all machines.",
    ACCEL_LEGACY_INT(num_processes));
ProgramFlag<int32_t> num_machines("num_machines", 1,
                                  "Number of machines taking part.",
                                  ACCEL_LEGACY_INT(num_machines));
ProgramFlag<int32_t> machine_rank("machine_rank", 0,
                                  "This machine's index in [0, num_machines).",
                                  ACCEL_LEGACY_INT(machine_rank));
ProgramFlag<std::string> main_process_ip(
    "main_process_ip", "127.0.0.1", "Address of the machine that runs rank 0.",
    ACCEL_LEGACY_STRING(main_process_ip));
ProgramFlag<int32_t> main_process_port(
    "main_process_port", 29500,
    "Port of rank 0's rendezvous store; 0 picks a free port.",
    ACCEL_LEGACY_INT(main_process_port));
ProgramFlag<int32_t> num_cpu_threads_per_process(
    "num_cpu_threads_per_process", 1,
    "Intra-op threads per rank (OMP_NUM_THREADS, unless set).",
    ACCEL_LEGACY_INT(num_cpu_threads_per_process));
ProgramFlag<int32_t> max_restarts(
    "max_restarts", 0,
    "Restart the whole job up to this many times after a rank fails "
    "(TORCHELASTIC_RESTART_COUNT tells the ranks which try they are).",
    ACCEL_LEGACY_INT(max_restarts));
ProgramFlag<int32_t> signal_grace_s(
    "signal_grace_s", 30,
    "After a stop signal to the launcher (SIGTERM, SIGINT, SIGHUP, SIGQUIT, "
    "SIGUSR1, SIGUSR2), how long the ranks get to save and leave before they "
    "are killed, in seconds (see Accelerator::check_preemption).",
    ACCEL_LEGACY_INT(signal_grace_s));
ProgramFlag<std::string> config_file(
    "config_file", "",
    "Launch configuration to read before the command line: Accelerate's "
    "YAML (as accel config or accelerate config write it) or --flag=value "
    "lines; default: $ACCEL_CONFIG_FILE, else "
    "~/.config/accel/default_config.yaml (or the older default_config.flags) "
    "when it exists. Empty with =: none.",
    ACCEL_LEGACY_STRING(config_file));
ProgramFlag<std::string> backend(
    "backend", "auto",
    "Communication backend: gloo, nccl, mpi, or auto (nccl when a GPU is "
    "visible, mpi when started by mpirun or srun with MPI, else gloo).",
    ACCEL_LEGACY_STRING(backend));
ProgramFlag<std::string> mixed_precision(
    "mixed_precision", "no",
    "Mixed precision: no, bf16 (autocast to bfloat16, CPU or GPU) or fp16 "
    "(float16 with loss scaling).",
    ACCEL_LEGACY_STRING(mixed_precision));
ProgramFlag<int32_t> gradient_accumulation_steps(
    "gradient_accumulation_steps", 1,
    "Micro-batches whose gradients are accumulated before each optimizer "
    "step (inside accelerator.accumulate(model)).",
    ACCEL_LEGACY_INT(gradient_accumulation_steps));
ProgramFlag<double> gradient_clipping(
    "gradient_clipping", 0.0,
    "Clip the gradients' total norm to this in every prepared optimizer's "
    "step, as DeepSpeed's gradient_clipping; 0: off (a program clips with "
    "accelerator.clip_grad_norm_ itself).");
ProgramFlag<int32_t> timeout_s(
    "timeout_s", 300,
    "Default timeout of each collective, in seconds. Mismatched collectives "
    "and departed ranks are reported long before it.",
    ACCEL_LEGACY_INT(timeout_s));
ProgramFlag<int32_t> rendezvous_timeout_s(
    "rendezvous_timeout_s", 60,
    "How long ranks wait for each other (and for rank 0's store) at "
    "start-up, in seconds.",
    ACCEL_LEGACY_INT(rendezvous_timeout_s));
ProgramFlag<int32_t> network_timeout_s(
    "network_timeout_s", 20,
    "How long a machine may stop answering on the network before its ranks "
    "are reported unreachable, in seconds.",
    ACCEL_LEGACY_INT(network_timeout_s));
ProgramFlag<bool> collective_checks(
    "collective_checks", true,
    "Compare each collective across ranks and report mismatched calls "
    "within about a second (ranks that left are reported either way).",
    ACCEL_LEGACY_BOOL(collective_checks));
ProgramFlag<std::string> report_to(
    "report_to", "",
    "Experiment trackers for init_trackers/log: a comma-separated list of "
    "jsonl, tensorboard (or any tracker the program registers), all, or "
    "none.",
    ACCEL_LEGACY_STRING(report_to));
ProgramFlag<std::string> logging_dir(
    "logging_dir", "",
    "Where trackers write: <logging_dir>/<project_name>/ (default: the "
    "program's project directory, if it has one).",
    ACCEL_LEGACY_STRING(logging_dir));
ProgramFlag<bool> reuse_host_memory(
    "reuse_host_memory", true,
    "Keep memory that tensors free in the process for reuse, rather than "
    "returning each large block to the system (which costs a page fault per "
    "4 KiB page the next time; see accel/runtime/base/host_memory.h).",
    ACCEL_LEGACY_BOOL(reuse_host_memory));
ProgramFlag<bool> cpu(
    "cpu", false,
    "Train on the CPU even where GPUs are visible (Accelerate's --cpu): the "
    "device is the CPU and --backend=auto never picks nccl.");
ProgramFlag<int32_t> zero_stage(
    "zero_stage", 0,
    "ZeRO sharding of the training state over the processes: 0 (DDP, every "
    "rank holds everything), 1 (optimizer state sharded), 2 (optimizer "
    "state and gradients sharded) or 3 (parameters too, unit by unit).");
ProgramFlag<int32_t> invariant_micro_batches(
    "invariant_micro_batches", 0,
    "Cut each global batch into this many micro-batches (a power of two) "
    "and sum their gradients in one fixed tree, so that training gives the "
    "same bits at any process count dividing it "
    "(accel/parallel/invariant_reduction.h; "
    "loop over accelerator.micro_batches(batch)); 0: off, DDP's allreduce.");
ProgramFlag<std::string> fsdp_transformer_layer_cls_to_wrap(
    "fsdp_transformer_layer_cls_to_wrap", "",
    "Under --zero_stage=3: the class of the layers that become units (as "
    "Accelerate's), e.g. TransformerEncoderLayer, anywhere in the model; "
    "empty: the modules marked with accel::fully_shard, else the children "
    "of the outermost Sequentials and the entries of the outermost "
    "ModuleLists (docs/parallelism.md, \"Units\").");
ProgramFlag<bool> use_fsdp(
    "use_fsdp", false,
    "Accelerate's FSDP switch: the same as --zero_stage=3, or the stage "
    "--fsdp_sharding_strategy names.");
ProgramFlag<std::string> fsdp_sharding_strategy(
    "fsdp_sharding_strategy", "FULL_SHARD",
    "With --use_fsdp: FULL_SHARD (--zero_stage=3), SHARD_GRAD_OP (2) or "
    "NO_SHARD (0), or Accelerate's numbers 1-3 for them.");
ProgramFlag<bool> fault_tolerance(
    "fault_tolerance", false,
    "Train through lost ranks (accel/fault_tolerance.h): a rank other than "
    "0 that fails is replaced alone, up to --max_restarts times, while the "
    "others go on.");
ProgramFlag<bool> use_parallelism_config(
    "use_parallelism_config", false,
    "Lay the processes out on a device mesh (Accelerate's ParallelismConfig) "
    "even when every --parallelism_config_*_size is 1; any of them given "
    "implies it.");
ProgramFlag<int32_t> parallelism_config_dp_replicate_size(
    "parallelism_config_dp_replicate_size", 1,
    "Device mesh: groups of ranks that each hold a whole replica of the "
    "(sharded) training state; with --parallelism_config_dp_shard_size, "
    "hybrid sharding (HSDP).");
ProgramFlag<int32_t> parallelism_config_dp_shard_size(
    "parallelism_config_dp_shard_size", 1,
    "Device mesh: ranks that ZeRO (--zero_stage 1-3) shards the training "
    "state over, within each replica.");
ProgramFlag<int32_t> parallelism_config_tp_size(
    "parallelism_config_tp_size", 1,
    "Device mesh: tensor parallelism, ranks that split each layer's weights "
    "(they see the same batches).");
ProgramFlag<int32_t> parallelism_config_cp_size(
    "parallelism_config_cp_size", 1,
    "Device mesh: context parallelism, ranks that split each sequence (they "
    "see the same batches).");

#undef ACCEL_LEGACY_INT
#undef ACCEL_LEGACY_BOOL
#undef ACCEL_LEGACY_STRING

}  // namespace flags

namespace {

template <typename Fn>
void ForEachFlag(Fn&& fn) {
  for (auto* flag :
       {&flags::num_processes, &flags::num_machines, &flags::machine_rank,
        &flags::main_process_port, &flags::num_cpu_threads_per_process,
        &flags::max_restarts, &flags::signal_grace_s,
        &flags::gradient_accumulation_steps, &flags::timeout_s,
        &flags::rendezvous_timeout_s, &flags::network_timeout_s,
        &flags::zero_stage, &flags::invariant_micro_batches,
        &flags::parallelism_config_dp_replicate_size,
        &flags::parallelism_config_dp_shard_size,
        &flags::parallelism_config_tp_size,
        &flags::parallelism_config_cp_size}) {
    fn(*flag);
  }
  for (auto* flag :
       {&flags::main_process_ip, &flags::config_file, &flags::backend,
        &flags::mixed_precision, &flags::report_to, &flags::logging_dir,
        &flags::fsdp_transformer_layer_cls_to_wrap,
        &flags::fsdp_sharding_strategy}) {
    fn(*flag);
  }
  for (auto* flag : {&flags::collective_checks, &flags::reuse_host_memory,
                     &flags::cpu, &flags::use_fsdp,
                     &flags::use_parallelism_config, &flags::fault_tolerance}) {
    fn(*flag);
  }
  fn(flags::gradient_clipping);
}

}  // namespace

void RegisterProgramFlags() {
  static std::once_flag once;
  std::call_once(once,
                 [] { ForEachFlag([](auto& flag) { flag.Register(); }); });
}

void CheckProgramFlagValues() {
  for (const ProgramFlag<int32_t>* flag :
       {&flags::timeout_s, &flags::rendezvous_timeout_s,
        &flags::network_timeout_s, &flags::gradient_accumulation_steps}) {
    if (flag->value() < 1) {
      throw UsageError(std::string("--") + flag->name() +
                       " must be at least 1, found " +
                       std::to_string(flag->value()));
    }
  }
  const int32_t port = flags::main_process_port.value();
  if (port < 0 || port > 65535) {
    throw UsageError("--main_process_port must be in [0, 65535], found " +
                     std::to_string(port));
  }
}

bool NoteLaunchConfigFlag(const std::string& name, const std::string& path) {
  bool found = false;
  ForEachFlag([&](auto& flag) {
    if (name == flag.name()) {
      flag.SetFromLaunchConfig(path);
      found = true;
    }
  });
  return found;
}

}  // namespace accel
