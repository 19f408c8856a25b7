// Experiment trackers, as Accelerate's (GeneralTracker): each one records the
// run's hyperparameters and the values a program logs, behind one small
// interface, registered by name so that a program links only the trackers it
// uses and picks them at run time (--report_to=jsonl,tensorboard or all).
//
//   accelerator.init_trackers("my_run", {{"lr", 3e-4}, {"batch_size", 32},
//                                        {"optimizer", "adamw"}});
//   accelerator.log({{"loss", 0.25}, {"accuracy", 0.91}}, /*step=*/100);
//   accelerator.end_training();  // finishes (closes) every tracker
//
// Provided (each its own Bazel target, both in //accel):
//   "jsonl"        accel/tracking/jsonl_tracker.h: one JSON line per log()
//   "tensorboard"  accel/tracking/tensorboard_tracker.h: events.out.tfevents.*
//
// Writing your own: derive from Tracker and register a factory in a .cc whose
// cc_library has alwayslink = 1; "--report_to=mine" then finds it.
//
//   class StdoutTracker : public accel::Tracker {
//    public:
//     const std::string& name() const override { return name_; }
//     void store_init_configuration(const accel::TrackerValues&) override {}
//     void log(const accel::TrackerValues& values, int64_t step) override {
//       for (const auto& [key, value] : values)
//         std::cout << step << " " << key << "=" << value.ToString() << "\n";
//     }
//     void finish() override {}
//    private:
//     std::string name_ = "stdout";
//   };
//   static const accel::TrackerRegistration kStdout(
//       "stdout", [](const accel::TrackerContext&) {
//         return std::make_unique<StdoutTracker>();
//       }, /*needs_logging_dir=*/false);
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace accel {

// One logged value or hyperparameter: a bool, an integer, a real number or a
// string (what Accelerate's trackers take; tensors: pass loss.item<double>()).
class TrackerValue {
 public:
  using Variant = std::variant<bool, int64_t, double, std::string>;

  TrackerValue(bool value) : value_(value) {}
  template <typename Integer,
            std::enable_if_t<std::is_integral_v<Integer> &&
                                 !std::is_same_v<Integer, bool>,
                             int> = 0>
  TrackerValue(Integer value) : value_(ToInteger(value)) {}
  TrackerValue(double value) : value_(value) {}
  TrackerValue(float value) : value_(static_cast<double>(value)) {}
  TrackerValue(const char* value) : value_(std::string(value)) {}
  TrackerValue(std::string value) : value_(std::move(value)) {}

  bool is_bool() const { return std::holds_alternative<bool>(value_); }
  bool is_integer() const { return std::holds_alternative<int64_t>(value_); }
  bool is_real() const { return std::holds_alternative<double>(value_); }
  bool is_string() const { return std::holds_alternative<std::string>(value_); }
  // Integers, reals and bools (as 0 and 1) have a number; strings do not.
  bool is_number() const { return !is_string(); }
  // The number (UsageError for a string).
  double number() const;
  const std::string& string() const;  // UsageError unless is_string().
  const Variant& variant() const { return value_; }
  // As a person reads it: 3, 0.25, true, adamw.
  std::string ToString() const;

  bool operator==(const TrackerValue& other) const {
    return value_ == other.value_;
  }

 private:
  template <typename Integer>
  static Variant ToInteger(Integer value) {
    // An unsigned value above int64's range stays a number, not a negative.
    if constexpr (std::is_unsigned_v<Integer> && sizeof(Integer) >= 8) {
      if (value > static_cast<Integer>(INT64_MAX)) {
        return static_cast<double>(value);
      }
    }
    return static_cast<int64_t>(value);
  }

  Variant value_;
};

// Names to values, in name order (a run's configuration, one log() call).
using TrackerValues = std::map<std::string, TrackerValue>;

class Tracker {
 public:
  virtual ~Tracker() = default;
  // The name it was registered under ("jsonl", "tensorboard").
  virtual const std::string& name() const = 0;
  // The run's hyperparameters (init_trackers' config), once, before log().
  virtual void store_init_configuration(const TrackerValues& config) = 0;
  // Values of one step. Written through (flushed) before it returns, so that
  // a crash loses nothing already logged.
  virtual void log(const TrackerValues& values, int64_t step) = 0;
  // Closes the run's files; nothing is logged afterwards.
  virtual void finish() = 0;
};

// What a tracker is created with (Accelerate: run_name, logging_dir).
struct TrackerContext {
  std::string project_name;
  // <logging_dir>/<project_name> is the run's folder. Empty for trackers
  // registered with needs_logging_dir = false when none was given.
  std::string logging_dir;
};

using TrackerFactory =
    std::function<std::unique_ptr<Tracker>(const TrackerContext&)>;

// UsageError when `name` is taken or empty.
void RegisterTracker(const std::string& name, TrackerFactory factory,
                     bool needs_logging_dir = true);

struct TrackerRegistration {
  TrackerRegistration(const std::string& name, TrackerFactory factory,
                      bool needs_logging_dir = true) {
    RegisterTracker(name, std::move(factory), needs_logging_dir);
  }
};

// The trackers linked into this program, sorted.
std::vector<std::string> RegisteredTrackers();

// Whether tracker `name` writes under the logging directory (UsageError
// naming the linked trackers when there is no such tracker).
bool TrackerNeedsLoggingDir(const std::string& name);

// UsageError naming the linked trackers (and the target to link) when `name`
// is not registered.
std::unique_ptr<Tracker> CreateTracker(const std::string& name,
                                       const TrackerContext& context);

// --report_to's value as a list: "jsonl,tensorboard" -> {"jsonl",
// "tensorboard"}; "all" -> {"all"}; "" and "none" -> {}. Spaces around names
// are ignored; an empty name between commas, or "all"/"none" beside other
// names, is a UsageError.
std::vector<std::string> ParseTrackerNames(const std::string& report_to);

// `names` with "all" replaced by every registered tracker, duplicates
// dropped, each checked (UsageError for an unknown one).
std::vector<std::string> ResolveTrackerNames(
    const std::vector<std::string>& names);

// A tracker that ignores everything: what get_tracker returns on processes
// other than the main one, as in Accelerate.
Tracker& BlankTracker();

}  // namespace accel
