// accel's command-line flags (--num_processes, --backend, --mixed_precision,
// ...), which every accel program takes, registered with gflags while the
// program starts rather than defined at link time, so that a program may
// define any of these names itself, as Accelerate's example scripts do with
// --mixed_precision and --gradient_accumulation_steps:
//
//   DEFINE_string(mixed_precision, "no", "...");  // the program's own
//   int main(int argc, char** argv) {
//     accel::InitProgram(&argc, &argv);  // registers the rest, then parses
//     accel::flags::mixed_precision.value();  // the program's flag's value
//     accel::flags::num_processes.value();    // accel's own
//   }
//
// Where the program defines a name, accel reads that flag's value when the
// user gives it (on the command line or in the launch configuration, as
// accel's would be): the launch options reach the Accelerator either way.
// The program's default stays the program's: accel goes on with its own
// (a script's `--report_to` defaulting to "all" starts no tracker). A value
// accel cannot read as its own type is left to the program (accel then
// uses its default and says so once).
//
// Deprecated spellings: before flags were registered at start-up, programs
// read accel's flags as gflags variables (FLAGS_gradient_accumulation_steps,
// FLAGS_mixed_precision, ...; the 19 names declared at the end of this
// header). They still compile and hold the same values as
// accel::flags::<name>.value(), for one more release: read the ProgramFlag
// instead. Where the program defines one of these names itself, FLAGS_ is
// the program's own flag (its definition wins over accel's weak one). A
// program that defines one of them with another type than accel's defines
// ACCEL_NO_LEGACY_FLAG_NAMES before including accel's headers.
#pragma once

#include <gflags/gflags_declare.h>

#include <cstdint>
#include <string>

namespace accel {

template <typename T>
class ProgramFlag {
 public:
  // `legacy`: where the deprecated FLAGS_<name> variable is, for those
  // that have one (gflags then keeps the value there).
  using Storage = T* (*)();
  ProgramFlag(const char* name, T default_value, const char* help,
              Storage legacy = nullptr)
      : name_(name),
        help_(help),
        legacy_(legacy),
        current_(default_value),
        default_(default_value),
        builtin_default_(std::move(default_value)) {}
  ProgramFlag(const ProgramFlag&) = delete;
  ProgramFlag& operator=(const ProgramFlag&) = delete;

  const char* name() const { return name_; }
  const char* help() const { return help_; }
  // The value in force: the command line's, else the launch
  // configuration's, else the default.
  T value() const;
  // Whether the user set it, on the command line or in the launch
  // configuration.
  bool given() const;
  // Where a given value came from: "the command line" or "the launch
  // configuration <path>".
  std::string source() const;
  // Whether the command line gave it (it wins over the configuration).
  bool from_command_line() const;
  // Whether the program defines a flag of this name itself.
  bool owned_by_program() const;

  // For RegisterProgramFlags and the launch configuration.
  void Register();
  void SetFromLaunchConfig(const std::string& path) { config_path_ = path; }

 private:
  const char* name_;
  const char* help_;
  Storage legacy_;
  T current_;  // gflags' storage while registered here (without legacy_).
  T* storage_ = &current_;  // Where the value is while registered.
  T default_;  // gflags' default (a configuration file changes it).
  const T builtin_default_;
  bool registered_ = false;
  std::string config_path_;  // Set when the configuration set it.
  mutable bool warned_ = false;
};

namespace flags {
// Launching (see launch.h).
extern ProgramFlag<int32_t> num_processes;
extern ProgramFlag<int32_t> num_machines;
extern ProgramFlag<int32_t> machine_rank;
extern ProgramFlag<std::string> main_process_ip;
extern ProgramFlag<int32_t> main_process_port;
extern ProgramFlag<int32_t> num_cpu_threads_per_process;
extern ProgramFlag<int32_t> max_restarts;
extern ProgramFlag<int32_t> signal_grace_s;
extern ProgramFlag<std::string> config_file;
// The Accelerator's (AcceleratorOptions).
extern ProgramFlag<std::string> backend;
extern ProgramFlag<std::string> mixed_precision;
extern ProgramFlag<int32_t> gradient_accumulation_steps;
extern ProgramFlag<double> gradient_clipping;
extern ProgramFlag<int32_t> timeout_s;
extern ProgramFlag<int32_t> rendezvous_timeout_s;
extern ProgramFlag<int32_t> network_timeout_s;
extern ProgramFlag<bool> collective_checks;
extern ProgramFlag<std::string> report_to;
extern ProgramFlag<std::string> logging_dir;
extern ProgramFlag<bool> reuse_host_memory;
extern ProgramFlag<bool> cpu;
extern ProgramFlag<int32_t> zero_stage;
extern ProgramFlag<int32_t> invariant_micro_batches;
extern ProgramFlag<std::string> fsdp_transformer_layer_cls_to_wrap;
// Accelerate's FSDP names for a ZeRO stage (see AcceleratorOptions).
extern ProgramFlag<bool> use_fsdp;
extern ProgramFlag<std::string> fsdp_sharding_strategy;
// Accelerate's ParallelismConfig (a device mesh; AcceleratorOptions::
// parallelism_config and accel/runtime/comm/device_mesh.h).
extern ProgramFlag<bool> use_parallelism_config;
// The launcher's fault-tolerant mode (LaunchOptions::fault_tolerance).
extern ProgramFlag<bool> fault_tolerance;
extern ProgramFlag<int32_t> parallelism_config_dp_replicate_size;
extern ProgramFlag<int32_t> parallelism_config_dp_shard_size;
extern ProgramFlag<int32_t> parallelism_config_tp_size;
extern ProgramFlag<int32_t> parallelism_config_cp_size;
}  // namespace flags

// Registers every flag above with gflags unless the program defines one of
// that name. Idempotent; call before gflags parses the command line
// (InitProgram and accel's tools do).
void RegisterProgramFlags();

// Throws UsageError naming the flag when a value above is out of its range
// (a timeout or accumulation below 1, a port outside [0, 65535]): checked
// before any process starts, and again by AcceleratorOptions::FromFlags.
void CheckProgramFlagValues();

// The flag of that name (of any type above) learns that the launch
// configuration `path` set it; false when there is none.
bool NoteLaunchConfigFlag(const std::string& name, const std::string& path);

}  // namespace accel

#ifndef ACCEL_NO_LEGACY_FLAG_NAMES
// Deprecated: accel::flags::<name>.value() (see the top of this header).
DECLARE_int32(num_processes);
DECLARE_int32(num_machines);
DECLARE_int32(machine_rank);
DECLARE_string(main_process_ip);
DECLARE_int32(main_process_port);
DECLARE_string(backend);
DECLARE_int32(num_cpu_threads_per_process);
DECLARE_int32(timeout_s);
DECLARE_int32(rendezvous_timeout_s);
DECLARE_string(mixed_precision);
DECLARE_int32(gradient_accumulation_steps);
DECLARE_bool(collective_checks);
DECLARE_int32(max_restarts);
DECLARE_int32(signal_grace_s);
DECLARE_int32(network_timeout_s);
DECLARE_string(report_to);
DECLARE_string(config_file);
DECLARE_string(logging_dir);
DECLARE_bool(reuse_host_memory);
#endif
