// N-D parallelism through the Accelerator (AcceleratorOptions::
// parallelism_config, accel/runtime/comm/device_mesh.h) at 4 processes:
// hybrid sharding (dp_replicate 2 x dp_shard 2) against DDP at ZeRO stages
// 1-3, what each rank keeps, the mesh's coordinates and data-parallel
// collectives, loaders that give the ranks of a tp group the same batches,
// checkpoints written at one mesh and resumed at another, and the errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "accel/accelerator.h"
#include "accel/checkpoint/checkpoint.h"
#include "accel/core/tensor_ops.h"
#include "accel/core/tensor_split.h"
#include "examples/gpt_model.h"
#include "tests/multiprocess_main.h"
#include "tests/usage_error.h"
#include "tests/zero_training.h"

namespace accel::testing {
namespace {

using ::testing::HasSubstr;

ParallelismConfig Mesh(int dp_replicate, int dp_shard, int tp = 1, int cp = 1) {
  ParallelismConfig config;
  config.dp_replicate_size = dp_replicate;
  config.dp_shard_size = dp_shard;
  config.tp_size = tp;
  config.cp_size = cp;
  return config;
}

int64_t ModelElements() {
  int64_t total = 0;
  for (const auto& p : MakeModel()->parameters()) total += p.numel();
  return total;
}

class NdParallelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (SharedAccelerator().num_processes() != 4) {
      GTEST_SKIP() << "the meshes here are of 4 processes";
    }
  }
};

// HSDP's gradients are a reduce-scatter over 2 ranks then an all-reduce
// over 2: the same sum as DDP's over 4, in another order.
TEST_F(NdParallelTest, HybridShardingTrainsAsDdp) {
  const Result ddp = Train({.clip = 0.5});
  for (int stage = 1; stage <= 3; ++stage) {
    const Result hsdp =
        Train({.stage = stage, .clip = 0.5, .parallelism = Mesh(2, 2)});
    EXPECT_LE(MaxDifference(hsdp.parameters, ddp.parameters), 1e-6)
        << "stage " << stage;
    ASSERT_EQ(hsdp.norms.size(), ddp.norms.size());
    for (size_t i = 0; i < ddp.norms.size(); ++i) {
      // The norm is over one replica's shards, not both (which would count
      // every gradient twice).
      EXPECT_NEAR(hsdp.norms[i], ddp.norms[i], 1e-6 * ddp.norms[i])
          << "stage " << stage << ", step " << i;
    }
    // The optimizer state is sharded over dp_shard (2), not over all 4.
    const int64_t total = ModelElements();
    const int shard = SharedAccelerator().process_index() % 2;
    EXPECT_EQ(hsdp.state_elements, shard == 0 ? (total + 1) / 2 : total / 2)
        << "stage " << stage;
    EXPECT_EQ(hsdp.parameters_with_grad, stage == 1 ? 6 : 0);
  }
  // Not vacuous: the weights moved.
  EXPECT_GT(MaxDifference(ddp.parameters, Train({.steps = 0}).parameters),
            1e-2);
}

// Two backwards before a step (the shards' held gradients add) and
// accumulation inside no_sync.
TEST_F(NdParallelTest, HybridShardingAccumulatesAsDdp) {
  const Result ddp = Train({.accumulation = 2, .steps = 10, .backwards = 2});
  const Result hsdp = Train({.stage = 2,
                             .accumulation = 2,
                             .steps = 10,
                             .backwards = 2,
                             .parallelism = Mesh(2, 2)});
  EXPECT_LE(MaxDifference(hsdp.parameters, ddp.parameters), 1e-6);
}

// A reduce_dtype other than the master's: reduce-scattered in bf16, then
// all-reduced across replicas in float32; close to ZeRO over all 4.
TEST_F(NdParallelTest, HybridShardingWithMixedPrecision) {
  const Result zero = Train({.stage = 2,
                             .steps = 10,
                             .param_dtype = torch::kBFloat16,
                             .reduce_dtype = torch::kBFloat16});
  const Result hsdp = Train({.stage = 2,
                             .steps = 10,
                             .param_dtype = torch::kBFloat16,
                             .reduce_dtype = torch::kBFloat16,
                             .parallelism = Mesh(2, 2)});
  EXPECT_LE(MaxDifference(hsdp.parameters, zero.parameters), 2e-2);
  EXPECT_EQ(hsdp.stepped_dtypes, std::set<c10::ScalarType>{torch::kFloat32});
}

// Plain data parallelism on a mesh (all ones: dp_replicate = 4) is DDP.
TEST_F(NdParallelTest, AllOnesIsDdp) {
  const Result ddp = Train({.steps = 10});
  const Result mesh = Train({.steps = 10, .parallelism = ParallelismConfig()});
  EXPECT_EQ(MaxDifference(mesh.parameters, ddp.parameters), 0.0);
}

TEST_F(NdParallelTest, MeshCoordinatesAndDataParallelCollectives) {
  AcceleratorOptions options = Options({.stage = 1});
  options.parallelism_config = Mesh(1, 2, /*tp=*/2);
  Accelerator accelerator(options);
  const int rank = accelerator.process_index();
  ASSERT_NE(accelerator.torch_device_mesh(), nullptr);
  EXPECT_EQ(accelerator.parallelism_config()->ToString(),
            "dp_replicate 1 x dp_shard 2 x cp 1 x tp 2");
  EXPECT_EQ(accelerator.tensor_parallel_rank(), rank % 2);
  EXPECT_EQ(accelerator.data_parallel_shard_rank(), rank / 2);
  EXPECT_EQ(accelerator.data_parallel_rank(), 0);
  EXPECT_EQ(accelerator.context_parallel_rank(), 0);
  EXPECT_EQ(accelerator.data_parallel_size(), 2);
  EXPECT_EQ(accelerator.data_parallel_index(), rank / 2);
  // gather and reduce run over the data-parallel ranks: 2 of them.
  const torch::Tensor index =
      torch::tensor({static_cast<int64_t>(accelerator.data_parallel_index())});
  const torch::Tensor gathered = accelerator.gather(index);
  EXPECT_TRUE(gathered.equal(torch::tensor({int64_t{0}, int64_t{1}})))
      << gathered;
  EXPECT_EQ(accelerator.reduce(index + 1, "sum").item<int64_t>(), 3);
  // Loaders shard over them: the two ranks of a tp group read the same
  // batches, the two tp groups different ones.
  struct Samples {
    torch::data::Example<> get(size_t i) const {
      return {torch::tensor({static_cast<float>(i)}), torch::tensor(0)};
    }
    size_t size() const { return 16; }
  };
  DataLoaderOptions loader_options;
  loader_options.batch_size = 2;
  loader_options.shuffle = true;
  auto loader =
      accelerator.prepare(DataLoader<Samples>(Samples(), loader_options));
  std::vector<int64_t> seen;
  for (const auto& batch : loader) {
    for (int64_t i = 0; i < batch.data.size(0); ++i) {
      seen.push_back(static_cast<int64_t>(batch.data[i][0].item<float>()));
    }
  }
  EXPECT_EQ(seen.size(), 8u);
  const std::vector<int64_t> all = accelerator.gather_object(seen);
  ASSERT_EQ(all.size(), 32u);
  const auto of = [&](int r) {
    return std::vector<int64_t>(all.begin() + 8 * r, all.begin() + 8 * r + 8);
  };
  EXPECT_EQ(of(0), of(1));
  EXPECT_EQ(of(2), of(3));
  EXPECT_NE(of(0), of(2));
  // gather_for_metrics over an epoch: each sample once, not once per tp
  // rank.
  int64_t samples = 0;
  for (const auto& batch : loader) {
    samples += accelerator.gather_for_metrics(batch.data).size(0);
  }
  EXPECT_EQ(samples, 16);
}

// Written under HSDP at 2 x 2, resumed at 1 x 4 and without a mesh (ZeRO
// over 4): the same weights as the run that did not stop.
TEST_F(NdParallelTest, CheckpointResumesAtAnotherMesh) {
  const std::string folder = Folder("nd_checkpoint");
  const Result whole =
      Train({.stage = 2, .steps = 20, .parallelism = Mesh(2, 2)});
  Train(
      {.stage = 2, .steps = 10, .save_to = folder, .parallelism = Mesh(2, 2)});
  const Result at_1x4 = Train({.stage = 2,
                               .steps = 10,
                               .first_step = 10,
                               .load_from = folder,
                               .parallelism = Mesh(1, 4)});
  EXPECT_LE(MaxDifference(at_1x4.parameters, whole.parameters), 1e-6);
  const Result stage3 =
      Train({.stage = 3, .steps = 10, .first_step = 10, .load_from = folder});
  EXPECT_LE(MaxDifference(stage3.parameters, whole.parameters), 1e-6);
  // With tp (no split layers): the two ranks of a tp group hold the same
  // pieces; one writes (both did: "elements [0, 32) are in two files").
  const std::string tp_folder = Folder("nd_checkpoint_tp");
  const Result tp_whole =
      Train({.stage = 2, .steps = 20, .parallelism = Mesh(1, 2, 2)});
  Train({.stage = 2,
         .steps = 10,
         .save_to = tp_folder,
         .parallelism = Mesh(1, 2, 2)});
  const Result tp_resumed = Train({.stage = 3,
                                   .steps = 10,
                                   .first_step = 10,
                                   .load_from = tp_folder,
                                   .parallelism = Mesh(1, 2, 2)});
  EXPECT_LE(MaxDifference(tp_resumed.parameters, tp_whole.parameters), 1e-6);
  const Result hsdp_again = Train({.stage = 1,
                                   .steps = 10,
                                   .first_step = 10,
                                   .load_from = folder,
                                   .parallelism = Mesh(2, 2)});
  EXPECT_LE(MaxDifference(hsdp_again.parameters, whole.parameters), 1e-6);
}

// --- Tensor parallelism: the GPT at tp 2 x dp_shard 2 against one process.

examples::GptConfig SmallGpt(double dropout = 0) {
  examples::GptConfig config;
  config.vocab_size = 32;
  config.block_size = 8;
  config.n_layer = 2;
  config.n_head = 4;
  config.n_embd = 16;
  config.dropout = dropout;
  return config;
}

// The global batch's tokens and targets at `step` ([4, 8] each), or
// data-parallel rank `dp`'s rows of it of `dp_size`.
std::pair<torch::Tensor, torch::Tensor> Tokens(int step, int dp = 0,
                                               int dp_size = 1) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(100 * step + 1);
  const torch::Tensor text = torch::randint(0, 32, {4, 9}, generator)
                                 .narrow(0, dp * 4 / dp_size, 4 / dp_size);
  return {text.narrow(1, 0, 8), text.narrow(1, 1, 8)};
}

// This tp rank's share of a whole parameter of the GPT, as ParallelizeGpt
// splits it (by name).
torch::Tensor ShareByName(const std::string& name, const torch::Tensor& whole,
                          int rank, int size) {
  const auto ends = [&](const std::string& tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (ends("attention.qkv.weight") || ends("attention.qkv.bias")) {
    return accel::ShareOf(whole, {.dim = 0, .fused = 3, .size = size}, rank);
  }
  if (ends("fc.weight") || ends("fc.bias")) {
    return accel::ShareOf(whole, {.dim = 0, .size = size}, rank);
  }
  if (ends("attention.proj.weight") || ends("fc_proj.weight")) {
    return accel::ShareOf(whole, {.dim = 1, .size = size}, rank);
  }
  return whole;
}

double RelativeDifference(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).abs().max().item<double>() /
         std::max(want.abs().max().item<double>(), 1e-12);
}

struct GptRun {
  std::vector<double> losses, norms;
  torch::Tensor first_logits;  // Step 0, of this process's tokens.
  std::map<std::string, torch::Tensor> first_grads, weights;
  std::map<std::string, torch::Tensor> whole_weights;  // get_state_dict's.
};

constexpr int kGptSteps = 20;

// SGD with momentum: AdamW would divide the key bias's gradient, which
// softmax makes zero but for float32 rounding (1e-9), by its own size, and
// step on the noise (its weights then differ by 2e-5 between any two
// summation orders, DDP's included).
torch::optim::SGD Sgd(examples::GptImpl& gpt) {
  return torch::optim::SGD(gpt.parameters(),
                           torch::optim::SGDOptions(0.05).momentum(0.9));
}
constexpr double kMaxNorm = 0.05;  // Clipping engages at every step.

// One process: the global batch (both data-parallel ranks').
GptRun TrainWhole(double dropout = 0) {
  torch::manual_seed(21);
  examples::Gpt gpt(SmallGpt(dropout));
  torch::optim::SGD sgd = Sgd(*gpt);
  const torch::Tensor mask = examples::CausalMask(8);
  GptRun run;
  for (int step = 0; step < kGptSteps; ++step) {
    const auto [x, y] = Tokens(step);
    const torch::Tensor logits = gpt->forward(x, mask);
    const torch::Tensor loss = examples::LanguageModelLoss(logits, y);
    loss.backward();
    if (step == 0) {
      run.first_logits = logits.detach().clone();  // [4, 8, V]
      for (const auto& p : gpt->named_parameters()) {
        run.first_grads[p.key()] = p.value().grad().clone();
      }
    }
    run.norms.push_back(
        torch::nn::utils::clip_grad_norm_(gpt->parameters(), kMaxNorm));
    run.losses.push_back(loss.item<double>());
    sgd.step();
    sgd.zero_grad();
  }
  for (const auto& p : gpt->named_parameters()) {
    run.weights[p.key()] = p.value().detach().clone();
  }
  return run;
}

struct GptTraining {
  int stage = 1;
  ParallelismConfig mesh = Mesh(1, 2, /*tp=*/2);
  int steps = kGptSteps;
  int first_step = 0;
  std::string save_to, load_from;
  bool sequence_parallel = false;
  double dropout = 0;
  // Every rank but 0 reseeds its generator before prepare.
  bool seed_per_rank = false;
};

GptRun TrainSplit(const GptTraining& training) {
  AcceleratorOptions options = Options({.stage = training.stage});
  options.parallelism_config = training.mesh;
  Accelerator accelerator(options);
  torch::manual_seed(21);
  examples::Gpt gpt(SmallGpt(training.dropout));
  if (training.mesh.tp_size > 1) {
    EXPECT_EQ(examples::ParallelizeGpt(
                  *gpt, accelerator.torch_device_mesh()->group("tp"),
                  training.sequence_parallel),
              8);
  }
  if (training.mesh.cp_size > 1) {
    EXPECT_EQ(examples::ContextParallelGpt(
                  *gpt, accelerator.torch_device_mesh()->group("cp")),
              2);
  }
  torch::optim::SGD sgd = Sgd(*gpt);
  if (training.seed_per_rank && accelerator.process_index() != 0) {
    torch::manual_seed(1000 + accelerator.process_index());
  }
  auto [model, optimizer] = accelerator.prepare(gpt, sgd);
  if (!training.load_from.empty()) accelerator.load_state(training.load_from);
  const torch::Tensor mask = examples::CausalMask(8);
  const int dp = accelerator.data_parallel_index();
  const int dp_size = accelerator.data_parallel_size();
  GptRun run;
  for (int step = training.first_step;
       step < training.first_step + training.steps; ++step) {
    auto [x, y] = Tokens(step, dp, dp_size);
    torch::Tensor positions = torch::arange(8);
    accelerator.maybe_context_parallel({&x, &y, &positions}, {1, 1, 0});
    const torch::Tensor logits = model->forward(x, mask, positions);
    const torch::Tensor loss = examples::LanguageModelLoss(logits, y);
    accelerator.backward(loss);
    if (step == 0) {
      run.first_logits = logits.detach().clone();
      if (training.stage == 1) {
        for (const auto& p : model->named_parameters()) {
          run.first_grads[p.key()] = p.value().grad().clone();
        }
      }
    }
    run.norms.push_back(
        accelerator.clip_grad_norm_(model->parameters(), kMaxNorm));
    // The mean over the ranks with different tokens: dp x cp.
    run.losses.push_back(
        ReduceTensor(accelerator.torch_device_mesh()->group("dp_cp"),
                     loss.detach(), "mean")
            .item<double>());
    optimizer.step();
    optimizer.zero_grad();
  }
  if (!training.save_to.empty()) accelerator.save_state(training.save_to);
  if (training.stage < 3) {
    for (const auto& p : model->named_parameters()) {
      run.weights[p.key()] = p.value().detach().clone();
    }
  }
  // Whole, on the main process: shares joined, units gathered.
  run.whole_weights = accelerator.get_state_dict(model);
  return run;
}

// torch's TP tests' check: forward outputs, every gradient and the weights
// after 20 steps of the split model within 1e-5 of one process's (each
// rank's share of them), with clipping across the tp ranks' shares.
TEST_F(NdParallelTest, TensorParallelGptMatchesOneProcess) {
  Accelerator& job = SharedAccelerator();
  const int tp_rank = job.process_index() % 2;
  const GptRun whole = TrainWhole();
  const torch::Tensor whole_logits =
      whole.first_logits.narrow(0, 2 * (job.process_index() / 2), 2);
  for (int stage : {1, 2, 3}) {
    const GptRun split = TrainSplit({.stage = stage});
    EXPECT_LE(RelativeDifference(split.first_logits, whole_logits), 1e-5)
        << "stage " << stage;
    for (int step = 0; step < kGptSteps; ++step) {
      EXPECT_NEAR(split.losses[step], whole.losses[step],
                  1e-5 * whole.losses[step])
          << "stage " << stage << ", step " << step;
      EXPECT_NEAR(split.norms[step], whole.norms[step],
                  1e-5 * whole.norms[step])
          << "stage " << stage << ", step " << step;
    }
    for (const auto& [name, grad] : split.first_grads) {
      EXPECT_LE(
          RelativeDifference(
              grad, ShareByName(name, whole.first_grads.at(name), tp_rank, 2)),
          1e-5)
          << "gradient of " << name;
    }
    for (const auto& [name, weight] : split.weights) {
      EXPECT_LE(
          RelativeDifference(
              weight, ShareByName(name, whole.weights.at(name), tp_rank, 2)),
          1e-5)
          << "stage " << stage << ", weight " << name;
    }
    double worst_grad = 0, worst_weight = 0, worst_loss = 0;
    for (const auto& [name, grad] : split.first_grads) {
      worst_grad = std::max(
          worst_grad,
          RelativeDifference(
              grad, ShareByName(name, whole.first_grads.at(name), tp_rank, 2)));
    }
    for (const auto& [name, weight] : split.whole_weights) {
      worst_weight = std::max(
          worst_weight, RelativeDifference(weight, whole.weights.at(name)));
    }
    for (int step = 0; step < kGptSteps; ++step) {
      worst_loss = std::max(
          worst_loss, std::abs(split.losses[step] / whole.losses[step] - 1));
    }
    if (job.is_main_process()) {
      // Gradients stay whole on a rank at stage 1 only (2-3 keep shards).
      char gradients[48] = "";
      if (stage == 1) {
        std::snprintf(gradients, sizeof(gradients), "gradients %.2g, ",
                      worst_grad);
      }
      std::printf(
          "tp 2 x dp_shard 2, stage %d, %d steps: logits %.2g, losses "
          "%.2g, %sweights %.2g (largest relative differences; weights "
          "joined by get_state_dict)\n",
          stage, kGptSteps,
          RelativeDifference(split.first_logits, whole_logits), worst_loss,
          gradients, worst_weight);
    }
    EXPECT_EQ(split.first_grads.empty(), stage != 1);
    EXPECT_EQ(split.weights.empty(), stage == 3);
    // get_state_dict joins the shares: the whole model's weights (under
    // stage 3 on the main process only, as FSDP's rank0_only).
    if (job.is_main_process()) {
      ASSERT_EQ(split.whole_weights.size(), whole.weights.size());
      for (const auto& [name, weight] : whole.weights) {
        EXPECT_LE(RelativeDifference(split.whole_weights.at(name), weight),
                  1e-5)
            << "stage " << stage << ", get_state_dict's " << name;
      }
    } else {
      EXPECT_EQ(split.whole_weights.empty(), stage == 3);
    }
  }
  // Not vacuous: the weights moved.
  torch::manual_seed(21);
  examples::Gpt initial(SmallGpt());
  EXPECT_GT(
      RelativeDifference(whole.weights.at("blocks.0.fc.weight"),
                         initial->named_parameters()["blocks.0.fc.weight"]),
      1e-3);
}

// The largest relative difference of two runs' whole weights.
double WorstDifference(const std::map<std::string, torch::Tensor>& got,
                       const std::map<std::string, torch::Tensor>& want) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (const auto& [name, weight] : want) {
    worst = std::max(worst, RelativeDifference(got.at(name), weight));
  }
  return worst;
}

// Context parallelism (Ulysses) at dp_shard 2 x cp 2, and with tensor
// parallelism at tp 2 x cp 2: each rank holds half of every sequence
// (labels shifted before the split), the loss averaged over dp x cp;
// logits, losses, clipping norms and the weights after 20 steps within
// 1e-5 of one process's.
// A GPT run on `mesh` against one process's on the global batch: this
// rank's logits (its rows `dp` of the data-parallel ranks and part `cp` of
// the sequence), the losses and clipping norms at every step, the
// gradients (stage 1; tp rank `tp`'s shares) and the joined weights after
// 20 steps, each within 1e-5.
struct MeshCase {
  const char* what;
  int stage;
  ParallelismConfig mesh;
  int dp;      // This rank's data-parallel index.
  int cp = 0;  // Its context-parallel coordinate.
  int tp = 0;  // Its tensor-parallel coordinate.
  bool sequence_parallel = false;
  double dropout = 0;
};

void ExpectMatchesOneProcess(const MeshCase& c, const GptRun& whole) {
  const GptRun split = TrainSplit({.stage = c.stage,
                                   .mesh = c.mesh,
                                   .sequence_parallel = c.sequence_parallel,
                                   .dropout = c.dropout});
  const int rows = 4 / c.mesh.dp_size(), part = 8 / c.mesh.cp_size;
  const torch::Tensor logits = whole.first_logits.narrow(0, c.dp * rows, rows)
                                   .narrow(1, part * c.cp, part);
  EXPECT_LE(RelativeDifference(split.first_logits, logits), 1e-5) << c.what;
  double worst_loss = 0;
  for (int step = 0; step < kGptSteps; ++step) {
    worst_loss = std::max(
        worst_loss, std::abs(split.losses[step] / whole.losses[step] - 1));
    EXPECT_NEAR(split.norms[step], whole.norms[step], 1e-5 * whole.norms[step])
        << c.what << ", step " << step;
  }
  EXPECT_LE(worst_loss, 1e-5) << c.what;
  // Stage 1 keeps every gradient (each tp rank its shares): averaged over
  // dp x cp, the global batch's.
  double worst_grad = 0;
  for (const auto& [name, grad] : split.first_grads) {
    worst_grad = std::max(
        worst_grad,
        RelativeDifference(grad, ShareByName(name, whole.first_grads.at(name),
                                             c.tp, c.mesh.tp_size)));
  }
  EXPECT_LE(worst_grad, 1e-5) << c.what;
  EXPECT_EQ(split.first_grads.empty(), c.stage != 1);
  if (!SharedAccelerator().is_main_process()) return;
  const double worst = WorstDifference(split.whole_weights, whole.weights);
  char gradients[48] = "";
  if (c.stage == 1) {
    std::snprintf(gradients, sizeof(gradients), "gradients %.2g, ", worst_grad);
  }
  std::printf(
      "%s, %d steps: logits %.2g, losses %.2g, %sweights %.2g (largest "
      "relative differences)\n",
      c.what, kGptSteps, RelativeDifference(split.first_logits, logits),
      worst_loss, gradients, worst);
  EXPECT_LE(worst, 1e-5) << c.what;
}

// Context parallelism (Ulysses) at dp_shard 2 x cp 2, and beside tensor
// parallelism at tp 2 x cp 2: each rank holds half of every sequence
// (labels shifted before the split), the loss averaged over dp x cp.
TEST_F(NdParallelTest, ContextParallelGptMatchesOneProcess) {
  const int rank = SharedAccelerator().process_index();
  const GptRun whole = TrainWhole();
  for (const MeshCase& c :
       {MeshCase{"dp_shard 2 x cp 2, stage 1", 1, Mesh(1, 2, 1, 2), rank / 2,
                 rank % 2},
        MeshCase{"dp_shard 2 x cp 2, stage 3", 3, Mesh(1, 2, 1, 2), rank / 2,
                 rank % 2},
        MeshCase{"tp 2 x cp 2, stage 2", 2, Mesh(1, 1, 2, 2), 0, rank / 2,
                 rank % 2}}) {
    ExpectMatchesOneProcess(c, whole);
  }
}

// Megatron's sequence parallelism (the LayerNorms' and row-parallel
// biases' gradients are each rank's part of the sequence's, summed over
// tp), and dropout in every split region: each rank keeps its share of the
// masks one process draws (accel::SplitDropout), so that tensor and
// context parallelism train as one process does with dropout on (data
// parallelism does not: each data-parallel rank draws its own batch's
// masks, as in Accelerate).
TEST_F(NdParallelTest, SequenceParallelAndDropoutMatchOneProcess) {
  const int rank = SharedAccelerator().process_index();
  ExpectMatchesOneProcess(
      {"tp 2 x dp_shard 2, sequence parallel, stage 1", 1, Mesh(1, 2, 2),
       rank / 2, 0, rank % 2, /*sequence_parallel=*/true},
      TrainWhole());
  const GptRun dropped = TrainWhole(0.1);
  for (const MeshCase& c :
       {MeshCase{"tp 2 x cp 2, dropout 0.1, stage 1", 1, Mesh(1, 1, 2, 2), 0,
                 rank / 2, rank % 2, false, 0.1},
        MeshCase{"tp 2 x cp 2, sequence parallel, dropout 0.1, stage 3", 3,
                 Mesh(1, 1, 2, 2), 0, rank / 2, rank % 2, true, 0.1},
        MeshCase{"tp 4, sequence parallel, dropout 0.1, stage 2", 2,
                 Mesh(1, 1, 4), 0, 0, rank, true, 0.1}}) {
    ExpectMatchesOneProcess(c, dropped);
  }
  // Not vacuous: dropout changed the run.
  EXPECT_GT(std::abs(dropped.losses.back() / TrainWhole().losses.back() - 1),
            1e-3);
}

// At 8 processes (the mesh order is dp_replicate, dp_shard, cp, tp):
// dp_replicate 2 x dp_shard 2 x tp 2, and dp_shard 2 x cp 2 x tp 2.
TEST(NdParallelEightTest, TwoByTwoByTwoMatchesOneProcess) {
  if (SharedAccelerator().num_processes() != 8) {
    GTEST_SKIP() << "the meshes here are of 8 processes";
  }
  const int rank = SharedAccelerator().process_index();
  const GptRun whole = TrainWhole();
  for (const MeshCase& c :
       {MeshCase{"dp_replicate 2 x dp_shard 2 x tp 2, stage 1", 1,
                 Mesh(2, 2, 2), rank / 2, 0, rank % 2},
        MeshCase{"dp_replicate 2 x dp_shard 2 x tp 2, stage 3", 3,
                 Mesh(2, 2, 2), rank / 2, 0, rank % 2},
        MeshCase{"dp_shard 2 x cp 2 x tp 2, stage 2", 2, Mesh(1, 2, 2, 2),
                 rank / 4, (rank / 2) % 2, rank % 2}}) {
    ExpectMatchesOneProcess(c, whole);
  }
}

// torch's CommDebugMode tests: the collectives one training step starts on
// each group of the mesh, by phase, so that a change that adds one is
// caught. The GPT has 2 blocks, each with a column- and a row-parallel
// pair in attention and in the MLP, and, under context parallelism, four
// all-to-alls per attention (q, k, v in, the output back).
TEST_F(NdParallelTest, CollectivesPerStepAndDimension) {
  struct Case {
    const char* what;
    ParallelismConfig mesh;
    // Per phase (forward, backward, clip, step), per group.
    std::map<std::string, std::vector<uint64_t>> expected;
  };
  const std::vector<Case> cases = {
      {"tp 2 x dp_shard 2, stage 2",
       Mesh(1, 2, 2),
       // tp: forward sums each row-parallel layer's outputs (2 a block),
       // backward each column-parallel layer's input gradients (2 a
       // block); clipping sums the shares' squares once. dp_shard_cp
       // (ZeRO's): one reduce-scatter of the gradients' one bucket, one sum
       // of the shards' squares, one all-gather of the stepped parameters.
       {{"tp", {4, 4, 1, 0}},
        {"cp", {0, 0, 0, 0}},
        {"dp_replicate", {0, 0, 0, 0}},
        {"dp_shard_cp", {0, 1, 1, 1}}}},
      {"dp_shard 2 x cp 2, stage 2",
       Mesh(1, 2, 1, 2),
       {{"tp", {0, 0, 0, 0}},
        {"cp", {8, 8, 0, 0}},
        {"dp_replicate", {0, 0, 0, 0}},
        {"dp_shard_cp", {0, 1, 1, 1}}}},
      {"dp_replicate 2 x dp_shard 2 (HSDP), stage 2",
       Mesh(2, 2),
       // The bucket's reduce-scattered share all-reduced across replicas.
       {{"tp", {0, 0, 0, 0}},
        {"cp", {0, 0, 0, 0}},
        {"dp_replicate", {0, 1, 0, 0}},
        {"dp_shard_cp", {0, 1, 1, 1}}}},
  };
  for (const Case& c : cases) {
    AcceleratorOptions options = Options({.stage = 2});
    // One gradient bucket (the model is 28 KiB), not the tests' small ones.
    options.gradient_sync.first_bucket_bytes = 1 << 20;
    options.parallelism_config = c.mesh;
    Accelerator accelerator(options);
    DeviceMesh& mesh = *accelerator.torch_device_mesh();
    torch::manual_seed(21);
    examples::Gpt gpt(SmallGpt());
    if (c.mesh.tp_size > 1) examples::ParallelizeGpt(*gpt, mesh.group("tp"));
    if (c.mesh.cp_size > 1) {
      examples::ContextParallelGpt(*gpt, mesh.group("cp"));
    }
    torch::optim::SGD sgd = Sgd(*gpt);
    auto [model, optimizer] = accelerator.prepare(gpt, sgd);
    const torch::Tensor mask = examples::CausalMask(8);
    std::map<std::string, std::vector<uint64_t>> counted;
    for (int step = 0; step < 2; ++step) {
      std::map<std::string, uint64_t> before;
      const auto mark = [&](bool record) {
        for (const auto& [group, unused] : c.expected) {
          const uint64_t now = mesh.group(group).operations_started();
          if (record) counted[group].push_back(now - before[group]);
          before[group] = now;
        }
      };
      mark(false);
      auto [x, y] = Tokens(step, accelerator.data_parallel_index(),
                           accelerator.data_parallel_size());
      torch::Tensor positions = torch::arange(8);
      accelerator.maybe_context_parallel({&x, &y, &positions}, {1, 1, 0});
      const torch::Tensor loss =
          examples::LanguageModelLoss(model->forward(x, mask, positions), y);
      const bool record = step == 1;  // The first may set things up.
      mark(record);
      accelerator.backward(loss);
      mark(record);
      accelerator.clip_grad_norm_(model->parameters(), kMaxNorm);
      mark(record);
      optimizer.step();
      optimizer.zero_grad();
      mark(record);
    }
    std::string table;
    for (const auto& [group, counts] : counted) {
      table += " " + group + " " +
               c10::str(c10::IntArrayRef(
                   std::vector<int64_t>(counts.begin(), counts.end())));
    }
    if (accelerator.is_main_process()) {
      std::printf("%s: collectives (forward, backward, clip, step):%s\n",
                  c.what, table.c_str());
    }
    EXPECT_EQ(counted, c.expected) << c.what << ":" << table;
  }
}

// A checkpoint of split layers: written share by share at tp 2 x dp_shard
// 2, merged whole, resumed at dp_shard 4 (the layers whole), at tp 2 under
// stage 3 and at tp 4 (other shares); one written whole resumes split.
TEST_F(NdParallelTest, SplitLayersCheckpointAtAnotherMesh) {
  Accelerator& job = SharedAccelerator();
  const std::string folder = Folder("nd_split_checkpoint");
  const GptRun whole = TrainSplit({.stage = 2});
  const GptRun first = TrainSplit({.stage = 2, .steps = 10, .save_to = folder});
  if (job.is_main_process()) {
    // merge-weights' reading: the shares joined, the saved bits.
    const auto merged = ReadCheckpointWeights(folder, 0);
    ASSERT_EQ(merged.size(), first.whole_weights.size());
    for (const auto& [name, weight] : merged) {
      EXPECT_TRUE(weight.equal(first.whole_weights.at(name))) << name;
    }
  }
  struct Resume {
    const char* what;
    int stage;
    ParallelismConfig mesh;
  };
  for (const Resume& resume :
       {Resume{"dp_shard 4", 2, Mesh(1, 4)},
        Resume{"tp 2 x dp_shard 2, stage 3", 3, Mesh(1, 2, 2)},
        Resume{"tp 4, stage 1", 1, Mesh(1, 1, 4)}}) {
    const GptRun resumed = TrainSplit({.stage = resume.stage,
                                       .mesh = resume.mesh,
                                       .steps = 10,
                                       .first_step = 10,
                                       .load_from = folder});
    if (!job.is_main_process()) continue;
    const double worst =
        WorstDifference(resumed.whole_weights, whole.whole_weights);
    std::printf(
        "saved at tp 2 x dp_shard 2, resumed at %s: weights after "
        "20 steps within %.2g of the run that did not stop\n",
        resume.what, worst);
    EXPECT_LE(worst, 1e-5) << resume.what;
  }
  // Whole weights (dp_shard 4) resumed in shares.
  const std::string whole_folder = Folder("nd_whole_checkpoint");
  TrainSplit(
      {.stage = 2, .mesh = Mesh(1, 4), .steps = 10, .save_to = whole_folder});
  const GptRun split = TrainSplit(
      {.stage = 2, .steps = 10, .first_step = 10, .load_from = whole_folder});
  if (job.is_main_process()) {
    EXPECT_LE(WorstDifference(split.whole_weights, whole.whole_weights), 1e-5);
  }
  // A plan that cuts q|k|v as one block (not three) reads the shares
  // wrongly: refused, before anything changes.
  AcceleratorOptions options = Options({.stage = 2});
  options.parallelism_config = Mesh(1, 2, 2);
  Accelerator accelerator(options);
  examples::Gpt gpt(SmallGpt());
  parallelize_module(*gpt, accelerator.torch_device_mesh()->group("tp"),
                     {{"blocks.*.attention.qkv", ColwiseParallel{}},
                      {"blocks.*.attention.proj", RowwiseParallel{}}});
  torch::optim::SGD sgd = Sgd(*gpt);
  auto [model, optimizer] = accelerator.prepare(gpt, sgd);
  try {
    accelerator.load_state(folder);
    ADD_FAILURE() << "the changed plan was not noticed";
  } catch (const CheckpointError& error) {
    EXPECT_THAT(error.what(),
                HasSubstr("split as dim 0 in 3 blocks, 2 shares, but this "
                          "program splits it as dim 0, 2 shares: the "
                          "tensor-parallel plan changed since the save"));
  }
}

// SplitDropout needs the ranks of a tp or cp group to draw alike: prepare
// gives each group its first rank's generator state (here the other ranks
// were seeded apart), and so does load_state after a checkpoint whose
// other ranks' random states are gone (as at another process count, where
// the extra ranks find none). Both train as the run without either.
TEST_F(NdParallelTest, SplitGroupsDrawAlikeAfterPrepareAndLoadState) {
  Accelerator& job = SharedAccelerator();
  const ParallelismConfig mesh = Mesh(1, 1, 2, 2);
  const GptRun plain = TrainSplit({.mesh = mesh, .dropout = 0.1});
  const GptRun seeded =
      TrainSplit({.mesh = mesh, .dropout = 0.1, .seed_per_rank = true});
  const std::string folder = Folder("nd_dropout_checkpoint");
  TrainSplit({.mesh = mesh, .steps = 10, .save_to = folder, .dropout = 0.1});
  job.wait_for_everyone();
  if (job.is_main_process()) {
    for (int rank = 1; rank < 4; ++rank) {
      EXPECT_EQ(std::remove((folder + "/" + RandomStatesFile(rank)).c_str()),
                0);
    }
  }
  job.wait_for_everyone();
  const GptRun resumed = TrainSplit({.mesh = mesh,
                                     .steps = 10,
                                     .first_step = 10,
                                     .load_from = folder,
                                     .dropout = 0.1});
  if (!job.is_main_process()) return;
  EXPECT_LE(WorstDifference(seeded.whole_weights, plain.whole_weights), 1e-6);
  EXPECT_LE(WorstDifference(resumed.whole_weights, plain.whole_weights), 1e-6);
}

// maybe_context_parallel names the buffer at fault, at any mesh.
TEST_F(NdParallelTest, MaybeContextParallelChecksItsBuffers) {
  AcceleratorOptions options = Options({.stage = 1});
  options.parallelism_config = Mesh(1, 2, 1, 2);
  Accelerator accelerator(options);
  torch::Tensor tokens = torch::zeros({2, 8}), odd = torch::zeros({2, 9});
  torch::Tensor undefined;
  EXPECT_THAT(UsageErrorOf([&] {
                accelerator.maybe_context_parallel({&tokens, nullptr}, {1, 1});
              }),
              HasSubstr("maybe_context_parallel: buffer 1 is null"));
  EXPECT_THAT(UsageErrorOf([&] {
                accelerator.maybe_context_parallel({&undefined}, {0});
              }),
              HasSubstr("buffer 0 is null or an undefined tensor"));
  EXPECT_THAT(
      UsageErrorOf([&] { accelerator.maybe_context_parallel({&tokens}, {2}); }),
      HasSubstr("buffer 0 (shape [2, 8]) has no dimension 2"));
  EXPECT_THAT(UsageErrorOf([&] {
                accelerator.maybe_context_parallel({&tokens, &odd}, {1, 1});
              }),
              HasSubstr("buffer 1 (shape [2, 9]) has a sequence of 9 along "
                        "dimension 1, which does not split over cp_size 2"));
  EXPECT_THAT(UsageErrorOf([&] {
                accelerator.maybe_context_parallel({&tokens}, {1, 1});
              }),
              HasSubstr("1 buffers but 2 buffer_seq_dims"));
  // Nothing was cut by the calls that failed; this one cuts.
  EXPECT_EQ(tokens.size(1), 8);
  accelerator.maybe_context_parallel({&tokens}, {-1});
  EXPECT_EQ(tokens.size(1), 4);
}

// Without an optimizer accel knows, save_state would write whole weights,
// which a split model does not have: a clear error.
TEST_F(NdParallelTest, SplitLayersNeedTheShardedCheckpoint) {
  AcceleratorOptions options = Options({.stage = 1});
  options.parallelism_config = Mesh(1, 2, /*tp=*/2);
  Accelerator accelerator(options);
  examples::Gpt gpt(SmallGpt());
  examples::ParallelizeGpt(*gpt, accelerator.torch_device_mesh()->group("tp"));
  auto model = accelerator.prepare_model(gpt);
  EXPECT_THAT(UsageErrorOf([&] { accelerator.save_state(Folder("split")); }),
              HasSubstr("save_state / load_state: the model has "
                        "tensor-parallel layers"));
  // An optimizer whose state accel's sharded format cannot hold is named.
  torch::optim::LBFGS lbfgs(gpt->parameters());
  accelerator.prepare_optimizer(lbfgs);
  EXPECT_THAT(UsageErrorOf([&] { accelerator.save_state(Folder("lbfgs")); }),
              HasSubstr("the prepared optimizer torch::optim::LBFGS is not "
                        "one whose state accel knows"));
  examples::GptConfig odd = SmallGpt();
  odd.n_head = 1;
  odd.n_embd = 16;
  examples::Gpt one_head(odd);
  EXPECT_THAT(UsageErrorOf([&] {
                examples::ParallelizeGpt(
                    *one_head, accelerator.torch_device_mesh()->group("tp"));
              }),
              HasSubstr("n_head is 1; give a tp_size dividing it"));
}

// FSDP's HYBRID_SHARD: machines are replicas. These 4 processes are one
// machine's: the stage alone, no mesh.
TEST_F(NdParallelTest, HybridShardStrategyShardsWithinAMachine) {
  EXPECT_EQ(HybridShardingConfig(8, 4), Mesh(2, 4));
  EXPECT_EQ(HybridShardingConfig(4, 4), Mesh(1, 4));
  EXPECT_THAT(UsageErrorOf([] { HybridShardingConfig(6, 4); }),
              HasSubstr("the 6 processes do not split evenly into machines "
                        "of 4"));
  EXPECT_EQ(ParseShardingStrategy("HYBRID_SHARD"), 3);
  EXPECT_EQ(ParseShardingStrategy("5"), 2);
  EXPECT_TRUE(IsHybridShardingStrategy("HYBRID_SHARD_ZERO2"));
  EXPECT_FALSE(IsHybridShardingStrategy("FULL_SHARD"));
  AcceleratorOptions options = Options({.stage = 3});
  options.hybrid_shard = true;
  {
    Accelerator accelerator(options);
    EXPECT_FALSE(accelerator.parallelism_config().has_value());
    EXPECT_EQ(accelerator.torch_device_mesh(), nullptr);
  }
  options.zero_stage = 0;
  EXPECT_THAT(UsageErrorOf([&] { Accelerator a(options); }),
              HasSubstr("give zero_stage 2 or 3"));
}

TEST_F(NdParallelTest, ConfigErrorsSayWhatToChange) {
  AcceleratorOptions options = Options({.stage = 2});
  options.parallelism_config = Mesh(2, 1, 1, 1);
  EXPECT_THAT(UsageErrorOf([&] { Accelerator a(options); }),
              HasSubstr("is 2 processes, but the job has 4"));
  options.parallelism_config = Mesh(1, 4);
  options.zero_stage = 0;
  EXPECT_THAT(UsageErrorOf([&] { Accelerator a(options); }),
              HasSubstr("dp_shard_size 4 shards the training state"));
  options.parallelism_config = Mesh(2, 1, 2);
  EXPECT_THAT(UsageErrorOf([&] { Accelerator a(options); }),
              HasSubstr("with pure replication"));
  options.parallelism_config = Mesh(0, 4);
  EXPECT_THAT(UsageErrorOf([&] { Accelerator a(options); }),
              HasSubstr("dp_replicate_size must be at least 1, found 0"));
  // Accelerate's switch, read as strictly as accel's own.
  setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "maybe", 1);
  EXPECT_THAT(UsageErrorOf([] { ParallelismConfigFromFlags(); }),
              HasSubstr("ACCELERATE_USE_PARALLELISM_CONFIG"));
  setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "TRUE", 1);
  EXPECT_EQ(ParallelismConfigFromFlags(), ParallelismConfig());
  unsetenv("ACCELERATE_USE_PARALLELISM_CONFIG");
  EXPECT_FALSE(ParallelismConfigFromFlags().has_value());
  EXPECT_THAT(UsageErrorOf([] { SharedAccelerator().tensor_parallel_rank(); }),
              HasSubstr("no parallelism_config was given"));
}

}  // namespace
}  // namespace accel::testing
