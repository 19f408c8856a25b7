#include "accel/tracking/jsonl_tracker.h"

#include <chrono>
#include <nlohmann/json.hpp>

namespace accel {
namespace {

double WallTime() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

nlohmann::json ToJson(const TrackerValues& values) {
  nlohmann::json object = nlohmann::json::object();
  for (const auto& [key, value] : values) {
    std::visit([&object, &key = key](const auto& v) { object[key] = v; },
               value.variant());
  }
  return object;
}

// One line; non-finite numbers become null, as JSON has no NaN or infinity.
std::string Line(const nlohmann::json& object) {
  return object.dump(-1, ' ', /*ensure_ascii=*/false,
                     nlohmann::json::error_handler_t::replace) +
         "\n";
}

const TrackerRegistration kRegistration("jsonl",
                                        [](const TrackerContext& context) {
                                          return std::make_unique<JsonlTracker>(
                                              context);
                                        });

}  // namespace

JsonlTracker::JsonlTracker(const TrackerContext& context)
    : file_(context.logging_dir + "/" + context.project_name +
            "/metrics.jsonl") {}

void JsonlTracker::store_init_configuration(const TrackerValues& config) {
  file_.Append(Line({{"config", ToJson(config)}, {"wall_time", WallTime()}}));
}

void JsonlTracker::log(const TrackerValues& values, int64_t step) {
  file_.Append(Line(
      {{"step", step}, {"values", ToJson(values)}, {"wall_time", WallTime()}}));
}

void JsonlTracker::finish() { file_.Close(); }

}  // namespace accel
