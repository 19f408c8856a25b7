// Where the time of a short training job goes, from `train_demo
// --num_processes=N` being started to its exit (a benchmark, not a test),
// with the same job in Python Accelerate beside it when its source is given.
//
//   bazel run -c opt //tools/bench:startup
//   bazel run -c opt //tools/bench:startup -- --processes=1,2,4
//       --repetitions=7 --peer_src=/path/to/accelerate-0.20.3/src
//
// accel's processes append their milestones to $ACCEL_STARTUP_TRACE
// (accel/runtime/base/startup_trace.h); the phases are, per run, over the
// ranks' latest milestones:
//   supervisor    start to the supervising process's main (process start and
//                 LibTorch load; none with 1 process, which is its own rank)
//   ranks start   to the ranks' main (process start and LibTorch load)
//   rendezvous    the ranks meeting through the store
//   first coll.   the first collective (the weights' broadcast)
//   training      the rest, up to the exit, less the checkpoints
//   checkpoints   every save_state (train_demo saves each epoch)
//   exit          from the ranks' exit to the supervisor's
// The ranks are forked from the loaded program (accel/runtime/launch/
// zygote.h); with --compare_exec the same job also runs with ACCEL_ZYGOTE=0
// (each rank exec'd and loading LibTorch itself, as before the zygote), in
// the same run.
// Memory: each rank's peak resident set, the supervisor's and the zygote's
// resident sets (and the zygote's private part, what it adds to the
// machine: the rest it shares with the ranks) while the ranks train, and
// LibTorch's own footprint (an empty program linking it). The Python rows
// run shared/peer's launch.sh and train_demo.py (the seed's job) with
// --peer_src; runs alternate.
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gflags/gflags.h"
#include "tools/bench/driver.h"

DEFINE_string(processes, "1,2,4", "Numbers of processes to measure.");
DEFINE_int32(repetitions, 5, "Runs per number of processes.");
DEFINE_string(program, "", "The job (default: examples/train_demo).");
DEFINE_string(peer_src, "",
              "Folder holding Python Accelerate's `accelerate` package: also "
              "run the seed's train_demo.py with it.");
DEFINE_string(peer_dir, "", "Folder of launch.sh and train_demo.py.");
DEFINE_bool(compare_exec, true,
            "Also run each job with ACCEL_ZYGOTE=0 (ranks exec'd).");

namespace {

using Clock = std::chrono::steady_clock;

long long NowNs() {
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec;
}

std::string Runfile(const std::string& path) {
  const char* dir = std::getenv("RUNFILES_DIR");
  std::string base = dir != nullptr ? dir : "";
  if (base.empty()) {
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    base = std::string(self, n > 0 ? n : 0) + ".runfiles";
  }
  return base + "/accel/" + path;
}

// A field of /proc/<pid>/<file> in kB ("VmRSS:" of status), 0 if absent.
long FieldKb(pid_t pid, const char* file, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + file);
  std::string line;
  long kb = 0;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) kb += std::atol(line.c_str() + field.size());
  }
  return kb;
}

long ResidentKb(pid_t pid) { return FieldKb(pid, "status", "VmRSS:"); }

// What a process holds alone: private pages, clean and dirty.
long PrivateKb(pid_t pid) {
  return FieldKb(pid, "smaps_rollup", "Private_Clean:") +
         FieldKb(pid, "smaps_rollup", "Private_Dirty:");
}

std::vector<pid_t> Children(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" +
                   std::to_string(pid) + "/children");
  std::vector<pid_t> children;
  pid_t child;
  while (in >> child) children.push_back(child);
  return children;
}

std::string Comm(pid_t pid) {
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

struct Run {
  double wall_ms = 0;
  long supervisor_kb = 0;      // Largest while the ranks ran.
  long zygote_kb = 0;          // The zygote's largest resident set...
  long zygote_private_kb = 0;  // ... and private part.
  std::vector<std::string> stdout_lines;
};

// Runs `argv` in `dir` with `env` added; its output goes to `log`.
Run RunJob(const std::vector<std::string>& argv,
           const std::vector<std::string>& env, const std::string& dir,
           const std::string& log) {
  const auto start = Clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    for (const auto& var : env) putenv(strdup(var.c_str()));
    if (chdir(dir.c_str()) != 0) _exit(127);
    if (!freopen(log.c_str(), "w", stdout) || dup2(1, 2) < 0) _exit(127);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  Run run;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    // The self-launching program becomes accel-launch once it starts its
    // ranks: that is the supervisor to measure.
    if (Comm(pid) == "accel-launch") {
      run.supervisor_kb = std::max(run.supervisor_kb, ResidentKb(pid));
      for (const pid_t child : Children(pid)) {
        if (Comm(child) != "accel-zygote") continue;
        run.zygote_kb = std::max(run.zygote_kb, ResidentKb(child));
        run.zygote_private_kb =
            std::max(run.zygote_private_kb, PrivateKb(child));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  run.wall_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "error: %s failed (status %d); see %s\n",
                 argv[0].c_str(), status, log.c_str());
    std::exit(1);
  }
  return run;
}

struct Event {
  std::string name;
  int rank;
  long long ns;
  long peak_kb;
};

std::vector<Event> ReadTrace(const std::string& path) {
  std::vector<Event> events;
  std::ifstream in(path);
  Event e;
  while (in >> e.name >> e.rank >> e.ns >> e.peak_kb) events.push_back(e);
  return events;
}

using Phases = std::map<std::string, double>;  // ms or MiB per row.

// The phases of one accel run from its trace (see the file's comment).
Phases Breakdown(const std::vector<Event>& events, long long start_ns,
                 const Run& run, int processes) {
  const bool supervised = processes > 1;
  // One process is its own rank, without RANK set.
  auto is_rank = [&](const Event& e) { return !supervised || e.rank >= 0; };
  auto latest = [&](const std::string& name, bool ranks) {
    long long t = 0;
    for (const auto& e : events) {
      if (e.name == name && is_rank(e) == ranks) t = std::max(t, e.ns);
    }
    return t;
  };
  const long long supervisor_main =
      supervised ? latest("main", false) : start_ns;
  const long long ranks_main = latest("main", true);
  const long long rendezvous = latest("rendezvous", true);
  const long long first = latest("first_collective", true);
  const long long exit_ns = latest("exit", true);
  // Checkpoints: the longest total over the ranks.
  std::map<int, long long> saving, begun;
  long peak_kb = 0;
  for (const auto& e : events) {
    if (!is_rank(e)) continue;
    if (e.name == "save_begin") begun[e.rank] = e.ns;
    if (e.name == "save_end") saving[e.rank] += e.ns - begun[e.rank];
    peak_kb = std::max(peak_kb, e.peak_kb);
  }
  long long saves = 0;
  for (const auto& [rank, ns] : saving) saves = std::max(saves, ns);
  const double end_ns = start_ns + run.wall_ms * 1e6;
  Phases p;
  p["supervisor start+load, ms"] = (supervisor_main - start_ns) / 1e6;
  p["ranks start+load, ms"] = (ranks_main - supervisor_main) / 1e6;
  p["rendezvous, ms"] = (rendezvous - ranks_main) / 1e6;
  p["first collective, ms"] = (first - rendezvous) / 1e6;
  p["training, ms"] = (exit_ns - first - saves) / 1e6;
  p["checkpoints, ms"] = saves / 1e6;
  p["exit, ms"] = (end_ns - exit_ns) / 1e6;
  p["wall, ms"] = run.wall_ms;
  p["rank peak RSS, MiB"] = peak_kb / 1024.0;
  if (supervised) {
    p["supervisor RSS, MiB"] = run.supervisor_kb / 1024.0;
    p["zygote RSS, MiB"] = run.zygote_kb / 1024.0;
    p["zygote private, MiB"] = run.zygote_private_kb / 1024.0;
  }
  return p;
}

std::string Cell(std::vector<double> v) {
  if (v.empty()) return "-";
  std::sort(v.begin(), v.end());
  char text[64];
  std::snprintf(text, sizeof(text), "%.0f/%.0f/%.0f", v.front(),
                v[v.size() / 2], v.back());
  if (v.back() < 10) {
    std::snprintf(text, sizeof(text), "%.2f/%.2f/%.2f", v.front(),
                  v[v.size() / 2], v.back());
  }
  return text;
}

std::vector<int> ParseList(const std::string& text) {
  std::vector<int> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const int value = std::atoi(item.c_str());
    if (value < 1) {
      std::fprintf(stderr,
                   "error: --processes: expected numbers of at least "
                   "1, found '%s'\n",
                   item.c_str());
      std::exit(2);
    }
    values.push_back(value);
  }
  return values;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const std::string load_before = accel::bench::LoadAverage();
  const std::vector<int> counts = ParseList(FLAGS_processes);
  const std::string program =
      FLAGS_program.empty() ? Runfile("examples/train_demo") : FLAGS_program;
  char scratch_template[] = "/tmp/accel-startup-XXXXXX";
  const std::string scratch = mkdtemp(scratch_template);
  const bool peer = !FLAGS_peer_src.empty();
  std::string peer_dir = FLAGS_peer_dir;
  if (peer && peer_dir.empty()) {
    const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
    peer_dir = std::string(workspace ? workspace : ".") + "/../shared/peer";
  }

  // LibTorch's own cost: empty programs with and without it.
  std::vector<double> bare_ms, torch_ms, torch_mib;
  for (int i = 0; i < FLAGS_repetitions; ++i) {
    bare_ms.push_back(RunJob({Runfile("tools/bench/startup_empty")}, {},
                             scratch, scratch + "/empty.log")
                          .wall_ms);
    torch_ms.push_back(RunJob({Runfile("tools/bench/startup_empty_torch")}, {},
                              scratch, scratch + "/empty_torch.log")
                           .wall_ms);
    std::ifstream out(scratch + "/empty_torch.log");
    std::string label;
    long kb = 0;
    out >> label >> kb;
    torch_mib.push_back(kb / 1024.0);
  }

  std::map<int, std::map<std::string, std::vector<double>>> table, exec_table;
  std::map<int, std::vector<double>> python_ms, ratio, exec_ratio;
  int port = 29700;
  for (int n : counts) {
    for (int i = 0; i < FLAGS_repetitions; ++i) {
      const std::string dir =
          scratch + "/run_" + std::to_string(n) + "_" + std::to_string(i);
      std::filesystem::create_directories(dir);
      auto accel_run = [&](bool zygote) {
        const std::string trace = dir + (zygote ? "/trace" : "/trace_exec");
        const long long start = NowNs();
        const Run run =
            RunJob({program, "--num_processes=" + std::to_string(n),
                    "--main_process_port=0"},
                   {"ACCEL_STARTUP_TRACE=" + trace,
                    std::string("ACCEL_ZYGOTE=") + (zygote ? "1" : "0")},
                   dir, dir + "/accel.log");
        for (const auto& [row, value] :
             Breakdown(ReadTrace(trace), start, run, n)) {
          (zygote ? table : exec_table)[n][row].push_back(value);
        }
        return run.wall_ms;
      };
      auto python_run = [&] {
        return RunJob({"/bin/bash", peer_dir + "/launch.sh", std::to_string(n),
                       std::to_string(port++), peer_dir + "/train_demo.py"},
                      {"PEER_SRC=" + FLAGS_peer_src}, dir, dir + "/python.log")
            .wall_ms;
      };
      // Alternate which goes first, so neither always finds a warm cache.
      double accel_ms = 0, exec_ms = 0, py_ms = 0;
      if (i % 2 == 0 || !peer) {
        accel_ms = accel_run(true);
        if (FLAGS_compare_exec) exec_ms = accel_run(false);
        if (peer) py_ms = python_run();
      } else {
        if (peer) py_ms = python_run();
        if (FLAGS_compare_exec) exec_ms = accel_run(false);
        accel_ms = accel_run(true);
      }
      if (peer) {
        python_ms[n].push_back(py_ms);
        ratio[n].push_back(accel_ms / py_ms);
        if (FLAGS_compare_exec) exec_ratio[n].push_back(exec_ms / py_ms);
      }
    }
  }

  std::printf(
      "train_demo (3 epochs) from start to exit, %u cores, %d runs per "
      "column, min/median/max; load average (1, 5, 15 min) %s before, %s "
      "after\n",
      std::thread::hardware_concurrency(), FLAGS_repetitions,
      load_before.c_str(), accel::bench::LoadAverage().c_str());
  std::printf("%-28s", "");
  for (int n : counts)
    std::printf("%22s", (std::to_string(n) + " process(es)").c_str());
  std::printf("\n");
  const char* rows[] = {"supervisor start+load, ms",
                        "ranks start+load, ms",
                        "rendezvous, ms",
                        "first collective, ms",
                        "training, ms",
                        "checkpoints, ms",
                        "exit, ms",
                        "wall, ms",
                        "rank peak RSS, MiB",
                        "supervisor RSS, MiB",
                        "zygote RSS, MiB",
                        "zygote private, MiB"};
  auto print_row = [&](const std::string& label, auto&& cell) {
    std::printf("%-28s", label.c_str());
    for (int n : counts) std::printf("%22s", cell(n).c_str());
    std::printf("\n");
  };
  for (const char* row : rows) {
    print_row(row, [&](int n) { return Cell(table[n][row]); });
  }
  if (FLAGS_compare_exec) {
    std::printf("ranks exec'd (ACCEL_ZYGOTE=0), as before the zygote:\n");
    for (const char* row : {"ranks start+load, ms", "wall, ms",
                            "rank peak RSS, MiB", "supervisor RSS, MiB"}) {
      print_row(std::string("  ") + row,
                [&](int n) { return Cell(exec_table[n][row]); });
    }
  }
  if (peer) {
    print_row("Python Accelerate wall, ms",
              [&](int n) { return Cell(python_ms[n]); });
    print_row("accel/Python wall", [&](int n) { return Cell(ratio[n]); });
    if (FLAGS_compare_exec) {
      print_row("  exec'd ranks/Python wall",
                [&](int n) { return Cell(exec_ratio[n]); });
    }
  }
  std::printf(
      "\nLibTorch alone (an empty program linking it): %s ms to run, %s MiB "
      "peak; without it: %s ms\n",
      Cell(torch_ms).c_str(), Cell(torch_mib).c_str(), Cell(bare_ms).c_str());
  std::printf("(the 1-process column has no supervisor: it is its own rank)\n");
  std::filesystem::remove_all(scratch);
  return 0;
}
