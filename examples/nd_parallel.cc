// N-D parallelism with accel's ParallelismConfig: Accelerate's
// examples/torch_native_parallelism/nd_parallel.py in C++. The GPT model
// (examples/gpt_model.h) trains with any mix of data-parallel replication
// (--dp_replicate_size), ZeRO sharding (--dp_shard_size), Megatron
// tensor parallelism (--tp_size) and Ulysses context parallelism
// (--cp_size) whose product is the number of processes; ZeRO stage 3
// (FSDP) when anything is sharded, as the Python example's FSDP2 plugin;
// --sequence_parallel splits the residual stream along the sequence over
// tp as well (Megatron's sequence parallelism).
//
//   bazel run //examples:nd_parallel -- --num_processes=4 --tp_size=2
//       --dp_shard_size=2 --max_steps=100
//   bazel run //examples:nd_parallel -- --num_processes=8
//       --dp_replicate_size=2 --dp_shard_size=2 --tp_size=2
//   bazel run //examples:nd_parallel -- --num_processes=1
//       --resume_from=nd_parallel_model/checkpoints/checkpoint_1
// (each command on one line). A launch configuration's parallelism_config
// section (Accelerate's tp_hsdp.yaml) or --parallelism_config_*_size does
// the same when these flags are left at 1.
//
// Every --print_every steps: the loss averaged over the dp x cp ranks
// and tokens/s per process (Accelerate's example divides by the ranks that
// share a batch: tp x cp). Checkpoints every --checkpointing_steps (sharded,
// tensor-parallel shares included: they resume at any other mesh); at the
// end the whole model in <output_dir>/model (save_model joins the shares),
// then the parameters' fingerprint and norm.
#include <torch/optim/adamw.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "accel/accelerator.h"
#include "accel/core/tensor_ops.h"
#include "examples/gpt_model.h"
#include "examples/gpt_text.h"
#include "examples/sotu_corpus.h"

DEFINE_int32(dp_replicate_size, 1, "Data-parallel replicas (DDP / HSDP).");
DEFINE_int32(dp_shard_size, 1, "Ranks that shard the model (ZeRO / FSDP).");
DEFINE_int32(tp_size, 1, "Tensor-parallel ranks splitting each block.");
DEFINE_int32(cp_size, 1,
             "Context-parallel ranks splitting each sequence (Ulysses).");
DEFINE_bool(sequence_parallel, false,
            "Under tensor parallelism, split the LayerNorms' and dropouts' "
            "activations along the sequence over tp as well.");
DEFINE_string(text, "sotu", "sotu (State of the Union bytes) or markov.");
DEFINE_string(data_dir, "", "The corpus's folder (default: installed).");
DEFINE_int64(samples, 96, "--text=markov: training sequences.");
DEFINE_int64(vocab_size, 64, "--text=markov: tokens in the vocabulary.");
DEFINE_int64(max_steps, 100, "Optimizer steps in total, resumed included.");
DEFINE_int64(checkpointing_steps, 0, "save_state every this many steps.");
DEFINE_string(output_dir, "nd_parallel_model", "Where checkpoints go.");
DEFINE_string(resume_from, "", "A checkpoint folder to continue from.");
DEFINE_int64(seed, 42, "Seed of the data, weights and shuffling.");
DEFINE_int32(batch_size, 8, "Global batch in sequences.");
DEFINE_int64(block_size, 128, "Tokens in a sequence.");
DEFINE_int64(n_layer, 4, "Blocks.");
DEFINE_int64(n_head, 4, "Attention heads per block.");
DEFINE_int64(n_embd, 128, "Width of the model.");
DEFINE_double(lr, 1e-3, "AdamW's learning rate.");
DEFINE_double(max_grad_norm, 1.0, "Clip the gradients' norm (0: no).");
DEFINE_int64(print_every, 10, "Progress every this many steps (0: no).");

namespace {

bool MeshFlagsGiven() {
  return FLAGS_dp_replicate_size != 1 || FLAGS_dp_shard_size != 1 ||
         FLAGS_tp_size != 1 || FLAGS_cp_size != 1;
}

accel::AcceleratorOptions Options() {
  accel::AcceleratorOptions options = accel::AcceleratorOptions::FromFlags();
  options.seed = static_cast<uint64_t>(FLAGS_seed);
  options.project_dir = FLAGS_output_dir;
  if (MeshFlagsGiven()) {
    accel::ParallelismConfig config;
    config.dp_replicate_size = FLAGS_dp_replicate_size;
    config.dp_shard_size = FLAGS_dp_shard_size;
    config.tp_size = FLAGS_tp_size;
    config.cp_size = FLAGS_cp_size;
    options.parallelism_config = config;
  }
  const auto& config = options.parallelism_config;
  if (config && (config->dp_shard_size > 1 || config->cp_size > 1) &&
      options.zero_stage == 0) {
    options.zero_stage = 3;  // The Python example's FSDP2 plugin.
  }
  return options;
}

int Main(int, char**) {
  if (FLAGS_max_steps < 1 || FLAGS_batch_size < 1 || FLAGS_print_every < 0 ||
      FLAGS_checkpointing_steps < 0) {
    throw accel::UsageError(
        "--max_steps and --batch_size must be at least 1, --print_every and "
        "--checkpointing_steps not negative");
  }
  const accel::AcceleratorOptions options = Options();
  accel::Accelerator accelerator(options);
  const accel::ParallelismConfig mesh =
      accelerator.parallelism_config().value_or(accel::ParallelismConfig{});
  if (FLAGS_sequence_parallel && mesh.tp_size < 2) {
    throw accel::UsageError(
        "--sequence_parallel splits each sequence over the tensor-parallel "
        "ranks, but tp_size is " +
        std::to_string(mesh.tp_size) +
        "; give --tp_size=2 or more (or parallelism_config's tp_size), or "
        "leave --sequence_parallel out");
  }
  if (FLAGS_batch_size % accelerator.data_parallel_size() != 0) {
    throw accel::UsageError(
        "--batch_size (" + std::to_string(FLAGS_batch_size) +
        ") must be a multiple of the data-parallel ranks (" +
        std::to_string(accelerator.data_parallel_size()) + ")");
  }
  const examples::GptText text =
      examples::LoadGptText({.kind = FLAGS_text,
                             .data_dir = FLAGS_data_dir,
                             .block_size = FLAGS_block_size,
                             .samples = FLAGS_samples,
                             .vocab_size = FLAGS_vocab_size},
                            static_cast<uint64_t>(FLAGS_seed));
  examples::GptConfig config;
  config.vocab_size = text.vocab_size;
  config.block_size = FLAGS_block_size;
  config.n_layer = FLAGS_n_layer;
  config.n_head = FLAGS_n_head;
  config.n_embd = FLAGS_n_embd;
  config.dropout = 0;
  examples::Gpt gpt(config);
  const int64_t parameters = gpt->parameter_count();  // Before any split.
  if (mesh.tp_size > 1) {
    // Before the optimizer: it steps this rank's shares.
    examples::ParallelizeGpt(*gpt, accelerator.torch_device_mesh()->group("tp"),
                             FLAGS_sequence_parallel);
  }
  if (mesh.cp_size > 1) {
    // Each rank attends with a share of the heads over the whole sequence.
    examples::ContextParallelGpt(*gpt,
                                 accelerator.torch_device_mesh()->group("cp"));
  }
  torch::optim::AdamW adamw(gpt->parameters(),
                            torch::optim::AdamWOptions(FLAGS_lr));
  accel::DataLoaderOptions loader_options;
  loader_options.batch_size = static_cast<size_t>(FLAGS_batch_size);
  loader_options.split_batches = true;
  loader_options.shuffle = true;
  loader_options.drop_last = true;
  loader_options.seed = static_cast<uint64_t>(FLAGS_seed);
  accel::DataLoader<accel_examples::TextBlocks> data(
      accel_examples::TextBlocks(text.train, FLAGS_block_size), loader_options);
  if (data.batches_per_epoch() == 0) {
    throw accel::UsageError("the text holds fewer blocks than --batch_size");
  }
  auto [model, optimizer, loader] = accelerator.prepare(gpt, adamw, data);
  accelerator.print(text.description);
  accelerator.print(
      "GPT:", parameters, "parameters on", accelerator.num_processes(),
      "process(es),",
      mesh.ToString() +
          (FLAGS_sequence_parallel ? " (sequence parallel)," : ""),
      "zero_stage", options.zero_stage);
  if (!FLAGS_resume_from.empty()) {
    accelerator.load_state(FLAGS_resume_from);
    accelerator.print("Resumed from", FLAGS_resume_from, "at step",
                      accelerator.step());
  }

  // The whole sequence's mask and positions (context parallelism cuts the
  // positions with the tokens).
  const torch::Tensor mask =
      examples::CausalMask(FLAGS_block_size).to(accelerator.device());
  const torch::Tensor positions =
      torch::arange(FLAGS_block_size, torch::kLong).to(accelerator.device());
  // The loss is averaged over the ranks with different tokens: dp x cp.
  const auto mean_loss = [&](const torch::Tensor& loss) {
    accel::DeviceMesh* device_mesh = accelerator.torch_device_mesh();
    if (device_mesh == nullptr) return accelerator.reduce(loss, "mean");
    return accel::ReduceTensor(device_mesh->group("dp_cp"), loss, "mean");
  };
  // Tokens a process works through per step: its data-parallel share of
  // the batch (the tp ranks of a group share one).
  const double tokens_per_process =
      double(FLAGS_batch_size) * FLAGS_block_size /
      accelerator.data_parallel_size() / (mesh.tp_size * mesh.cp_size);
  auto since = std::chrono::steady_clock::now();
  int64_t timed_steps = 0;
  double last_loss = std::nan("");
  model->train();
  while (accelerator.step() < FLAGS_max_steps) {
    for (auto& batch : loader) {
      // Labels are shifted before the split (the loader's targets).
      torch::Tensor tokens = batch.data, targets = batch.target,
                    where = positions;
      accelerator.maybe_context_parallel({&tokens, &targets, &where},
                                         {1, 1, 0});
      const torch::Tensor loss = examples::LanguageModelLoss(
          model->forward(tokens, mask, where), targets);
      accelerator.backward(loss);
      if (FLAGS_max_grad_norm > 0) {
        accelerator.clip_grad_norm_(model->parameters(), FLAGS_max_grad_norm);
      }
      optimizer.step();
      optimizer.zero_grad();
      ++timed_steps;
      const int64_t step = accelerator.step();
      const bool last = step >= FLAGS_max_steps;
      if (last || (FLAGS_print_every > 0 && step % FLAGS_print_every == 0)) {
        last_loss = mean_loss(loss.detach()).item<double>();
        const double seconds = std::chrono::duration<double>(
                                   std::chrono::steady_clock::now() - since)
                                   .count();
        char line[160];
        std::snprintf(line, sizeof(line),
                      "step %lld/%lld | loss %.4f | %.0f tokens/s per process",
                      static_cast<long long>(step),
                      static_cast<long long>(FLAGS_max_steps), last_loss,
                      tokens_per_process * timed_steps / seconds);
        accelerator.print(line);
        since = std::chrono::steady_clock::now();
        timed_steps = 0;
      }
      if (FLAGS_checkpointing_steps > 0 &&
          step % FLAGS_checkpointing_steps == 0) {
        accelerator.print("saved", accelerator.save_state());
      }
      if (last) break;
    }
  }
  accelerator.save_model(model, FLAGS_output_dir + "/model");
  const auto weights = accelerator.get_state_dict(model);
  if (accelerator.is_main_process()) {
    examples::PrintFinalWeights(accelerator.step(), last_loss, weights);
    std::printf("Model saved to %s/model\n", FLAGS_output_dir.c_str());
  }
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
