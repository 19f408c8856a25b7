// The join of thousands of ranks at one store (a benchmark, not a test):
// accel's TCP store and rendezvous against torch's TCPStore (python3-torch)
// with the same number of clients, in the same run.
//
//   bazel run -c opt //tools/bench:rendezvous
//   bazel run -c opt //tools/bench:rendezvous -- --ranks=1024,4096
//       --repetitions=5
//
// A simulated rank is a thread with its own connection, not a program: the
// store's server runs in a process of its own (this program started again
// with --serve), and every client thread, released at once from a gate,
// connects, says hello and calls accel::MeetAtStore, as a rank of a job of
// that size does. The join's time runs from the gate to the last rank's
// return. The torch rows run tools/bench/torch_rendezvous.py: the same
// meeting (set, claim, count, wait for "all") through c10d's TCPStore. Per
// row: join time min/median/max over the repetitions, the ratio of medians
// (torch's over accel's: above 1 accel is faster), and the server process's
// resident memory before the clients came, its peak after the join, its
// threads and the CPU time it spent on the join; then how the join time grows
// from each size to the next beside N and N log N. The machine's load is
// printed before and after.
#include "accel/runtime/store/rendezvous.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/env/environment.h"
#include "accel/runtime/store/tcp_store.h"
#include "gflags/gflags.h"
#include "tools/bench/driver.h"

DEFINE_string(ranks, "256,1024,2048,4096", "Simulated ranks per join.");
DEFINE_int32(repetitions, 3, "Joins per size and store.");
DEFINE_int32(timeout_s, 120, "Bound on one join.");
DEFINE_bool(torch_baseline, true, "Also join at torch's TCPStore.");
DEFINE_string(python, "/usr/bin/python3",
              "Python with torch for the baseline.");
DEFINE_int32(serve, 0,
             "Internal: run only the store's server, for this many ranks.");

namespace {

using Clock = std::chrono::steady_clock;
using accel::bench::Spread;

constexpr char kSecret[] = "bench-secret";
constexpr char kJob[] = "bench-job";

void RaiseFileLimit() {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
}

// --serve=N: the server alone, until our standard input closes, with room
// for N ranks connecting at once, as rank 0 of a job of N makes it
// (accel/runtime/comm/process_group.cc).
int Serve(int ranks) {
  accel::TcpStoreServer server(
      {.host = "127.0.0.1",
       .port = 0,
       .secret = kSecret,
       .job_id = kJob,
       .max_unauthenticated = static_cast<size_t>(ranks) + 16});
  std::cout << server.port() << std::endl;
  std::string ignored;
  while (std::cin >> ignored) {
  }
  return 0;
}

struct ProcessStatus {
  double rss_bytes = 0;
  double hwm_bytes = 0;
  double threads = 0;
  double cpu_seconds = 0;  // User and system time so far.
};

// utime + stime of /proc/PID/stat, in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // Fields after the command's closing parenthesis: state is field 3,
  // utime 14 and stime 15.
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / sysconf(_SC_CLK_TCK);
}

ProcessStatus StatusOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  ProcessStatus status;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string key;
    double value = 0;
    fields >> key >> value;
    if (key == "VmRSS:") status.rss_bytes = value * 1024;
    if (key == "VmHWM:") status.hwm_bytes = value * 1024;
    if (key == "Threads:") status.threads = value;
  }
  status.cpu_seconds = CpuSeconds(pid);
  return status;
}

// The server process: started with pipes on its standard input and output.
struct ServerProcess {
  pid_t pid = -1;
  int to_server = -1;
  int port = 0;

  explicit ServerProcess(int ranks) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) throw std::runtime_error("pipe");
    pid = fork();
    if (pid == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      const std::string self = accel::bench::SelfPath();
      const std::string serve = "--serve=" + std::to_string(ranks);
      execl(self.c_str(), self.c_str(), serve.c_str(), nullptr);
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_server = in[1];
    std::string line;
    char c;
    while (read(out[0], &c, 1) == 1 && c != '\n') line += c;
    close(out[0]);
    port = line.empty() ? 0 : std::stoi(line);
    if (port == 0) throw std::runtime_error("the store's server did not start");
  }
  ~ServerProcess() {
    close(to_server);
    int status = 0;
    waitpid(pid, &status, 0);
  }
};

// One join of `n` ranks at accel's store.
accel::bench::Results JoinAccel(int n) {
  ServerProcess server(n);
  const ProcessStatus before = StatusOf(server.pid);
  std::mutex mutex;
  std::condition_variable changed;
  bool go = false, release = false;
  int finished = 0;
  std::vector<Clock::time_point> done(n);
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return go; });
      }
      std::string error;
      try {
        accel::TcpStore store(
            "127.0.0.1", server.port,
            {.secret = kSecret,
             .job_id = kJob,
             .rank = r,
             .connect_timeout = std::chrono::seconds(FLAGS_timeout_s)});
        accel::DistributedEnvironment env;
        env.rank = r;
        env.world_size = n;
        env.local_world_size = n;
        env.master_port = server.port;
        accel::MeetAtStore(store, env, "127.0.0.1",
                           Clock::now() + std::chrono::seconds(FLAGS_timeout_s),
                           nullptr);
        done[r] = Clock::now();
        std::unique_lock<std::mutex> lock(mutex);
        ++finished;
        changed.notify_all();
        // Keep the connection until every rank is done.
        changed.wait(lock, [&] { return release; });
      } catch (const std::exception& e) {
        error = e.what();
      }
      if (!error.empty()) {
        std::lock_guard<std::mutex> lock(mutex);
        errors.push_back("rank " + std::to_string(r) + ": " + error);
        done[r] = Clock::now();
        ++finished;
        changed.notify_all();
      }
    });
  }
  const auto start = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex);
    go = true;
  }
  changed.notify_all();
  {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return finished == n; });
  }
  Clock::time_point last = start;
  for (const auto& t : done) last = std::max(last, t);
  const ProcessStatus after = StatusOf(server.pid);
  {
    std::lock_guard<std::mutex> lock(mutex);
    release = true;
  }
  changed.notify_all();
  for (std::thread& t : threads) t.join();
  if (!errors.empty()) {
    throw std::runtime_error(std::to_string(errors.size()) +
                             " ranks failed; first: " + errors.front());
  }
  return {{"join", std::chrono::duration<double>(last - start).count()},
          {"rss_before", before.rss_bytes},
          {"hwm", after.hwm_bytes},
          {"threads", after.threads},
          {"cpu", after.cpu_seconds - before.cpu_seconds}};
}

accel::bench::Results JoinTorch(int n) {
  const std::string script = accel::bench::SelfPath() +
                             ".runfiles/accel/tools/bench/torch_rendezvous.py";
  return accel::bench::RunAndParse(
      "torch", FLAGS_python + " " + script + " --ranks=" + std::to_string(n) +
                   " --timeout_s=" + std::to_string(FLAGS_timeout_s));
}

struct Row {
  Spread join, rss_before, hwm, threads, cpu;
  void Add(const accel::bench::Results& r) {
    join.values.push_back(r.at("join"));
    rss_before.values.push_back(r.at("rss_before") / (1 << 20));
    hwm.values.push_back(r.at("hwm") / (1 << 20));
    threads.values.push_back(r.at("threads"));
    cpu.values.push_back(r.at("cpu"));
  }
  // "12.3 / 45.6, 2, 80": the server's medians.
  std::string Server() const {
    if (join.empty()) return "n/a";
    char text[80];
    std::snprintf(text, sizeof(text), "%.1f / %.1f, %.0f, %.0f",
                  rss_before.median(), hwm.median(), threads.median(),
                  cpu.median() * 1e3);
    return text;
  }
};

void PrintTable(const std::vector<int>& sizes, std::map<int, Row>& accel_rows,
                std::map<int, Row>& torch_rows, const std::string& load) {
  std::printf(
      "\nJoin at one store, %d repetitions (min/median/max); load before: "
      "%s, after: %s\n\n",
      FLAGS_repetitions, load.c_str(), accel::bench::LoadAverage().c_str());
  std::printf(
      "| ranks | accel join (ms) | torch join (ms) | torch/accel | accel "
      "server: RSS before / peak (MiB), threads, CPU (ms) | torch server: "
      "the same |\n|---|---|---|---|---|---|\n");
  for (int n : sizes) {
    Row& a = accel_rows[n];
    Row& t = torch_rows[n];
    std::printf(
        "| %d | %s | %s | %s | %s | %s |\n", n,
        accel::bench::Ms(a.join).c_str(), accel::bench::Ms(t.join).c_str(),
        t.join.empty() ? "n/a" : accel::bench::Ratio(t.join, a.join).c_str(),
        a.Server().c_str(), t.Server().c_str());
  }
  std::printf(
      "\nGrowth of the median join from one size to the next, beside N and "
      "N log N:\n\n| from | to | accel | torch | N | N log N |\n"
      "|---|---|---|---|---|---|\n");
  for (size_t i = 1; i < sizes.size(); ++i) {
    const double from = sizes[i - 1], to = sizes[i];
    auto growth = [&](std::map<int, Row>& rows) {
      Row& small = rows[sizes[i - 1]];
      Row& large = rows[sizes[i]];
      if (small.join.empty() || large.join.empty()) return std::string("n/a");
      char text[32];
      std::snprintf(text, sizeof(text), "%.2fx",
                    large.join.median() / small.join.median());
      return std::string(text);
    };
    std::printf("| %d | %d | %s | %s | %.2fx | %.2fx |\n", sizes[i - 1],
                sizes[i], growth(accel_rows).c_str(),
                growth(torch_rows).c_str(), to / from,
                to * std::log2(to) / (from * std::log2(from)));
  }
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  RaiseFileLimit();
  if (FLAGS_serve > 0) return Serve(FLAGS_serve);
  signal(SIGPIPE, SIG_IGN);
  std::vector<int> sizes = accel::bench::ParseList(FLAGS_ranks);
  const std::string load = accel::bench::LoadAverage();
  std::map<int, Row> accel_rows, torch_rows;
  for (int repetition = 0; repetition < FLAGS_repetitions; ++repetition) {
    for (int n : sizes) {
      accel_rows[n].Add(JoinAccel(n));
      std::fprintf(stderr, "accel, %d ranks: %.1f ms\n", n,
                   accel_rows[n].join.values.back() * 1e3);
      if (!FLAGS_torch_baseline) continue;
      const accel::bench::Results torch = JoinTorch(n);
      if (torch.count("join") == 0) {
        std::fprintf(stderr, "torch, %d ranks: no result\n", n);
        continue;
      }
      torch_rows[n].Add(torch);
      std::fprintf(stderr, "torch, %d ranks: %.1f ms\n", n,
                   torch.at("join") * 1e3);
    }
  }
  PrintTable(sizes, accel_rows, torch_rows, load);
  return 0;
}
