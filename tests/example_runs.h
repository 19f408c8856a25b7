// What the examples' end-to-end tests (examples_test, examples_resume_test,
// examples_flags_test) share: an example run through self-launch
// (--num_processes) on a free port, and what it printed and saved.
//
//   const ProcessResult r = RunExample("train_demo", {"--num_processes=2"});
//   EXPECT_EQ(Matches(r.output, "Epoch [0-9] - Accuracy").size(), 3u);
//   EXPECT_EQ(Fingerprint(r), Fingerprint(straight));
#pragma once

#include <torch/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "tests/subprocess.h"

namespace accel::testing {

// How long one example may run.
inline constexpr std::chrono::seconds kTimeout{120};

// examples/`name` with `args` and --main_process_port=0.
ProcessResult RunExample(const std::string& name,
                         std::vector<std::string> args);

// Every match of `pattern` in `text`, in order.
std::vector<std::string> Matches(const std::string& text,
                                 const std::string& pattern);

// The one "Parameter fingerprint: ..." line train_demo printed, else a
// message with the whole output.
std::string Fingerprint(const ProcessResult& r);

bool Exists(const std::string& path);

// The final weights complete_example saved in `dir`/model.
std::map<std::string, torch::Tensor> Weights(const std::string& dir);

}  // namespace accel::testing
