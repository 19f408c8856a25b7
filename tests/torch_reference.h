// What python3-torch computes, for tests that compare accel's values with
// torch's own bit for bit: runs a Python script with /usr/bin/python3 and
// parses the JSON object it prints last.
//
//   const nlohmann::json expected = accel::testing::TorchReference(R"PY(
//   import json, torch
//   print(json.dumps({"exp": torch.tensor(1.0).exp().item()}))
//   )PY");
//   EXPECT_EQ(std::exp(1.0f), expected["exp"].get<float>());
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "tests/subprocess.h"

namespace accel::testing {

// std::runtime_error with Python's output when the script fails or prints
// no JSON object.
inline nlohmann::json TorchReference(const std::string& script) {
  const ProcessResult python = RunProcess({"/usr/bin/python3", "-c", script},
                                          {}, std::chrono::seconds(120));
  const size_t json = python.output.find('{');
  if (python.exit_code != 0 || json == std::string::npos) {
    throw std::runtime_error("python3-torch's reference failed (exit " +
                             std::to_string(python.exit_code) +
                             "): " + python.output);
  }
  return nlohmann::json::parse(python.output.substr(json));
}

}  // namespace accel::testing
