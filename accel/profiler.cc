#include "accel/profiler.h"

#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"

namespace accel {
namespace {

namespace legacy = torch::autograd::profiler;

std::string ShapesText(const std::vector<std::vector<int64_t>>& shapes) {
  std::string text = "[";
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (i > 0) text += ", ";
    text += "[";
    for (size_t j = 0; j < shapes[i].size(); ++j) {
      if (j > 0) text += ", ";
      text += std::to_string(shapes[i][j]);
    }
    text += "]";
  }
  return text + "]";
}

// An operator whose PopRange has not come yet.
struct OpenRange {
  ProfiledEvent event;
  at::RecordFunctionHandle handle;
  double children_us = 0;
  int64_t children_bytes = 0;
};

// Pairs each thread's PushRange and PopRange events (by handle) into
// calls, with the time and memory of the calls they made taken out.
std::vector<ProfiledEvent> CallsOf(const legacy::thread_event_lists& lists) {
  std::vector<ProfiledEvent> calls;
  for (const std::vector<legacy::LegacyEvent>& list : lists) {
    std::vector<OpenRange> open;
    for (const legacy::LegacyEvent& e : list) {
      switch (e.kind()) {
        case legacy::EventKind::PushRange: {
          OpenRange range;
          range.event.name = e.name();
          range.event.thread = e.threadId();
          range.event.start_us = e.cpuUs();
          range.event.input_shapes = e.shapes();
          range.handle = e.handle();
          open.push_back(std::move(range));
          break;
        }
        case legacy::EventKind::PopRange: {
          auto it = std::find_if(open.rbegin(), open.rend(),
                                 [&](const OpenRange& range) {
                                   return range.handle == e.handle();
                                 });
          if (it == open.rend()) break;  // Began before the profiler did.
          // Ranges above it never ended (an exception left them): dropped.
          open.erase(it.base(), open.end());
          OpenRange range = std::move(open.back());
          open.pop_back();
          ProfiledEvent& call = range.event;
          call.duration_us = e.cpuUs() - call.start_us;
          call.self_us = std::max(0.0, call.duration_us - range.children_us);
          call.cpu_memory_bytes =
              call.self_cpu_memory_bytes + range.children_bytes;
          if (!open.empty()) {
            open.back().children_us += call.duration_us;
            open.back().children_bytes += call.cpu_memory_bytes;
          }
          calls.push_back(std::move(call));
          break;
        }
        case legacy::EventKind::MemoryAlloc:
          if (!open.empty()) {
            open.back().event.self_cpu_memory_bytes += e.cpuMemoryUsage();
          }
          break;
        case legacy::EventKind::Mark:
          break;
      }
    }
  }
  std::sort(calls.begin(), calls.end(),
            [](const ProfiledEvent& a, const ProfiledEvent& b) {
              return a.start_us < b.start_us;
            });
  return calls;
}

std::string Printf(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), format, value);
  return buffer;
}

// torch's _format_time and _format_memory.
std::string TimeText(double us) {
  if (us >= 1e6) return Printf("%.3fs", us / 1e6);
  if (us >= 1e3) return Printf("%.3fms", us / 1e3);
  return Printf("%.3fus", us);
}

std::string MemoryText(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  const double size = std::abs(b);
  if (size >= 1024.0 * 1024 * 1024) return Printf("%.2f Gb", b / (1 << 30));
  if (size >= 1024.0 * 1024) return Printf("%.2f Mb", b / (1 << 20));
  if (size >= 1024.0) return Printf("%.2f Kb", b / 1024);
  return std::to_string(bytes) + " b";
}

std::string Pad(std::string text, size_t width, bool left) {
  if (text.size() >= width) return text;
  const std::string fill(width - text.size(), ' ');
  return left ? text + fill : fill + text;
}

// The value a row sorts by, descending; UsageError for an unknown key.
double SortValue(const EventAverage& row, const std::string& sort_by) {
  if (sort_by == "cpu_time_total") return row.cpu_time_total_us;
  if (sort_by == "self_cpu_time_total") return row.self_cpu_time_total_us;
  if (sort_by == "cpu_time") return row.cpu_time_us();
  if (sort_by == "count") return static_cast<double>(row.count);
  if (sort_by == "cpu_memory_usage") {
    return static_cast<double>(row.cpu_memory_usage);
  }
  if (sort_by == "self_cpu_memory_usage") {
    return static_cast<double>(row.self_cpu_memory_usage);
  }
  throw UsageError(
      "key_averages().table: sort_by \"" + sort_by +
      "\" is not one of cpu_time_total, self_cpu_time_total, cpu_time, "
      "count, cpu_memory_usage, self_cpu_memory_usage (CPU only: no cuda_*)");
}

}  // namespace

EventAverages::EventAverages(std::vector<EventAverage> rows, bool with_memory)
    : rows_(std::move(rows)), with_memory_(with_memory) {}

const EventAverage* EventAverages::find(const std::string& key) const {
  for (const EventAverage& row : rows_) {
    if (row.key == key) return &row;
  }
  return nullptr;
}

std::string EventAverages::table(const std::string& sort_by,
                                 int row_limit) const {
  std::vector<const EventAverage*> sorted;
  for (const EventAverage& row : rows_) sorted.push_back(&row);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](const EventAverage* a, const EventAverage* b) {
                     return SortValue(*a, sort_by) > SortValue(*b, sort_by);
                   });
  if (row_limit >= 0 && sorted.size() > static_cast<size_t>(row_limit)) {
    sorted.resize(static_cast<size_t>(row_limit));
  }
  double self_total = 0;
  bool with_shapes = false;
  size_t name_width = 4;
  for (const EventAverage& row : rows_) {
    self_total += row.self_cpu_time_total_us;
    with_shapes = with_shapes || !row.input_shapes.empty();
    name_width = std::max(name_width, std::min<size_t>(row.key.size(), 55));
  }
  std::vector<std::string> headers = {"Self CPU %", "Self CPU", "CPU total %",
                                      "CPU total", "CPU time avg"};
  if (with_memory_) {
    headers.insert(headers.end(), {"CPU Mem", "Self CPU Mem"});
  }
  headers.push_back("# of Calls");
  const size_t column = 14;
  auto percent = [&](double us) {
    return Printf("%.2f%%", self_total > 0 ? 100.0 * us / self_total : 0.0);
  };
  std::string rule(name_width, '-');
  for (size_t i = 0; i < headers.size(); ++i) {
    rule += "  " + std::string(column, '-');
  }
  std::string out = rule + "\n" + Pad("Name", name_width, true);
  for (const std::string& header : headers)
    out += Pad(header, column + 2, false);
  if (with_shapes) out += "  Input Shapes";
  out += "\n" + rule + "\n";
  for (const EventAverage* row : sorted) {
    std::string name = row->key;
    if (name.size() > 55) name = name.substr(0, 52) + "...";
    std::vector<std::string> cells = {
        percent(row->self_cpu_time_total_us),
        TimeText(row->self_cpu_time_total_us), percent(row->cpu_time_total_us),
        TimeText(row->cpu_time_total_us), TimeText(row->cpu_time_us())};
    if (with_memory_) {
      cells.push_back(MemoryText(row->cpu_memory_usage));
      cells.push_back(MemoryText(row->self_cpu_memory_usage));
    }
    cells.push_back(std::to_string(row->count));
    out += Pad(name, name_width, true);
    for (const std::string& cell : cells) out += Pad(cell, column + 2, false);
    if (with_shapes) out += "  " + row->input_shapes;
    out += "\n";
  }
  return out + rule + "\nSelf CPU time total: " + TimeText(self_total) + "\n";
}

Profiler::Profiler(Accelerator& accelerator)
    : Profiler(accelerator, accelerator.profile_handler()) {}

Profiler::Profiler(Accelerator& accelerator, ProfileKwargs kwargs)
    : accelerator_(accelerator),
      kwargs_(std::move(kwargs)),
      exceptions_(std::uncaught_exceptions()) {
  if (const auto& s = kwargs_.schedule_option) {
    if (s->active < 1 || s->wait < 0 || s->warmup < 0 || s->repeat < 0 ||
        s->skip_first < 0) {
      throw UsageError(
          "ProfileKwargs.schedule_option: active must be at least 1 and "
          "wait, warmup, repeat, skip_first at least 0; found wait=" +
          std::to_string(s->wait) + " warmup=" + std::to_string(s->warmup) +
          " active=" + std::to_string(s->active) +
          " repeat=" + std::to_string(s->repeat) +
          " skip_first=" + std::to_string(s->skip_first));
    }
  }
  action_ = ActionAt(0);
  Transition(Action::kNone, action_);
}

Profiler::~Profiler() noexcept(false) {
  if (std::uncaught_exceptions() != exceptions_) {
    if (running_) Discard();
    return;
  }
  stop();
}

// torch.profiler.schedule.
Profiler::Action Profiler::ActionAt(int step) const {
  if (!kwargs_.schedule_option) return Action::kRecord;
  const ProfileSchedule& s = *kwargs_.schedule_option;
  if (step < s.skip_first) return Action::kNone;
  step -= s.skip_first;
  const int cycle = s.wait + s.warmup + s.active;
  if (s.repeat > 0 && step / cycle >= s.repeat) return Action::kNone;
  const int in_cycle = step % cycle;
  if (in_cycle < s.wait) return Action::kNone;
  if (in_cycle < s.wait + s.warmup) return Action::kWarmup;
  return in_cycle < cycle - 1 ? Action::kRecord : Action::kRecordAndSave;
}

// torch.profiler.profile's action map. The legacy profiler starts cheaply,
// so warm-up steps run it and drop what it saw.
void Profiler::Transition(Action from, Action to) {
  const bool recording_to =
      to == Action::kRecord || to == Action::kRecordAndSave;
  switch (from) {
    case Action::kNone:
      if (to != Action::kNone) Start();
      break;
    case Action::kWarmup:
      if (to == Action::kWarmup) break;
      Discard();
      if (recording_to) Start();
      break;
    case Action::kRecord:
      if (recording_to) break;
      Finish();
      if (to == Action::kWarmup) Start();
      break;
    case Action::kRecordAndSave:
      Finish();
      if (to != Action::kNone) Start();
      break;
  }
}

void Profiler::step() {
  if (stopped_) {
    throw UsageError("Profiler::step: the profiler was stopped");
  }
  const Action from = action_;
  ++step_num_;
  action_ = ActionAt(step_num_);
  Transition(from, action_);
}

void Profiler::stop() {
  if (stopped_) return;
  stopped_ = true;
  Transition(action_, Action::kNone);
  action_ = Action::kNone;
  if (kwargs_.output_trace_dir.empty()) return;
  MakeDirectories(kwargs_.output_trace_dir);
  export_chrome_trace(kwargs_.output_trace_dir + "/profile_" +
                      std::to_string(accelerator_.process_index()) + ".json");
  accelerator_.wait_for_everyone();
}

void Profiler::Start() {
  try {
    legacy::enableProfilerLegacy(torch::profiler::impl::ProfilerConfig(
        torch::profiler::impl::ProfilerState::CPU, kwargs_.record_shapes,
        kwargs_.profile_memory));
  } catch (const c10::Error& e) {
    throw UsageError(
        std::string("Profiler: LibTorch's profiler would not start on this "
                    "thread (is another profiler running on it?): ") +
        e.what_without_backtrace());
  }
  running_ = true;
}

void Profiler::Discard() {
  running_ = false;
  legacy::disableProfilerLegacy();
}

void Profiler::Finish() {
  running_ = false;
  events_ = CallsOf(legacy::disableProfilerLegacy());
  ++traces_ready_;
  if (kwargs_.on_trace_ready) kwargs_.on_trace_ready(*this);
}

EventAverages Profiler::key_averages(bool group_by_input_shape) const {
  std::map<std::pair<std::string, std::string>, EventAverage> by_key;
  std::vector<std::pair<std::string, std::string>> order;
  for (const ProfiledEvent& event : events_) {
    const std::string shapes =
        group_by_input_shape ? ShapesText(event.input_shapes) : "";
    auto [it, inserted] = by_key.try_emplace({event.name, shapes});
    if (inserted) order.push_back(it->first);
    EventAverage& row = it->second;
    row.key = event.name;
    row.input_shapes = shapes;
    ++row.count;
    row.cpu_time_total_us += event.duration_us;
    row.self_cpu_time_total_us += event.self_us;
    row.cpu_memory_usage += event.cpu_memory_bytes;
    row.self_cpu_memory_usage += event.self_cpu_memory_bytes;
  }
  std::vector<EventAverage> rows;
  rows.reserve(order.size());
  for (const auto& key : order) rows.push_back(std::move(by_key[key]));
  return EventAverages(std::move(rows), kwargs_.profile_memory);
}

void Profiler::export_chrome_trace(const std::string& path) const {
  const int pid = accelerator_.process_index();
  nlohmann::json trace_events = nlohmann::json::array();
  trace_events.push_back({{"name", "process_name"},
                          {"ph", "M"},
                          {"pid", pid},
                          {"args", {{"name", "rank " + std::to_string(pid)}}}});
  for (const ProfiledEvent& event : events_) {
    nlohmann::json args = nlohmann::json::object();
    if (!event.input_shapes.empty()) args["Input Dims"] = event.input_shapes;
    if (kwargs_.profile_memory) {
      args["Self CPU Mem"] = event.self_cpu_memory_bytes;
    }
    trace_events.push_back({{"name", event.name},
                            {"ph", "X"},
                            {"cat", "cpu_op"},
                            {"pid", pid},
                            {"tid", event.thread},
                            {"ts", event.start_us},
                            {"dur", event.duration_us},
                            {"args", std::move(args)}});
  }
  const nlohmann::json trace = {{"traceEvents", std::move(trace_events)},
                                {"displayTimeUnit", "ms"}};
  WriteFileAtomically(
      path,
      trace.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace accel
