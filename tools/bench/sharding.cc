// Model-state memory and step time of ZeRO stages 1-3 against DDP
// (stage 0), measured in the same run (a benchmark, not a test).
//
//   bazel run -c opt //tools/bench:sharding
//   bazel run -c opt //tools/bench:sharding -- --models=mlp --ranks=2
//       --repetitions=3   (one line)
//
// Models: "mlp", 25.2M parameters (24 layers 1024x1024 and a head), and
// "transformer", --transformer_layers nn::TransformerEncoderLayer(d_model
// 256, 4 heads, feed-forward 1024) and a head (24 layers: 18.9M
// parameters; 8: 6.3M); both are Sequentials,
// so that under stage 3 each layer is a unit; fp32 AdamW, batch 8 per
// rank. For each model, number of ranks and repetition, the stages run in
// turn (the order alternating), each as its own job of --num_processes
// ranks. Each rank counts every byte LibTorch allocates on the CPU through
// accel::HostMemoryTracker, an allocator installed with
// c10::SetCPUAllocator (RSS says nothing here:
// freed memory is kept for reuse), and reports the peak over the timed
// steps, which start after warm-up steps have made AdamW's state: the
// peak holds the parameters, gradients, optimizer state, the reduction's
// buckets, AdamW's temporaries and the activations (which no ZeRO stage
// shards); "state" is what a rank holds between steps, the model state
// itself; "model peak" is the peak less the activations (what a forward
// left alive for backward, measured each step: the model state at its
// peak, which the targets are about). The tables show the largest
// rank's state and peak, the median step time, min/median/max over the
// repetitions, and each stage over DDP with the target. The bytes a
// rank sends per step are computed, for bandwidth-optimal collectives over B
// bytes of gradients: allreduce 2(N-1)/N B, reduce-scatter and all-gather
// (N-1)/N B (stage 3 all-gathers each unit twice, before forward and backward).
// At 2 ranks torch's ZeroRedundancyOptimizer (stage 1) and DDP run beside
// them (tools/bench/torch_zero.py, python3-torch over Gloo; torch's FSDP
// needs CUDA) on the same model; their state is counted over the tensors
// (parameters, gradients, optimizer state), Python having no allocator
// counter to install.
// With --tp_size=T the gpt also runs at each stage 1-3 with tensor
// parallelism over T ranks and ZeRO over the other ranks / T (a mesh of
// tp T x dp_shard ranks/T; examples::ParallelizeGpt splits every block's
// four projections, the embeddings and LayerNorms stay whole), and a table
// shows its model state per parameter of the whole model against the
// bytes expected of the split parameters: 8/T + 8/(T D) at stage 1,
// 4/T + 12/(T D) at stage 2, 16/(T D) at stage 3 (D = ranks / T).
#include <stdlib.h>
#include <sys/stat.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/transformerlayer.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "accel/accelerator.h"
#include "accel/memory/host_memory_tracker.h"
#include "examples/gpt_model.h"
#include "tools/bench/driver.h"

DEFINE_string(models, "mlp,transformer,gpt", "Models: mlp, transformer, gpt.");
// Stage 3 holds, beside its 16/N bytes per parameter, two units'
// parameters and one unit's gradients (12/L bytes per parameter for L
// equal units): at 8 layers that alone is 0.09 of DDP's state.
DEFINE_int32(transformer_layers, 24,
             "Encoder layers of the transformer (one stage-3 unit each).");
DEFINE_string(ranks, "2,4", "Numbers of ranks.");
DEFINE_string(stages, "0,1,2,3", "ZeRO stages (0 is DDP).");
DEFINE_int32(repetitions, 3, "Runs per model, ranks and stage.");
DEFINE_int32(warmup, 2, "Untimed steps first (they make AdamW's state).");
DEFINE_int32(steps, 5, "Timed steps per run.");
DEFINE_bool(torch_baseline, true,
            "At 2 ranks, also torch's ZeroRedundancyOptimizer and DDP.");
DEFINE_string(python, "/usr/bin/python3", "The Python that has torch.");
DEFINE_string(torch_script, "",
              "tools/bench/torch_zero.py (default: from the runfiles).");
DEFINE_bool(checkpoint, true,
            "Also time save_state and load_state after the steps, and count "
            "the peak during each.");
DEFINE_string(checkpoint_dir, "",
              "Where the ranks save (default: a folder under /tmp, removed "
              "after).");
DEFINE_bool(with_activation_checkpointing, false,
            "Also run the gpt at every stage with each block's activations "
            "recomputed in backward (accel::fully_shard's "
            "activation_checkpointing), and compare the activations kept.");
DEFINE_int32(tp_size, 1,
             "With --models=gpt, also run stages 1-3 at tp_size x "
             "(ranks / tp_size) dp_shard, tensor-parallel (1: no).");
DEFINE_bool(worker, false, "Internal: run one measurement as a rank.");
DEFINE_bool(activation_checkpointing, false,
            "Internal: the worker's gpt recomputes its blocks' activations.");
DEFINE_string(model, "mlp", "Internal: the model a worker measures.");

namespace {

using accel::bench::Spread;
using Clock = std::chrono::steady_clock;

constexpr int64_t kBatch = 8;

// The classifier over the mean of the sequence ([sequence, batch, 256]).
class MeanHeadImpl : public torch::nn::Module {
 public:
  MeanHeadImpl() {
    linear_ = register_module("linear", torch::nn::Linear(256, 16));
  }
  torch::Tensor forward(torch::Tensor x) { return linear_->forward(x.mean(0)); }

 private:
  torch::nn::Linear linear_{nullptr};
};
TORCH_MODULE(MeanHead);

torch::nn::Sequential Transformer() {
  torch::nn::Sequential net;
  for (int i = 0; i < FLAGS_transformer_layers; ++i) {
    net->push_back(torch::nn::TransformerEncoderLayer(
        torch::nn::TransformerEncoderLayerOptions(256, 4)
            .dim_feedforward(1024)
            .dropout(0.0)));
  }
  net->push_back(MeanHead());
  return net;
}

int64_t Parameters(const torch::nn::Module& module) {
  int64_t total = 0;
  for (const auto& p : module.parameters()) total += p.numel();
  return total;
}

// --- A rank ---------------------------------------------------------------

// The GPT of examples/gpt_model.h: a ModuleList of blocks with a
// hand-written forward (each block a stage-3 unit through accel::forward),
// --transformer_layers blocks of width 256, sequences of 64 tokens.
examples::GptConfig GptConfig() {
  examples::GptConfig config;
  config.vocab_size = 1024;
  config.block_size = 64;
  config.n_layer = FLAGS_transformer_layers;
  config.n_head = 4;
  config.n_embd = 256;
  config.dropout = 0.0;
  config.activation_checkpointing = FLAGS_activation_checkpointing;
  return config;
}

template <typename Model>
torch::Tensor LossOf(Model& model, const torch::Tensor& inputs,
                     const torch::Tensor& labels) {
  if constexpr (std::is_same_v<std::decay_t<decltype(*model)>,
                               examples::GptImpl>) {
    // Next-token prediction over the sequence itself.
    const int64_t length = inputs.size(1) - 1;
    return examples::LanguageModelLoss(
        model->forward(inputs.narrow(1, 0, length),
                       examples::CausalMask(length)),
        inputs.narrow(1, 1, length));
  } else {
    return torch::nn::functional::cross_entropy(model->forward(inputs), labels);
  }
}

// save_state and load_state after the steps: each one's time (wall, and
// this process's CPU time, which oversubscribed ranks do not inflate) and
// the peak of held bytes during it, and the bytes of this rank's own files.
struct Checkpointing {
  double save_s = 0, load_s = 0, save_peak = 0, load_peak = 0, rank_bytes = 0;
  double save_cpu_s = 0, load_cpu_s = 0;
};

double ProcessCpuSeconds() {
  timespec now;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + now.tv_nsec / 1e9;
}

Checkpointing MeasureCheckpoint(accel::Accelerator& accelerator,
                                accel::HostMemoryTracker& counter) {
  Checkpointing c;
  if (!FLAGS_checkpoint) return c;
  const std::string dir = FLAGS_checkpoint_dir + "/checkpoint";
  const auto timed = [&](const std::function<void()>& work, double* seconds,
                         double* cpu_seconds, double* peak) {
    accelerator.wait_for_everyone();
    counter.ResetPeak();
    const auto start = Clock::now();
    const double cpu_start = ProcessCpuSeconds();
    work();
    *cpu_seconds = ProcessCpuSeconds() - cpu_start;
    *seconds = std::chrono::duration<double>(Clock::now() - start).count();
    *peak = static_cast<double>(counter.peak_bytes());
  };
  timed([&] { accelerator.save_state(dir); }, &c.save_s, &c.save_cpu_s,
        &c.save_peak);
  timed([&] { accelerator.load_state(dir); }, &c.load_s, &c.load_cpu_s,
        &c.load_peak);
  const int rank = accelerator.process_index();
  for (const std::string& name :
       {accel::ShardFileName(rank, accelerator.num_processes()),
        accel::RandomStatesFile(rank)}) {
    struct stat info;
    if (stat((dir + "/" + name).c_str(), &info) == 0) {
      c.rank_bytes += static_cast<double>(info.st_size);
    }
  }
  return c;
}

void MeasureRank(accel::HostMemoryTracker& counter) {
  accel::Accelerator accelerator(accel::AcceleratorOptions::FromFlags());
  torch::manual_seed(0);
  namespace nn = torch::nn;
  std::unique_ptr<torch::optim::AdamW> owned;
  int64_t parameters = 0;
  double activations = 0;  // The most a forward left alive for backward.
  auto train = [&](auto net, torch::Tensor inputs) {
    const torch::Tensor labels = torch::randint(0, 16, {kBatch});
    owned = std::make_unique<torch::optim::AdamW>(
        net->parameters(), torch::optim::AdamWOptions(1e-4));
    parameters = Parameters(*net);
    auto [model, optimizer] = accelerator.prepare(net, *owned);
    auto step = [&accelerator, &counter, &activations, model = model,
                 optimizer = optimizer, inputs, labels]() mutable {
      const double before = static_cast<double>(counter.held_bytes());
      torch::Tensor loss = LossOf(model, inputs, labels);
      // Activations and autograd's saved tensors: no stage shards them
      // (stage 3 has freed every unit's parameters by now).
      activations = std::max(
          activations, static_cast<double>(counter.held_bytes()) - before);
      accelerator.backward(loss);
      optimizer.step();
      optimizer.zero_grad();
    };
    for (int i = 0; i < FLAGS_warmup; ++i) step();
    counter.ResetPeak();
    std::vector<double> seconds;
    for (int i = 0; i < FLAGS_steps; ++i) {
      accelerator.wait_for_everyone();
      const auto start = Clock::now();
      step();
      seconds.push_back(
          std::chrono::duration<double>(Clock::now() - start).count());
    }
    return accel::bench::Median(seconds);
  };
  double step_s = 0;
  if (FLAGS_model == "mlp") {
    nn::Sequential net;
    for (int i = 0; i < 24; ++i) {
      net->push_back(nn::Linear(1024, 1024));
      net->push_back(nn::ReLU());
    }
    net->push_back(nn::Linear(1024, 16));
    step_s = train(net, torch::randn({kBatch, 1024}));
  } else if (FLAGS_model == "transformer") {
    step_s = train(Transformer(), torch::randn({32, kBatch, 256}));
  } else if (FLAGS_model == "gpt") {
    examples::Gpt gpt(GptConfig());
    const int64_t whole = gpt->parameter_count();
    if (FLAGS_tp_size > 1) {
      examples::ParallelizeGpt(*gpt,
                               accelerator.torch_device_mesh()->group("tp"));
    }
    step_s = train(gpt, torch::randint(0, 1024, {kBatch, 64}));
    parameters = whole;  // Per parameter of the whole model.
  } else {
    throw accel::UsageError(
        "--model: expected mlp, transformer or gpt, found " + FLAGS_model);
  }
  const double step_peak = static_cast<double>(counter.peak_bytes());
  const double step_state = static_cast<double>(counter.held_bytes());
  const Checkpointing saved = MeasureCheckpoint(accelerator, counter);
  // The peak over the timed steps, and what stays between steps (the
  // model state itself), of the largest rank.
  // The step's figures come before the checkpoint's (held bytes included).
  double bytes[10] = {step_peak,       step_state,       activations,
                      saved.save_s,    saved.load_s,     saved.save_peak,
                      saved.load_peak, saved.rank_bytes, saved.save_cpu_s,
                      saved.load_cpu_s};
  accelerator.communicator().allreduce(bytes, 10, accel::DType::kFloat64,
                                       accel::ReduceOp::kMax);
  if (accelerator.is_main_process()) {
    nlohmann::json results = {{"step_s", step_s},
                              {"peak_bytes", bytes[0]},
                              {"state_bytes", bytes[1]},
                              {"activation_bytes", bytes[2]},
                              {"save_s", bytes[3]},
                              {"load_s", bytes[4]},
                              {"save_peak_bytes", bytes[5]},
                              {"load_peak_bytes", bytes[6]},
                              {"rank_file_bytes", bytes[7]},
                              {"save_cpu_s", bytes[8]},
                              {"load_cpu_s", bytes[9]},
                              {"parameters", static_cast<double>(parameters)}};
    std::printf("%s\n", results.dump().c_str());
  }
}

// --- The driver -----------------------------------------------------------

struct Cell {
  // model_peak_mb: the peak less the activations (model state at its peak).
  Spread peak_mb, model_peak_mb, state_mb, step_s, activation_mb;
  // save_state and load_state: time, the peak during each, a rank's files.
  Spread save_s, load_s, save_peak_mb, load_peak_mb, rank_file_mb;
  Spread save_cpu_s, load_cpu_s;  // This process's CPU time.
  double parameters = 0;
};

double Target(int stage, int ranks, bool memory) {
  if (!memory) return ranks != 2 || stage == 0 ? 0 : stage == 3 ? 1.3 : 1.0;
  if (stage == 1) return ranks == 2 ? 0.78 : ranks == 4 ? 0.65 : 0;
  if (stage == 2) return ranks == 2 ? 0.65 : ranks == 4 ? 0.47 : 0;
  if (stage == 3) return ranks == 2 ? 0.55 : ranks == 4 ? 0.30 : 0;
  return 0;
}

std::string Verdict(const Spread& ours, const Spread& ddp, double target) {
  if (target == 0 || ours.empty() || ddp.empty()) return "";
  const double ratio = ours.median() / ddp.median();
  char text[48];
  std::snprintf(text, sizeof(text), "<= %.2f %s", target,
                ratio <= target ? "met" : "MISSED");
  return text;
}

// MB each rank sends per step for B bytes of fp32 gradients (see above).
double SentMb(int stage, int ranks, double parameters) {
  const double bytes = parameters * 4;
  const double share = (ranks - 1.0) / ranks * bytes;
  const double sent = stage == 1 || stage == 3 ? 3 * share : 2 * share;
  return sent / 1e6;
}

std::string LayersNote(const std::string& model) {
  if (model != "transformer") return "";
  return " of " + std::to_string(FLAGS_transformer_layers) + " layers";
}

void PrintTable(const std::string& model, int ranks,
                std::map<int, Cell>& cells) {
  const Cell& ddp = cells[0];
  std::printf(
      "\n%s%s (%.1fM parameters, fp32 AdamW, batch %ld per rank), %d ranks%s; "
      "min/median/max over %d runs\n",
      model.c_str(), LayersNote(model).c_str(), ddp.parameters / 1e6,
      static_cast<long>(kBatch), ranks,
      ranks > 2 ? " (oversubscribed on 2 cores: time not a target)" : "",
      static_cast<int>(ddp.peak_mb.values.size()));
  std::printf(
      "%-8s %12s %15s %-11s %12s %15s %-11s %10s %15s %18s %15s %-11s %7s\n",
      "stage", "state MB", "x DDP", "target", "model peak", "x DDP", "target",
      "peak MB", "x DDP", "step ms", "x DDP", "target", "sent MB");
  const auto memory = [&](const Spread& ours, const Spread& theirs, int stage) {
    return Verdict(ours, theirs, Target(stage, ranks, true));
  };
  for (auto& [stage, cell] : cells) {
    std::printf(
        "%-8s %12s %15s %-11s %12s %15s %-11s %10s %15s %18s %15s %-11s "
        "%7.1f\n",
        stage == 0 ? "0 (DDP)" : std::to_string(stage).c_str(),
        accel::bench::Plain(cell.state_mb, "%.0f").c_str(),
        accel::bench::Ratio(cell.state_mb, ddp.state_mb).c_str(),
        memory(cell.state_mb, ddp.state_mb, stage).c_str(),
        accel::bench::Plain(cell.model_peak_mb, "%.0f").c_str(),
        accel::bench::Ratio(cell.model_peak_mb, ddp.model_peak_mb).c_str(),
        memory(cell.model_peak_mb, ddp.model_peak_mb, stage).c_str(),
        accel::bench::Plain(cell.peak_mb, "%.0f").c_str(),
        accel::bench::Ratio(cell.peak_mb, ddp.peak_mb).c_str(),
        accel::bench::Ms(cell.step_s).c_str(),
        accel::bench::Ratio(cell.step_s, ddp.step_s).c_str(),
        Verdict(cell.step_s, ddp.step_s, Target(stage, ranks, false)).c_str(),
        SentMb(stage, ranks, cell.parameters));
  }
}

// What stage 3 may hold during save_state and load_state: its 16/N bytes
// per parameter between steps plus one unit whole (12/L; L units), the
// issue's bound before the file buffers.
double CheckpointBoundMb(int ranks, double parameters, int units) {
  return parameters * (16.0 / ranks + 12.0 / units) / 1e6;
}

void PrintCheckpointTable(int ranks, std::map<int, Cell>& cells, int units) {
  if (!FLAGS_checkpoint) return;
  std::printf(
      "save_state / load_state after the steps, largest rank: its own files, "
      "time (wall, and the process's CPU time), and the peak of held bytes "
      "during each (stage 3 bound: 16/%d + 12/%d bytes a parameter)\n",
      ranks, units);
  std::printf("%-8s %14s %16s %16s %16s %16s %16s %16s %12s\n", "stage",
              "rank files MB", "save ms", "save cpu ms", "load ms",
              "load cpu ms", "save peak MB", "load peak MB", "bound MB");
  for (auto& [stage, cell] : cells) {
    char bound[32] = "";
    if (stage == 3) {
      std::snprintf(bound, sizeof(bound), "%.0f",
                    CheckpointBoundMb(ranks, cell.parameters, units));
    }
    std::printf("%-8s %14s %16s %16s %16s %16s %16s %16s %12s\n",
                stage == 0 ? "0 (DDP)" : std::to_string(stage).c_str(),
                accel::bench::Plain(cell.rank_file_mb, "%.1f").c_str(),
                accel::bench::Ms(cell.save_s).c_str(),
                accel::bench::Ms(cell.save_cpu_s).c_str(),
                accel::bench::Ms(cell.load_s).c_str(),
                accel::bench::Ms(cell.load_cpu_s).c_str(),
                accel::bench::Plain(cell.save_peak_mb, "%.0f").c_str(),
                accel::bench::Plain(cell.load_peak_mb, "%.0f").c_str(), bound);
  }
}

// torch's figures at 2 ranks: "ddp" and "zero1" (ZeroRedundancyOptimizer).
using TorchCells = std::map<std::string, Cell>;

void MeasureTorch(const std::string& model, TorchCells& cells) {
  const std::string script =
      FLAGS_torch_script.empty()
          ? accel::bench::SelfPath() +
                ".runfiles/accel/tools/bench/torch_zero.py"
          : FLAGS_torch_script;
  for (const char* mode : {"ddp", "zero1"}) {
    std::ostringstream command;
    command << FLAGS_python << " " << script
            << " --world_size=2 --model=" << model << " --mode=" << mode
            << " --transformer_layers=" << FLAGS_transformer_layers
            << " --warmup=" << FLAGS_warmup << " --steps=" << FLAGS_steps;
    const accel::bench::Results r =
        accel::bench::RunAndParse(std::string("torch ") + mode, command.str());
    if (!r.count("step_s")) continue;
    cells[mode].state_mb.values.push_back(r.at("state_bytes") / 1e6);
    cells[mode].step_s.values.push_back(r.at("step_s"));
  }
}

void PrintTorchTable(std::map<int, Cell>& ours, TorchCells& torch) {
  if (!torch.count("ddp") || !torch.count("zero1")) {
    std::printf("torch baseline: no figures (see above)\n");
    return;
  }
  std::printf(
      "beside it, torch 1.13 (python3-torch, Gloo), 2 ranks, the same "
      "model; min/median/max over %d runs\n",
      static_cast<int>(torch["ddp"].step_s.values.size()));
  std::printf("%-26s %14s %16s %20s %16s\n", "", "state MB", "x its DDP",
              "step ms", "x its DDP");
  const auto row = [](const char* name, const Cell& cell, const Cell& ddp) {
    std::printf("%-26s %14s %16s %20s %16s\n", name,
                accel::bench::Plain(cell.state_mb, "%.0f").c_str(),
                accel::bench::Ratio(cell.state_mb, ddp.state_mb).c_str(),
                accel::bench::Ms(cell.step_s).c_str(),
                accel::bench::Ratio(cell.step_s, ddp.step_s).c_str());
  };
  row("torch DDP", torch["ddp"], torch["ddp"]);
  row("torch ZeroRedundancyOpt.", torch["zero1"], torch["ddp"]);
  if (ours.count(1)) {
    row("accel stage 1", ours[1], ours[0]);
    std::printf(
        "accel stage 1 step / torch ZeroRedundancyOptimizer step: %s\n",
        accel::bench::Ratio(ours[1].step_s, torch["zero1"].step_s).c_str());
  }
}

// One job of `ranks` workers at `stage` (tensor-parallel over `tp` of
// them); its figures join cells[stage].
void MeasureStage(const std::string& model, int ranks, int stage,
                  bool recompute, std::map<int, Cell>& cells, int tp = 1) {
  char folder[] = "/tmp/accel_bench_sharding_XXXXXX";
  const std::string dir =
      mkdtemp(folder) != nullptr ? folder : "/tmp/accel_bench_sharding";
  std::ostringstream command;
  command << accel::bench::SelfPath() << " --worker --model=" << model
          << " --num_processes=" << ranks
          << " --transformer_layers=" << FLAGS_transformer_layers
          << " --main_process_port=0 --backend=gloo --zero_stage=" << stage
          << " --warmup=" << FLAGS_warmup << " --steps=" << FLAGS_steps
          << " --checkpoint="
          << (FLAGS_checkpoint && tp == 1 ? "true" : "false")
          << " --checkpoint_dir=" << dir
          << " --activation_checkpointing=" << (recompute ? "true" : "false");
  if (tp > 1) {
    command << " --tp_size=" << tp << " --parallelism_config_tp_size=" << tp
            << " --parallelism_config_dp_shard_size=" << ranks / tp;
  }
  const accel::bench::Results r = accel::bench::RunAndParse(
      "stage " + std::to_string(stage) + (recompute ? " recomputing" : "") +
          (tp > 1 ? " tp " + std::to_string(tp) : ""),
      command.str());
  std::system(("rm -rf " + dir).c_str());
  if (!r.count("step_s")) return;
  Cell& cell = cells[stage];
  cell.peak_mb.values.push_back(r.at("peak_bytes") / 1e6);
  cell.activation_mb.values.push_back(r.at("activation_bytes") / 1e6);
  cell.model_peak_mb.values.push_back(
      (r.at("peak_bytes") - r.at("activation_bytes")) / 1e6);
  cell.state_mb.values.push_back(r.at("state_bytes") / 1e6);
  cell.step_s.values.push_back(r.at("step_s"));
  cell.parameters = r.at("parameters");
  if (FLAGS_checkpoint && tp == 1) {
    cell.save_s.values.push_back(r.at("save_s"));
    cell.load_s.values.push_back(r.at("load_s"));
    cell.save_peak_mb.values.push_back(r.at("save_peak_bytes") / 1e6);
    cell.load_peak_mb.values.push_back(r.at("load_peak_bytes") / 1e6);
    cell.rank_file_mb.values.push_back(r.at("rank_file_bytes") / 1e6);
    cell.save_cpu_s.values.push_back(r.at("save_cpu_s"));
    cell.load_cpu_s.values.push_back(r.at("load_cpu_s"));
  }
}

// What the blocks' recompute saves: the activations a forward leaves alive
// for backward (issue 42's target: at most 0.25x), and the step time it
// costs, at each stage.
void PrintRecomputeTable(std::map<int, Cell>& kept,
                         std::map<int, Cell>& recomputed) {
  if (recomputed.empty()) return;
  std::printf(
      "activation checkpointing (every block recomputed in backward), "
      "largest rank: activations kept for backward, and step time\n");
  std::printf("%-8s %16s %16s %15s %-11s %18s %18s %15s\n", "stage", "kept MB",
              "recomputed MB", "ratio", "target", "step ms", "recomputed ms",
              "ratio");
  for (auto& [stage, cell] : recomputed) {
    const Cell& without = kept[stage];
    std::printf(
        "%-8s %16s %16s %15s %-11s %18s %18s %15s\n",
        stage == 0 ? "0 (DDP)" : std::to_string(stage).c_str(),
        accel::bench::Plain(without.activation_mb, "%.1f").c_str(),
        accel::bench::Plain(cell.activation_mb, "%.1f").c_str(),
        accel::bench::Ratio(cell.activation_mb, without.activation_mb).c_str(),
        Verdict(cell.activation_mb, without.activation_mb, 0.25).c_str(),
        accel::bench::Ms(without.step_s).c_str(),
        accel::bench::Ms(cell.step_s).c_str(),
        accel::bench::Ratio(cell.step_s, without.step_s).c_str());
  }
}

// Bytes of model state per parameter that fp32 AdamW's split parameters
// should cost at `stage` over tp x dp_shard ranks: parameters (4),
// gradients (4) and optimizer state (8), each divided by the ranks that
// split or shard it.
double ExpectedBytesPerParameter(int stage, int tp, int dp_shard) {
  const double split = tp, all = tp * dp_shard;
  if (stage == 1) return 8 / split + 8 / all;
  if (stage == 2) return 4 / split + 12 / all;
  return 16 / all;
}

void PrintTensorParallelTable(int ranks, int tp, std::map<int, Cell>& ddp,
                              std::map<int, Cell>& cells) {
  if (cells.empty() || !ddp.count(0)) return;
  std::printf(
      "\ngpt at tp %d x dp_shard %d (every block's projections split over "
      "tp; ZeRO over dp_shard), largest rank; bytes per parameter of the "
      "whole model (%.1fM); min/median/max over %d runs\n",
      tp, ranks / tp, cells.begin()->second.parameters / 1e6,
      static_cast<int>(cells.begin()->second.state_mb.values.size()));
  std::printf("%-8s %12s %18s %12s %15s %18s %15s\n", "stage", "state MB",
              "bytes/parameter", "expected", "x DDP", "step ms", "x DDP");
  for (auto& [stage, cell] : cells) {
    Spread per_parameter;
    for (double mb : cell.state_mb.values) {
      per_parameter.values.push_back(mb * 1e6 / cell.parameters);
    }
    std::printf("%-8d %12s %18s %12.2f %15s %18s %15s\n", stage,
                accel::bench::Plain(cell.state_mb, "%.0f").c_str(),
                accel::bench::Plain(per_parameter, "%.2f").c_str(),
                ExpectedBytesPerParameter(stage, tp, ranks / tp),
                accel::bench::Ratio(cell.state_mb, ddp[0].state_mb).c_str(),
                accel::bench::Ms(cell.step_s).c_str(),
                accel::bench::Ratio(cell.step_s, ddp[0].step_s).c_str());
  }
}

// UsageError naming `flag` unless --models is gpt alone (`why`).
void RequireGptOnly(const char* flag, const char* why) {
  if (accel::bench::ParseNames(FLAGS_models) ==
      std::vector<std::string>{"gpt"}) {
    return;
  }
  throw accel::UsageError(std::string(flag) + " needs --models=gpt (" + why +
                          "); found --models=" + FLAGS_models);
}

int Main(int, char**) {
  if (FLAGS_with_activation_checkpointing) {
    RequireGptOnly("--with_activation_checkpointing",
                   "its blocks go through accel::forward at every stage");
  }
  if (FLAGS_tp_size > 1 && !FLAGS_worker) {
    RequireGptOnly("--tp_size",
                   "its blocks are what examples::ParallelizeGpt splits");
  }
  if (FLAGS_worker) {
    MeasureRank(accel::HostMemoryTracker::Install());
    return 0;
  }
  const std::vector<int> stages = accel::bench::ParseList(FLAGS_stages);
  for (const std::string& model : accel::bench::ParseNames(FLAGS_models)) {
    for (int ranks : accel::bench::ParseList(FLAGS_ranks)) {
      std::map<int, Cell> cells, recomputed, split;
      const int tp = FLAGS_tp_size;
      if (tp < 1) {
        throw accel::UsageError(
            "--tp_size must be at least 1 (1: no tensor "
            "parallelism), found " +
            std::to_string(tp));
      }
      if (tp > 1 && ranks % tp != 0) {
        throw accel::UsageError("--tp_size " + std::to_string(tp) +
                                " does not divide " + std::to_string(ranks) +
                                " ranks (--ranks)");
      }
      TorchCells torch;
      const bool with_torch = FLAGS_torch_baseline && ranks == 2;
      for (int rep = 0; rep < FLAGS_repetitions; ++rep) {
        if (with_torch) MeasureTorch(model, torch);
        std::vector<int> order = stages;
        if (rep % 2 == 1) std::reverse(order.begin(), order.end());
        for (int stage : order) {
          MeasureStage(model, ranks, stage, false, cells);
          if (FLAGS_with_activation_checkpointing) {
            MeasureStage(model, ranks, stage, true, recomputed);
          }
          if (tp > 1 && stage > 0) {
            MeasureStage(model, ranks, stage, false, split, tp);
          }
        }
      }
      if (!cells.count(0)) {
        std::printf("\n%s, %d ranks: DDP gave no figures\n", model.c_str(),
                    ranks);
        continue;
      }
      PrintTable(model, ranks, cells);
      // Units: the layers, and for the MLP its 25 Linears.
      PrintCheckpointTable(ranks, cells,
                           model == "mlp" ? 25 : FLAGS_transformer_layers);
      if (with_torch) PrintTorchTable(cells, torch);
      PrintRecomputeTable(cells, recomputed);
      PrintTensorParallelTable(ranks, tp, cells, split);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
