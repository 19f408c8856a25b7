#include "accel/tracking/tracker.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

struct Entry {
  TrackerFactory factory;
  bool needs_logging_dir = true;
};

struct Registry {
  std::mutex mutex;
  std::map<std::string, Entry> trackers;
};

Registry& GetRegistry() {
  static Registry* registry = new Registry();  // Never destroyed: static
                                               // registrations may outlive it.
  return *registry;
}

std::string Joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) {
    text += (text.empty() ? "" : ", ") + name;
  }
  return text.empty() ? "(none linked)" : text;
}

Entry Find(const std::string& name) {
  {
    Registry& registry = GetRegistry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    auto it = registry.trackers.find(name);
    if (it != registry.trackers.end()) return it->second;
  }
  throw UsageError("unknown tracker '" + name +
                   "'; linked trackers: " + Joined(RegisteredTrackers()) +
                   " (--report_to takes a comma-separated list of them, or "
                   "all; //accel links jsonl and tensorboard)");
}

std::string Trimmed(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  const size_t end = text.find_last_not_of(" \t");
  return text.substr(begin, end - begin + 1);
}

class Blank : public Tracker {
 public:
  const std::string& name() const override { return name_; }
  void store_init_configuration(const TrackerValues&) override {}
  void log(const TrackerValues&, int64_t) override {}
  void finish() override {}

 private:
  std::string name_ = "blank";
};

}  // namespace

double TrackerValue::number() const {
  if (const auto* b = std::get_if<bool>(&value_)) return *b ? 1 : 0;
  if (const auto* i = std::get_if<int64_t>(&value_)) {
    return static_cast<double>(*i);
  }
  if (const auto* d = std::get_if<double>(&value_)) return *d;
  throw UsageError("tracker value \"" + string() +
                   "\" is a string, not a "
                   "number");
}

const std::string& TrackerValue::string() const {
  if (const auto* s = std::get_if<std::string>(&value_)) return *s;
  throw UsageError("tracker value " + ToString() + " is not a string");
}

std::string TrackerValue::ToString() const {
  if (const auto* b = std::get_if<bool>(&value_)) return *b ? "true" : "false";
  if (const auto* i = std::get_if<int64_t>(&value_)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&value_)) {
    if (std::isnan(*d)) return "nan";
    if (std::isinf(*d)) return *d > 0 ? "inf" : "-inf";
    char text[32];
    std::snprintf(text, sizeof(text), "%.17g", *d);
    // The shortest form that reads back as the same double.
    for (int digits = 1; digits < 17; ++digits) {
      char shorter[32];
      std::snprintf(shorter, sizeof(shorter), "%.*g", digits, *d);
      if (std::strtod(shorter, nullptr) == *d) return shorter;
    }
    return text;
  }
  return std::get<std::string>(value_);
}

void RegisterTracker(const std::string& name, TrackerFactory factory,
                     bool needs_logging_dir) {
  if (name.empty() || name == "all" || name == "none" ||
      name.find(',') != std::string::npos) {
    throw UsageError(
        "a tracker name must be non-empty, without commas, and "
        "neither \"all\" nor \"none\"; found \"" +
        name + "\"");
  }
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  if (!registry.trackers
           .emplace(name, Entry{std::move(factory), needs_logging_dir})
           .second) {
    throw UsageError("tracker '" + name + "' is registered twice");
  }
}

std::vector<std::string> RegisteredTrackers() {
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  std::vector<std::string> names;
  for (const auto& entry : registry.trackers) names.push_back(entry.first);
  return names;
}

bool TrackerNeedsLoggingDir(const std::string& name) {
  return Find(name).needs_logging_dir;
}

std::unique_ptr<Tracker> CreateTracker(const std::string& name,
                                       const TrackerContext& context) {
  const Entry entry = Find(name);
  if (entry.needs_logging_dir && context.logging_dir.empty()) {
    throw UsageError("tracker '" + name +
                     "' needs a logging directory: pass --logging_dir=DIR "
                     "(or set AcceleratorOptions::logging_dir or "
                     "project_dir)");
  }
  std::unique_ptr<Tracker> tracker = entry.factory(context);
  if (tracker == nullptr) {
    throw UsageError("the factory of tracker '" + name + "' returned null");
  }
  return tracker;
}

std::vector<std::string> ParseTrackerNames(const std::string& report_to) {
  const std::string whole = Trimmed(report_to);
  if (whole.empty() || whole == "none") return {};
  std::vector<std::string> names;
  size_t start = 0;
  while (true) {
    const size_t comma = whole.find(',', start);
    const std::string name = Trimmed(whole.substr(
        start, comma == std::string::npos ? std::string::npos : comma - start));
    if (name.empty()) {
      throw UsageError("--report_to=\"" + report_to +
                       "\" has an empty name; expected a comma-separated "
                       "list of trackers (" +
                       Joined(RegisteredTrackers()) + "), all or none");
    }
    names.push_back(name);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (names.size() > 1) {
    for (const std::string& name : names) {
      if (name == "all" || name == "none") {
        throw UsageError("--report_to=\"" + report_to + "\": \"" + name +
                         "\" cannot be combined with other trackers");
      }
    }
  }
  return names;
}

std::vector<std::string> ResolveTrackerNames(
    const std::vector<std::string>& names) {
  std::vector<std::string> resolved;
  for (const std::string& name : names) {
    const std::vector<std::string> expanded =
        name == "all" ? RegisteredTrackers() : std::vector<std::string>{name};
    for (const std::string& one : expanded) {
      Find(one);  // Throws for an unknown name.
      if (std::find(resolved.begin(), resolved.end(), one) == resolved.end()) {
        resolved.push_back(one);
      }
    }
  }
  return resolved;
}

Tracker& BlankTracker() {
  static Blank* blank = new Blank();
  return *blank;
}

}  // namespace accel
