// Data-parallel training throughput of accel against torch's
// DistributedDataParallel (Debian's python3-torch, over Gloo), with the same
// models, batches, optimizer (AdamW), BLAS and threads per rank, measured in
// the same run (a benchmark, not a test).
//
//   bazel run -c opt //tools/bench:ddp
//   bazel run -c opt //tools/bench:ddp -- --models=mlp --ranks=2
//       --accumulation=1 --repetitions=7   (one line)
//
// For each model, number of ranks and gradient_accumulation_steps, the
// benchmark starts accel's ranks (itself, with --num_processes) and
// torch_ddp.py's in turn, --repetitions times, alternating which goes
// first. Each run times, in interleaved rounds:
//   step_sync    one optimizer step: gradient_accumulation_steps micro-batches
//                (forward, backward), the gradient sync, AdamW, zero_grad
//   step_nosync  the same with the sync turned off (no communication)
//   sync_alone   the gradient sync alone: the gradient buckets allreduced
//                together (async, then waited) and averaged
//   optimizer    AdamW's step alone, inside the synced steps
// Each run reports the median of each; the tables show min/median/max over
// the runs. "hidden" is how much of the sync backward hides:
//   1 - (step_sync - step_nosync) / sync_alone
// (0 when the sync adds its full cost to the step, negative when running it
// beside backward costs more than running it alone).
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/optim/adamw.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "accel/accelerator.h"
#include "tools/bench/driver.h"

DEFINE_string(models, "mlp,conv", "Models to measure: mlp, conv.");
DEFINE_string(ranks, "1,2,4", "Numbers of ranks to measure.");
DEFINE_string(accumulation, "1,4",
              "gradient_accumulation_steps values to measure.");
DEFINE_int32(repetitions, 5,
             "Runs per configuration, each of accel and of torch.");
DEFINE_int32(warmup, 3, "Untimed steps at the start of each run.");
DEFINE_int32(steps, 5, "Timed steps per mode and round.");
DEFINE_int32(rounds, 2, "Rounds of the modes, taking turns, per run.");
DEFINE_int32(threads, 1,
             "Threads per rank (OMP_NUM_THREADS), for accel and torch alike.");
DEFINE_bool(baseline, true, "Also measure torch DDP (python3-torch).");
DEFINE_bool(torch_bucket_view, false,
            "Run torch DDP with gradient_as_bucket_view=True.");
DEFINE_string(python, "/usr/bin/python3",
              "Python with torch for the baseline.");
DEFINE_string(torch_script, "", "Path of torch_ddp.py (default: runfiles).");
DEFINE_bool(worker, false, "Internal: run one measurement as a rank.");
DEFINE_string(model, "mlp", "Internal: the model a worker measures.");

namespace {

using accel::bench::Median;
using accel::bench::Ms;
using accel::bench::ParseList;
using accel::bench::ParseNames;
using accel::bench::Plain;
using accel::bench::Ratio;
using accel::bench::Results;
using accel::bench::RunAndParse;
using accel::bench::SelfPath;
using accel::bench::Spread;
using Clock = std::chrono::steady_clock;

constexpr int64_t kBatch = 32;  // Per rank.
constexpr const char* kModes[] = {"step_sync", "step_nosync", "sync_alone"};

// --- A rank ---------------------------------------------------------------

// The models and batches of torch_ddp.py.
struct Workload {
  torch::nn::Sequential model;
  torch::Tensor inputs, labels;
};

Workload Build(const std::string& name) {
  torch::manual_seed(0);
  namespace nn = torch::nn;
  if (name == "mlp") {
    return {nn::Sequential(nn::Linear(1024, 4096), nn::ReLU(),
                           nn::Linear(4096, 4096), nn::ReLU(),
                           nn::Linear(4096, 1024)),
            torch::randn({kBatch, 1024}), torch::randint(0, 1024, {kBatch})};
  }
  if (name == "conv") {
    return {nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, 32, 3).padding(1)),
                           nn::ReLU(), nn::MaxPool2d(2),
                           nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)),
                           nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(),
                           nn::Linear(64 * 8 * 8, 256), nn::ReLU(),
                           nn::Linear(256, 10)),
            torch::randn({kBatch, 3, 32, 32}), torch::randint(0, 10, {kBatch})};
  }
  throw accel::UsageError("--model: expected mlp or conv, found " + name);
}

// Times this rank's steps; rank 0 prints the medians as JSON.
void MeasureRank() {
  accel::Accelerator accelerator(accel::AcceleratorOptions::FromFlags());
  Workload work = Build(FLAGS_model);
  torch::optim::AdamW adamw(work.model->parameters(),
                            torch::optim::AdamWOptions(1e-4));
  auto [model, optimizer] = accelerator.prepare(work.model, adamw);
  std::vector<double> optimizer_seconds;

  auto step = [&, &model = model, &optimizer = optimizer](bool sync) {
    accel::NoSyncScope off;
    if (!sync) off = accelerator.no_sync(model);
    for (int micro = 0; micro < accelerator.gradient_accumulation_steps();
         ++micro) {
      auto accumulate = accelerator.accumulate(model);
      accelerator.backward(torch::nn::functional::cross_entropy(
          model->forward(work.inputs), work.labels));
      const auto start = Clock::now();
      optimizer.step();
      if (accelerator.sync_gradients()) {
        optimizer_seconds.push_back(
            std::chrono::duration<double>(Clock::now() - start).count());
      }
      optimizer.zero_grad();
    }
  };
  for (int i = 0; i < FLAGS_warmup; ++i) step(true);

  // The sync alone: buffers the size of the model's gradient buckets.
  std::vector<torch::Tensor> buckets;
  for (const auto& members : accel::AssignBuckets(
           model->parameters(), accel::AcceleratorOptions().gradient_sync)) {
    int64_t numel = 0;
    for (size_t index : members) numel += model->parameters()[index].numel();
    buckets.push_back(torch::ones({numel}));
  }
  accel::Communicator& comm = accelerator.communicator();
  auto sync_alone = [&] {
    std::vector<std::shared_ptr<accel::Work>> works;
    for (auto& bucket : buckets) {
      works.push_back(comm.allreduce_async(
          bucket.data_ptr(), static_cast<size_t>(bucket.numel()),
          accel::DType::kFloat32, accel::ReduceOp::kSum));
    }
    for (size_t b = 0; b < buckets.size(); ++b) {
      works[b]->wait();
      buckets[b].div_(comm.size());
    }
  };

  std::map<std::string, std::vector<double>> samples;
  const std::map<std::string, std::function<void()>> actions = {
      {"step_sync", [&] { step(true); }},
      {"step_nosync", [&] { step(false); }},
      {"sync_alone", sync_alone}};
  // The modes take turns so that load from elsewhere falls on all alike.
  for (int round = 0; round < FLAGS_rounds; ++round) {
    for (const char* mode : kModes) {
      for (int i = 0; i < FLAGS_steps; ++i) {
        accelerator.wait_for_everyone();
        const auto start = Clock::now();
        actions.at(mode)();
        samples[mode].push_back(
            std::chrono::duration<double>(Clock::now() - start).count());
      }
    }
  }
  accelerator.wait_for_everyone();
  Results results;
  for (const auto& [mode, values] : samples) results[mode] = Median(values);
  results["optimizer"] = Median(optimizer_seconds);
  results["buckets"] = static_cast<double>(buckets.size());
  if (accelerator.is_main_process()) {
    std::printf("%s\n", nlohmann::json(results).dump().c_str());
  }
}

// --- The driver -----------------------------------------------------------

std::string ScriptPath() {
  if (!FLAGS_torch_script.empty()) return FLAGS_torch_script;
  return SelfPath() + ".runfiles/accel/tools/bench/torch_ddp.py";
}

struct Config {
  std::string model;
  int ranks;
  int accumulation;
};

Results RunAccel(const Config& c) {
  std::ostringstream command;
  command << SelfPath() << " --worker --model=" << c.model
          << " --num_processes=" << c.ranks
          << " --main_process_port=0 --backend=gloo"
          << " --gradient_accumulation_steps=" << c.accumulation
          << " --warmup=" << FLAGS_warmup << " --steps=" << FLAGS_steps
          << " --rounds=" << FLAGS_rounds;
  return RunAndParse("accel", command.str());
}

Results RunTorch(const Config& c) {
  std::ostringstream command;
  command << FLAGS_python << " " << ScriptPath() << " --model=" << c.model
          << " --world_size=" << c.ranks
          << " --gradient_accumulation_steps=" << c.accumulation
          << " --threads=" << FLAGS_threads << " --warmup=" << FLAGS_warmup
          << " --steps=" << FLAGS_steps << " --rounds=" << FLAGS_rounds
          << " --gradient_as_bucket_view=" << (FLAGS_torch_bucket_view ? 1 : 0);
  return RunAndParse("torch DDP", command.str());
}

// What the tables show for one configuration and one side.
struct Figures {
  Spread step, nosync, alone, optimizer, samples_per_s, hidden;
  int buckets = 0;
};

Figures Summarize(const std::vector<Results>& runs, const Config& c) {
  Figures f;
  for (const Results& r : runs) {
    if (!r.count("step_sync")) continue;
    f.step.values.push_back(r.at("step_sync"));
    f.nosync.values.push_back(r.at("step_nosync"));
    f.alone.values.push_back(r.at("sync_alone"));
    f.optimizer.values.push_back(r.at("optimizer"));
    f.samples_per_s.values.push_back(kBatch * c.ranks * c.accumulation /
                                     r.at("step_sync"));
    if (c.ranks > 1) {
      f.hidden.values.push_back(1 - (r.at("step_sync") - r.at("step_nosync")) /
                                        r.at("sync_alone"));
    }
    f.buckets = static_cast<int>(r.at("buckets"));
  }
  return f;
}

void PrintConfig(const Config& c, const Figures& ours, const Figures& torch,
                 const Figures* ours_one_rank, const Figures* torch_one_rank) {
  std::printf(
      "\n%s, %d rank%s, gradient_accumulation_steps=%d, batch %ld per rank "
      "(accel %d gradient buckets, torch DDP %d)\n",
      c.model.c_str(), c.ranks, c.ranks > 1 ? "s" : "", c.accumulation,
      static_cast<long>(kBatch), ours.buckets, torch.buckets);
  std::printf("%-30s %24s %24s %18s\n", "min/median/max", "accel", "torch DDP",
              "accel/torch");
  auto row = [](const char* label, const std::string& a, const std::string& b,
                const std::string& ratio) {
    std::printf("%-30s %24s %24s %18s\n", label, a.c_str(), b.c_str(),
                ratio.c_str());
  };
  row("step, ms", Ms(ours.step), Ms(torch.step), Ratio(ours.step, torch.step));
  row("samples/s", Plain(ours.samples_per_s, "%.0f"),
      Plain(torch.samples_per_s, "%.0f"),
      Ratio(ours.samples_per_s, torch.samples_per_s));
  if (c.ranks > 1) {
    row("step without sync, ms", Ms(ours.nosync), Ms(torch.nosync),
        Ratio(ours.nosync, torch.nosync));
    row("sync alone, ms", Ms(ours.alone), Ms(torch.alone),
        Ratio(ours.alone, torch.alone));
    row("sync hidden (fraction)", Plain(ours.hidden, "%.2f"),
        Plain(torch.hidden, "%.2f"), "");
  }
  row("AdamW step, ms", Ms(ours.optimizer), Ms(torch.optimizer),
      Ratio(ours.optimizer, torch.optimizer));
  if (ours_one_rank != nullptr && c.ranks > 1) {
    auto efficiency = [&](const Figures& f, const Figures& one) {
      if (f.samples_per_s.empty() || one.samples_per_s.empty()) {
        return std::string("n/a");
      }
      Spread e;
      for (double v : f.samples_per_s.values) {
        e.values.push_back(v / (c.ranks * one.samples_per_s.median()));
      }
      return Plain(e, "%.2f");
    };
    row("scaling efficiency", efficiency(ours, *ours_one_rank),
        efficiency(torch, *torch_one_rank), "");
  }
}

int Drive() {
  setenv("OMP_NUM_THREADS", std::to_string(FLAGS_threads).c_str(), 1);
  std::printf(
      "Data-parallel training step, accel vs torch DDP (python3-torch %s), "
      "%ld cores, %d thread(s) per rank, AdamW, %d runs each\n",
      "1.13", sysconf(_SC_NPROCESSORS_ONLN), FLAGS_threads, FLAGS_repetitions);
  std::fflush(stdout);
  for (const std::string& model : ParseNames(FLAGS_models)) {
    for (int accumulation : ParseList(FLAGS_accumulation)) {
      std::map<int, std::pair<Figures, Figures>> by_ranks;
      for (int ranks : ParseList(FLAGS_ranks)) {
        const Config c{model, ranks, accumulation};
        std::vector<Results> ours, theirs;
        for (int rep = 0; rep < FLAGS_repetitions; ++rep) {
          // Alternate which side goes first.
          if (rep % 2 == 1 && FLAGS_baseline) theirs.push_back(RunTorch(c));
          ours.push_back(RunAccel(c));
          if (rep % 2 == 0 && FLAGS_baseline) theirs.push_back(RunTorch(c));
        }
        const Figures f_ours = Summarize(ours, c);
        const Figures f_torch = Summarize(theirs, c);
        by_ranks[ranks] = {f_ours, f_torch};
        const auto one = by_ranks.find(1);
        PrintConfig(c, f_ours, f_torch,
                    one == by_ranks.end() ? nullptr : &one->second.first,
                    one == by_ranks.end() ? nullptr : &one->second.second);
        std::fflush(stdout);
      }
    }
  }
  std::printf(
      "\naccel/torch: accel's figure over torch's, per pair of runs (step: "
      "below 1 means accel is faster; samples/s: above 1)\n"
      "sync hidden: 1 - (step - step without sync) / sync alone\n"
      "scaling efficiency: samples/s over (ranks x the 1-rank median)\n");
  return 0;
}

int Main(int argc, char** argv) {
  if (!FLAGS_worker) return Drive();
  MeasureRank();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
