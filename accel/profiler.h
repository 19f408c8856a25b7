// Accelerate's accelerator.profile(): LibTorch's profiler over a part of a
// program, with torch.profiler's schedule, key_averages() table and Chrome
// trace, one trace file per process.
//
//   accel::ProfileKwargs kwargs;
//   kwargs.schedule_option = accel::ProfileSchedule{/*wait=*/1, /*warmup=*/1,
//                                                   /*active=*/2};
//   kwargs.output_trace_dir = "traces";
//   accel::Profiler profiler(accelerator, kwargs);
//   for (auto& batch : *loader) {
//     train_step(batch);
//     profiler.step();
//   }
//   profiler.stop();  // Python's end of `with accelerator.profile(...)`:
//                     // traces/profile_<process_index>.json, on every rank.
//   std::cout << profiler.key_averages().table("self_cpu_time_total", 10);
//
// Marking a part of the program: LibTorch's RECORD_USER_SCOPE("name") (as
// Python's torch.profiler.record_function) makes a row and a trace span.
//
// Differences from Accelerate: a class built beside the accelerator, not a
// context manager (stop() or the destructor ends it); CPU activity only:
// Debian's LibTorch has no Kineto, so accel records with LibTorch's legacy
// (CPU) profiler and writes the Chrome trace itself. The profiler follows
// the thread that builds it and the threads LibTorch hands work to; build,
// step and stop it on one thread.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "accel/accelerator.h"
#include "accel/kwargs_handlers.h"

namespace accel {

// One operator call (or RECORD_USER_SCOPE span) the profiler saw.
struct ProfiledEvent {
  std::string name;
  uint64_t thread = 0;  // LibTorch's profiler thread number.
  double start_us = 0;  // The process's monotonic clock.
  double duration_us = 0;
  double self_us = 0;            // Less the time of the calls it made.
  int64_t cpu_memory_bytes = 0;  // Allocated, less freed, with its calls.
  int64_t self_cpu_memory_bytes = 0;
  std::vector<std::vector<int64_t>> input_shapes;  // With record_shapes.
};

// One row of key_averages(): the events of one name (and input shapes).
struct EventAverage {
  std::string key;
  std::string input_shapes;  // Empty unless grouped by input shape.
  int64_t count = 0;
  double cpu_time_total_us = 0;
  double self_cpu_time_total_us = 0;
  int64_t cpu_memory_usage = 0;
  int64_t self_cpu_memory_usage = 0;
  double cpu_time_us() const {
    return count == 0 ? 0 : cpu_time_total_us / static_cast<double>(count);
  }
};

class EventAverages {
 public:
  EventAverages(std::vector<EventAverage> rows, bool with_memory);

  // By value from a temporary, so that
  // `for (auto& row : profiler.key_averages().rows())` holds its rows.
  const std::vector<EventAverage>& rows() const& { return rows_; }
  std::vector<EventAverage> rows() && { return std::move(rows_); }
  // The row of `key` (the first, when grouped by shape); nullptr if none.
  const EventAverage* find(const std::string& key) const;
  // torch's table: sort_by one of cpu_time_total, self_cpu_time_total,
  // cpu_time (the average), count, cpu_memory_usage, self_cpu_memory_usage
  // (UsageError otherwise), descending; at most row_limit rows (< 0: all).
  std::string table(const std::string& sort_by = "self_cpu_time_total",
                    int row_limit = 100) const;

 private:
  std::vector<EventAverage> rows_;
  bool with_memory_;
};

class Profiler {
 public:
  // Profiles with the accelerator's ProfileKwargs (its kwargs_handlers').
  explicit Profiler(Accelerator& accelerator);
  // UsageError for a schedule with active < 1 or a negative count.
  Profiler(Accelerator& accelerator, ProfileKwargs kwargs);
  // Stops (as stop()), unless the scope is left by an exception: the trace
  // is then dropped and no process is waited for.
  ~Profiler() noexcept(false);
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Ends one step of the schedule (torch's prof.step()).
  void step();
  // Ends profiling: a trace being recorded becomes ready; with
  // output_trace_dir, writes this process's trace file and waits for every
  // process. Later calls do nothing.
  void stop();

  // The last ready trace: its events, their averages by name (and input
  // shapes), and the Chrome trace file of them (pid = process index).
  const std::vector<ProfiledEvent>& events() const { return events_; }
  EventAverages key_averages(bool group_by_input_shape = false) const;
  void export_chrome_trace(const std::string& path) const;

  // The steps ended so far, and the traces made ready.
  int step_num() const { return step_num_; }
  int traces_ready() const { return traces_ready_; }

 private:
  enum class Action { kNone, kWarmup, kRecord, kRecordAndSave };
  Action ActionAt(int step) const;
  void Transition(Action from, Action to);
  void Start();
  void Discard();
  void Finish();  // Stops recording; the events become the ready trace.

  Accelerator& accelerator_;
  ProfileKwargs kwargs_;
  int exceptions_;
  int step_num_ = 0;
  Action action_ = Action::kNone;
  bool running_ = false;
  bool stopped_ = false;
  int traces_ready_ = 0;
  std::vector<ProfiledEvent> events_;
};

}  // namespace accel
