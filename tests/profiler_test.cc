// accel::Profiler (Accelerate's accelerator.profile()) at 1-3 processes:
// the operators of a training step are counted and timed with their calls'
// time taken out, torch's schedule records exactly the active steps of each
// cycle, and stop() writes one Chrome trace per process. The Accelerator
// gets its ProfileKwargs through kwargs_handlers, as in Accelerate.
#include "accel/profiler.h"

#include <ATen/record_function.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

#include "accel/runtime/base/errors.h"
#include "tests/multiprocess_main.h"

namespace accel::testing {

AcceleratorOptions TestAcceleratorOptions() {
  AcceleratorOptions options;
  options.backend = TestBackend();
  options.seed = 1234;
  ProfileKwargs profile_kwargs;
  profile_kwargs.record_shapes = true;
  profile_kwargs.profile_memory = true;
  options.kwargs_handlers = {profile_kwargs};
  return options;
}

namespace {

using ::testing::HasSubstr;

Accelerator& A() { return SharedAccelerator(); }

struct Training {
  Training() {
    torch::manual_seed(3);
    torch::nn::Sequential net(torch::nn::Linear(6, 16), torch::nn::ReLU(),
                              torch::nn::Linear(16, 2));
    // The prepared optimizer steps this one: it lives as long.
    sgd = std::make_unique<torch::optim::SGD>(net->parameters(),
                                              torch::optim::SGDOptions(0.1));
    auto [prepared_model, prepared_optimizer] = A().prepare(net, *sgd);
    model = prepared_model;
    optimizer.emplace(std::move(prepared_optimizer));
  }
  // One step on a batch of 4, inside a user scope named `name`.
  void Step(const std::string& name) {
    RECORD_USER_SCOPE(name);
    A().backward(model->forward(torch::randn({4, 6})).pow(2).mean());
    optimizer->step();
    optimizer->zero_grad();
  }

  std::unique_ptr<torch::optim::SGD> sgd;
  torch::nn::Sequential model{nullptr};
  std::optional<AcceleratedOptimizer<torch::optim::SGD>> optimizer;
};

std::string TraceDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name + "_" +
         std::to_string(A().num_processes());
}

TEST(ProfilerTest, CountsAndTimesTheOperatorsOfEachStep) {
  Training training;
  const torch::Tensor metric = torch::ones({2});
  Profiler profiler(A());  // The handler's kwargs: shapes and memory.
  for (int i = 0; i < 3; ++i) training.Step("train_step");
  A().gather(metric);
  profiler.stop();
  ASSERT_EQ(profiler.traces_ready(), 1);
  const EventAverages averages = profiler.key_averages();
  const EventAverage* step = averages.find("train_step");
  const EventAverage* addmm = averages.find("aten::addmm");
  ASSERT_NE(step, nullptr);
  ASSERT_NE(addmm, nullptr);
  EXPECT_EQ(step->count, 3);
  EXPECT_EQ(addmm->count, 6);  // Two Linear layers' forward, three steps.
  // accel's collectives are spans too: the gather, and with several
  // processes the wait for each step's gradient buckets.
  ASSERT_NE(averages.find("accel::gather"), nullptr);
  EXPECT_EQ(averages.find("accel::gather")->count, 1);
  if (A().num_processes() > 1) {
    ASSERT_NE(averages.find("accel::gradient_sync"), nullptr);
    EXPECT_EQ(averages.find("accel::gradient_sync")->count, 3);
  }
  // The step's own time is what its operators did not take.
  EXPECT_LT(step->self_cpu_time_total_us, step->cpu_time_total_us);
  EXPECT_GE(step->cpu_time_total_us, addmm->cpu_time_total_us);
  // Each addmm allocates its output: 4x16 and 4x2 floats.
  EXPECT_GE(addmm->cpu_memory_usage, 3 * (4 * 16 + 4 * 2) * 4);
  // Every call lies inside a step's span or the gather's, on one thread:
  // the self times add up to those spans.
  double self_sum = 0, top_sum = 0;
  for (const ProfiledEvent& event : profiler.events()) {
    self_sum += event.self_us;
    if (event.name == "train_step" || event.name == "accel::gather") {
      top_sum += event.duration_us;
    }
  }
  EXPECT_NEAR(self_sum, top_sum, 1e-6 * top_sum + 1e-3);

  // Grouped by input shape, the two layers' addmm calls are two rows.
  int addmm_rows = 0;
  for (const EventAverage& row : profiler.key_averages(true).rows()) {
    if (row.key != "aten::addmm") continue;
    ++addmm_rows;
    EXPECT_EQ(row.count, 3) << row.input_shapes;
  }
  EXPECT_EQ(addmm_rows, 2);

  const std::string table = averages.table("self_cpu_time_total", 2);
  EXPECT_THAT(table, HasSubstr("Self CPU %"));
  EXPECT_THAT(table, HasSubstr("# of Calls"));
  EXPECT_THAT(table, HasSubstr("Self CPU Mem"));
  EXPECT_THAT(table, HasSubstr("Self CPU time total: "));
  // Three rules, a header and the two rows asked for, then the total.
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 7) << table;
  const std::string by_count = averages.table("count", 1);
  int64_t most_calls = 0;
  for (const EventAverage& row : averages.rows()) {
    most_calls = std::max(most_calls, row.count);
  }
  EXPECT_THAT(by_count, HasSubstr(" " + std::to_string(most_calls) + "\n"));
  try {
    averages.table("cuda_time_total");
    ADD_FAILURE() << "a CUDA sort key was accepted";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("is not one of"));
  }
}

TEST(ProfilerTest, ScheduleRecordsTheActiveStepsOfEachCycle) {
  Training training;
  ProfileKwargs kwargs;
  kwargs.schedule_option = ProfileSchedule{/*wait=*/1, /*warmup=*/1,
                                           /*active=*/2, /*repeat=*/2,
                                           /*skip_first=*/1};
  std::vector<std::set<std::string>> traces;
  kwargs.on_trace_ready = [&](Profiler& p) {
    std::set<std::string> steps;
    for (const ProfiledEvent& event : p.events()) {
      if (event.name.rfind("step_", 0) == 0) steps.insert(event.name);
    }
    traces.push_back(steps);
  };
  Profiler profiler(A(), kwargs);
  for (int i = 0; i < 14; ++i) {
    training.Step("step_" + std::to_string(i));
    profiler.step();
  }
  profiler.stop();
  // Step 0 skipped; then cycles of wait, warmup, two active steps; two
  // cycles only (a third would record steps 11 and 12).
  using Steps = std::set<std::string>;
  ASSERT_EQ(traces.size(), 2u);
  EXPECT_EQ(traces[0], (Steps{"step_3", "step_4"}));
  EXPECT_EQ(traces[1], (Steps{"step_7", "step_8"}));
  EXPECT_EQ(profiler.step_num(), 14);
  EXPECT_EQ(profiler.traces_ready(), 2);
  EXPECT_THROW(profiler.step(), UsageError);
}

TEST(ProfilerTest, StoppingInsideACycleMakesThePartialTraceReady) {
  Training training;
  ProfileKwargs kwargs;
  kwargs.schedule_option = ProfileSchedule{/*wait=*/0, /*warmup=*/1,
                                           /*active=*/3};
  Profiler profiler(A(), kwargs);
  for (int i = 0; i < 3; ++i) {
    training.Step("step_" + std::to_string(i));
    profiler.step();
  }
  profiler.stop();  // Steps 1 and 2 recorded; step 3 never ran.
  EXPECT_EQ(profiler.traces_ready(), 1);
  EXPECT_EQ(profiler.key_averages().find("step_0"), nullptr);
  EXPECT_NE(profiler.key_averages().find("step_2"), nullptr);
}

TEST(ProfilerTest, StopWritesOneChromeTracePerProcess) {
  Training training;
  ProfileKwargs kwargs;
  kwargs.output_trace_dir = TraceDir("traces");
  {
    Profiler profiler(A(), kwargs);
    training.Step("train_step");
  }  // The destructor stops: every process's file is there after it.
  for (int rank = 0; rank < A().num_processes(); ++rank) {
    const std::string path =
        kwargs.output_trace_dir + "/profile_" + std::to_string(rank) + ".json";
    std::ifstream in(path);
    ASSERT_TRUE(in.good()) << path;
    const nlohmann::json trace = nlohmann::json::parse(in);
    std::set<std::string> names;
    for (const nlohmann::json& event : trace.at("traceEvents")) {
      EXPECT_EQ(event.at("pid").get<int>(), rank) << path;
      if (event.at("ph") == "M") {
        EXPECT_EQ(event.at("args").at("name"), "rank " + std::to_string(rank));
        continue;
      }
      EXPECT_EQ(event.at("ph"), "X");
      EXPECT_GE(event.at("dur").get<double>(), 0.0);
      names.insert(event.at("name").get<std::string>());
    }
    EXPECT_EQ(names.count("train_step"), 1u) << path;
    EXPECT_EQ(names.count("aten::addmm"), 1u) << path;
  }
  A().wait_for_everyone();  // Nobody removes what another still reads.
}

TEST(ProfilerTest, MisuseIsRefusedAndAnExceptionDropsTheTrace) {
  ProfileKwargs kwargs;
  kwargs.schedule_option = ProfileSchedule{/*wait=*/1, /*warmup=*/0,
                                           /*active=*/0};
  EXPECT_THROW(Profiler(A(), kwargs), UsageError);
  kwargs.schedule_option.reset();
  {
    Profiler first(A(), kwargs);
    EXPECT_THROW(Profiler(A(), kwargs), UsageError);  // One per thread.
  }
  // Leaving by an exception writes nothing and waits for no process.
  kwargs.output_trace_dir = TraceDir("dropped");
  try {
    Profiler profiler(A(), kwargs);
    throw std::runtime_error("the step failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(std::filesystem::exists(kwargs.output_trace_dir));
  // And the thread can profile again.
  kwargs.output_trace_dir.clear();
  Profiler again(A(), kwargs);
  torch::ones({2}).add(1);
  again.stop();
  EXPECT_NE(again.key_averages().find("aten::add"), nullptr);
}

}  // namespace
}  // namespace accel::testing
