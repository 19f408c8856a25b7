// A DeepSpeed JSON configuration (Accelerate's
// deepspeed_config.deepspeed_config_file) read for what maps onto accel's
// flags: the ZeRO stage, accumulation, clipping and precision
// (accelerate_yaml_internal.h).
#include <cmath>
#include <string>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/excerpt.h"
#include "accel/runtime/launch/accelerate_yaml_internal.h"

namespace accel::accelerate_yaml_internal {
namespace {

// What DeepSpeed's JSON writes for a setting it leaves to Accelerate
// ("auto") or that is off (false, null, "none", {"device": "none"}): no
// warning for those.
bool IsHarmlessJson(const nlohmann::json& value) {
  if (value.is_null()) return true;
  if (value.is_boolean()) return !value.get<bool>();
  if (value.is_string()) {
    const std::string text = value.get<std::string>();
    return text == "auto" || text == "none";
  }
  if (value.is_object()) {
    for (const auto& item : value.items()) {
      if (!IsHarmlessJson(item.value())) return false;
    }
    return true;
  }
  return false;
}

}  // namespace

void DeepSpeedJsonReader::Names::Add(const std::string& name) {
  if (++count <= 10) names.push_back(Shown(name));
}

std::string DeepSpeedJsonReader::Names::text() const {
  std::string joined;
  for (const std::string& name : names) {
    joined += (joined.empty() ? "" : ", ") + name;
  }
  return count <= 10 ? joined
                     : joined + " and " + std::to_string(count - 10) + " more";
}

void DeepSpeedJsonReader::Read(const nlohmann::json& json) {
  if (!json.is_object()) throw UsageError(where + " is not a JSON object");
  bool fp16 = false, bf16 = false;
  for (const auto& item : json.items()) {
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    if (key == "zero_optimization") {
      ZeroOptimization(value);
    } else if (key == "gradient_accumulation_steps") {
      if (value.is_number_integer()) {
        accumulation = std::to_string(value.get<long long>());
      } else if (!IsAuto(value)) {
        throw UsageError(where +
                         ": gradient_accumulation_steps: expected "
                         "a whole number or \"auto\", found " +
                         Excerpt(value.dump()));
      }
    } else if (key == "gradient_clipping") {
      if (value.is_number() && value.get<double>() >= 0 &&
          std::isfinite(value.get<double>())) {
        clipping = value.dump();
      } else if (!IsAuto(value)) {
        throw UsageError(where +
                         ": gradient_clipping: expected a number, 0 or "
                         "above, or \"auto\", found " +
                         Excerpt(value.dump()));
      }
    } else if (key == "fp16") {
      fp16 = Enabled(key, value);
    } else if (key == "bf16" || key == "bfloat16") {
      bf16 = bf16 || Enabled(key, value);
    } else if (!IsHarmlessJson(value)) {
      ignored.Add(key);
    }
  }
  if (stage.empty() && !stage_auto) {
    throw UsageError(where +
                     " has no zero_optimization.stage (0 to 3, or \"auto\" "
                     "with deepspeed_config.zero_stage or --zero_stage)");
  }
  if (fp16 && bf16) {
    throw UsageError(where +
                     " enables both fp16 and bf16: enable one (it sets "
                     "--mixed_precision)");
  }
  if (fp16) precision = "fp16";
  if (bf16) precision = "bf16";
}

bool DeepSpeedJsonReader::IsAuto(const nlohmann::json& value) {
  return value.is_string() && value.get<std::string>() == "auto";
}

void DeepSpeedJsonReader::ZeroOptimization(const nlohmann::json& section) {
  if (!section.is_object()) return;
  for (const auto& item : section.items()) {
    if (item.key() == "stage") {
      const nlohmann::json& value = item.value();
      if (value.is_number_integer() && value.get<long long>() >= 0 &&
          value.get<long long>() <= 3) {
        stage = std::to_string(value.get<long long>());
      } else if (IsAuto(value)) {
        stage_auto = true;  // deepspeed_config.zero_stage, or the flag.
      } else {
        throw UsageError(where +
                         ": zero_optimization.stage: expected 0 to 3 or "
                         "\"auto\", found " +
                         Excerpt(value.dump()));
      }
    } else if (!IsHarmlessJson(item.value())) {
      ignored.Add("zero_optimization." + item.key());
    }
  }
}

bool DeepSpeedJsonReader::Enabled(const std::string& key,
                                  const nlohmann::json& section) {
  if (!section.is_object()) {
    throw UsageError(where + ": " + key +
                     ": expected an object such as "
                     "{\"enabled\": true}, found " +
                     Excerpt(section.dump()));
  }
  bool enabled = false;
  for (const auto& item : section.items()) {
    const nlohmann::json& value = item.value();
    if (item.key() == "enabled") {
      if (value.is_boolean()) {
        enabled = value.get<bool>();
      } else if (!IsAuto(value)) {
        throw UsageError(where + ": " + key +
                         ".enabled: expected true, false or \"auto\", "
                         "found " +
                         Excerpt(value.dump()));
      }
    } else if (!IsHarmlessJson(value)) {
      ignored.Add(key + "." + item.key());
    }
  }
  return enabled;
}

}  // namespace accel::accelerate_yaml_internal
