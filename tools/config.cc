// accel config: writes the launch configuration that the launcher and every
// accel program read (see accel/runtime/launch/launch_config.h), as `accelerate
// config` does: asks on a terminal, or takes flags.
//
//   $ bazel run //tools:config                      # asks each question
//   $ bazel run //tools:config -- --num_processes=4 --mixed_precision=bf16
//         --nointeractive                           # no questions
//   $ bazel run //tools:config -- --config_file=two_machines.yaml
//   $ bazel run //tools:config -- --show            # what programs read
//
// Answers default to the file's current values (or the flags given); an
// empty answer keeps the default, a bad one is asked again.
#include <gflags/gflags.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"
#include "accel/runtime/launch/help.h"
#include "accel/runtime/launch/launch_config.h"
#include "accel/runtime/launch/program.h"

DEFINE_bool(interactive, isatty(0) != 0,
            "Ask each question (default: when the input is a terminal).");
DEFINE_bool(show, false,
            "Print the configuration programs read now, and where it is.");

namespace {

using Check = std::function<std::string(const std::string&)>;  // "" if ok.

std::string Integer(const std::string& value, long low, long high) {
  char* end = nullptr;
  const long number = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || number < low || number > high) {
    return "expected a whole number from " + std::to_string(low) + " to " +
           std::to_string(high) + ", found \"" + value + "\"";
  }
  return "";
}

Check IntegerIn(long low, long high) {
  return [=](const std::string& value) { return Integer(value, low, high); };
}

Check OneOf(std::vector<std::string> choices) {
  return [choices](const std::string& value) {
    std::string listed;
    for (const std::string& choice : choices) {
      if (value == choice) return std::string();
      listed += (listed.empty() ? "" : ", ") + choice;
    }
    return "expected one of " + listed + ", found \"" + value + "\"";
  };
}

std::string Current(const std::string& flag) {
  return gflags::GetCommandLineFlagInfoOrDie(flag.c_str()).current_value;
}

// Asks until the answer passes `check`; the flag's value is the default.
std::string Ask(const std::string& question, const std::string& flag,
                const Check& check) {
  const std::string fallback = Current(flag);
  if (!FLAGS_interactive) {
    const std::string problem = check(fallback);
    if (!problem.empty()) {
      throw accel::UsageError("--" + flag + ": " + problem);
    }
    return fallback;
  }
  for (int attempt = 0; attempt < 5; ++attempt) {
    std::printf("%s [%s]: ", question.c_str(), fallback.c_str());
    std::fflush(stdout);
    std::string answer;
    if (!std::getline(std::cin, answer)) {
      std::printf("\n");
      std::fflush(stdout);
      throw accel::UsageError("no answer to \"" + question +
                              "\" (the input ended)");
    }
    const size_t begin = answer.find_first_not_of(" \t\r");
    answer = begin == std::string::npos
                 ? fallback
                 : answer.substr(begin,
                                 answer.find_last_not_of(" \t\r") - begin + 1);
    const std::string problem = check(answer);
    if (problem.empty()) return answer;
    std::printf("  %s\n", problem.c_str());
  }
  throw accel::UsageError("no valid answer to \"" + question + "\"");
}

// Where to write: --config_file, else the default location.
std::string Target(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    for (const char* prefix : {"--config_file=", "-config_file="}) {
      if (arg.rfind(prefix, 0) == 0) {
        return arg.substr(std::string(prefix).size());
      }
    }
    if ((arg == "--config_file" || arg == "-config_file") && i + 1 < argc) {
      return argv[i + 1];
    }
  }
  return accel::DefaultLaunchConfigPath();
}

int Show(const std::string& path) {
  if (path.empty()) {
    const std::string fallback = accel::DefaultLaunchConfigPath();
    struct stat info;
    std::printf("no launch configuration (%s %s)\n", fallback.c_str(),
                stat(fallback.c_str(), &info) == 0
                    ? "is not a regular file, so programs skip it"
                    : "does not exist");
    return 0;
  }
  std::vector<std::string> warnings;
  const auto flags = accel::ReadLaunchConfig(path, &warnings);
  // Unless reading the file to start from its values printed them.
  const char* warned = std::getenv("ACCEL_CONFIG_WARNED");
  for (const std::string& warning : warnings) {
    if (warned != nullptr && path == warned) break;
    std::fprintf(stderr, "accel: warning: %s\n", warning.c_str());
  }
  std::printf("%s:\n", path.c_str());
  for (const auto& [name, value] : flags) {
    std::printf("  --%s=%s\n", name.c_str(), value.c_str());
  }
  return 0;
}

// `from_file`: the flags the file being rewritten set, kept unless asked.
int Configure(const std::string& path, const std::set<std::string>& from_file) {
  std::vector<std::pair<std::string, std::string>> flags;
  auto keep = [&flags](const std::string& flag, const std::string& value) {
    flags.emplace_back(flag, value);
  };
  const std::string machines =
      Ask("How many machines will run the job?", "num_machines",
          IntegerIn(1, accel::kMaxLaunchProcesses));
  keep("num_machines", machines);
  if (machines != "1") {
    const long count = std::stol(machines);
    keep("machine_rank", Ask("Which machine is this one (0 runs rank 0)?",
                             "machine_rank", IntegerIn(0, count - 1)));
    keep("main_process_ip",
         Ask("What is the IP address of machine 0?", "main_process_ip",
             [](const std::string& v) {
               return v.empty() ? std::string("expected an address")
                                : std::string();
             }));
    keep("main_process_port",
         Ask("Which port does rank 0's rendezvous store listen on?",
             "main_process_port", IntegerIn(1, 65535)));
  }
  keep("num_processes",
       Ask("How many processes in all (one per GPU with nccl)?",
           "num_processes", IntegerIn(1, accel::kMaxLaunchProcesses)));
  keep("backend", Ask("Which backend: auto (nccl with GPUs, else gloo), "
                      "gloo, nccl or mpi?",
                      "backend", OneOf({"auto", "gloo", "nccl", "mpi"})));
  keep("mixed_precision",
       Ask("Mixed precision: no, bf16 or fp16?", "mixed_precision",
           OneOf({"no", "bf16", "fp16"})));
  keep("num_cpu_threads_per_process",
       Ask("How many CPU threads per process (OMP_NUM_THREADS)?",
           "num_cpu_threads_per_process", IntegerIn(1, 4096)));
  // With --use_fsdp the sharding strategy gives the stage.
  if (Current("use_fsdp") != "true") {
    keep("zero_stage",
         Ask("Shard the training state (ZeRO stage): 0 = no (DDP), 1 = the "
             "optimizer state, 2 = also the gradients, 3 = also the parameters "
             "(FSDP's FULL_SHARD)?",
             "zero_stage", IntegerIn(0, 3)));
  }
  // Anything else the command line set, kept as given once checked where
  // the value has a known form (programs would refuse it at the next run).
  const std::map<std::string, Check> checks = {
      {"gradient_accumulation_steps", IntegerIn(1, 1 << 30)},
      {"max_restarts", IntegerIn(0, 1000000)},
      {"timeout_s", IntegerIn(1, 1 << 30)},
      {"rendezvous_timeout_s", IntegerIn(1, 1 << 30)},
      {"network_timeout_s", IntegerIn(1, 1 << 30)},
      {"fsdp_sharding_strategy",
       OneOf({"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
              "HYBRID_SHARD_ZERO2", "1", "2", "3", "4", "5"})},
  };
  for (const std::string& flag : accel::ConfigurableFlags()) {
    bool asked = false;
    for (const auto& entry : flags) asked |= entry.first == flag;
    if (asked ||
        (gflags::GetCommandLineFlagInfoOrDie(flag.c_str()).is_default &&
         from_file.count(flag) == 0)) {
      continue;
    }
    const auto check = checks.find(flag);
    if (check != checks.end()) {
      const std::string problem = check->second(Current(flag));
      if (!problem.empty()) {
        throw accel::UsageError("--" + flag + ": " + problem);
      }
    }
    keep(flag, Current(flag));
  }
  accel::WriteLaunchConfig(path, flags);
  std::printf("accel config: wrote %s\n", path.c_str());
  const std::string json = accel::DeepSpeedJsonApplied();
  if (!json.empty()) {
    // accel's configuration is flags: the file reference does not survive.
    std::fprintf(stderr,
                 "accel config: warning: the settings taken from %s are "
                 "written out here, and the new file no longer names it as "
                 "deepspeed_config_file: Accelerate will not hand that JSON "
                 "(its optimizer, scheduler) to DeepSpeed. To keep it, put "
                 "deepspeed_config_file back under deepspeed_config in place "
                 "of the settings written out.\n",
                 json.c_str());
  }
  for (const auto& [name, value] : flags) {
    std::printf("  --%s=%s\n", name.c_str(), value.c_str());
  }
  std::printf(
      "The launcher and accel programs read it before their command line "
      "(--config_file picks another file).\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::RegisterProgramFlags();
  gflags::SetUsageMessage(accel::ProgramName(argv[0]) +
                          " [--config_file=PATH] [--nointeractive] "
                          "[--num_processes=N ...] | --show");
  // Only the flags config uses, not every flag linked into it.
  std::set<std::string> shown = {"config_file", "interactive", "show"};
  for (const std::string& flag : accel::ConfigurableFlags()) {
    shown.insert(flag);
  }
  accel::PrintHelpAndExitIfAsked(argc, argv, &shown);
  try {
    accel::EnterUserDirectory();
    bool show = false;
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--") break;
      arg.erase(0, arg.find_first_not_of('-'));
      show |= arg == "show" || arg == "show=true" || arg == "show=1" ||
              arg == "show=yes";
    }
    // What programs read now (for --show), before flags change anything.
    const std::string read = show ? accel::LaunchConfigPath(argc, argv) : "";
    const std::string path = Target(argc, argv);
    if (path.empty()) {
      throw accel::UsageError(
          "no default location ($HOME is not set): give --config_file=PATH");
    }
    // The file's values are the defaults of the questions: the file's own,
    // or, the first time accel config writes YAML, those of the flag file
    // it wrote before (which the new file then replaces for programs).
    std::string start_from = path;
    const std::string legacy = accel::LegacyLaunchConfigPath();
    if (!accel::IsFile(path) && path == accel::DefaultLaunchConfigPath() &&
        !legacy.empty() && accel::IsFile(legacy)) {
      start_from = legacy;
    }
    std::set<std::string> from_file;
    if (accel::IsFile(start_from)) {
      for (const auto& [name, value] : accel::ApplyLaunchConfig(start_from)) {
        from_file.insert(name);
      }
    }
    gflags::ParseCommandLineFlags(&argc, &argv, /*remove_flags=*/true);
    if (argc > 1) {
      throw accel::UsageError(std::string("unexpected argument '") + argv[1] +
                              "'");
    }
    if (FLAGS_show) return Show(read);
    if (start_from != path) {
      std::printf("accel config: starting from %s\n", start_from.c_str());
    }
    return Configure(path, from_file);
  } catch (const accel::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
