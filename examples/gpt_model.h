// A GPT-style causal language model written the usual C++ way: token and
// position embeddings, a ModuleList of blocks (causal self-attention and an
// MLP, each after a LayerNorm, with dropout), a final LayerNorm and an
// output head tied to the token embedding. Its forward is hand-written and
// passes the attention mask to every block, so it shows what ZeRO stage 3
// needs of such a model: each block call goes through accel::forward
// (docs/parallelism.md, "Units"); with activation checkpointing it also
// goes through accel::checkpoint.
//
//   examples::GptConfig config;              // vocab 64, 4 layers of 64
//   examples::Gpt gpt(config);
//   torch::Tensor mask = examples::CausalMask(tokens.size(1));
//   torch::Tensor logits = gpt->forward(tokens, mask);   // [B, T, vocab]
//   torch::Tensor loss = examples::LanguageModelLoss(logits, targets);
//
// Its attention and MLP projections are accel::ParallelLinear (Linears
// until split), so that ParallelizeGpt can split them over a
// tensor-parallel group (accel/parallel/parallel_linear.h).
#pragma once

#include <ATen/core/Generator.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/types.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "accel/parallel/parallel_linear.h"
#include "accel/parallel/split_dropout.h"
#include "accel/runtime/comm/communicator.h"

namespace examples {

struct GptConfig {
  int64_t vocab_size = 64;
  int64_t block_size = 32;  // The longest sequence.
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 64;
  double dropout = 0.1;
  // Each block's activations are recomputed in backward instead of kept.
  bool activation_checkpointing = false;
};

// How ParallelizeGpt and ContextParallelGpt split the model's tensors over
// ranks: what each layer's communication and each dropout's share follow.
struct GptSplit {
  accel::Communicator* tp = nullptr;  // Tensor parallelism (null: none).
  // The residual stream (LayerNorms, dropouts) split along the sequence
  // over tp as well (Megatron's sequence parallelism).
  bool sequence_parallel = false;
  accel::Communicator* cp = nullptr;  // Context parallelism (null: none).

  // This rank's share of the attention heads (dim 1 of [B, heads, T, T]):
  // tp's share, then cp's share of it.
  std::vector<accel::DropoutShare> HeadShares() const;
  // Its share of the residual stream's sequence (dim 1 of [B, T, C]): cp's
  // part, then tp's part of it under sequence parallelism.
  std::vector<accel::DropoutShare> SequenceShares() const;
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptConfig& config);
  // x: [B, T, C]; mask: [T, T] bool, true where a position may attend
  // (under context or sequence parallelism T is the whole sequence's
  // length, x this rank's part of it).
  torch::Tensor forward(torch::Tensor x, torch::Tensor mask);

  // Heads this rank computes (n_head over tensor parallelism's ranks).
  int64_t local_heads() const;
  // Ulysses' context parallelism over `cp` (null: none).
  void set_context_parallel(accel::Communicator* cp) { split_.cp = cp; }
  void set_split(const GptSplit& split) { split_ = split; }

 private:
  int64_t n_head_;
  GptSplit split_;
  accel::ParallelLinear qkv_{nullptr}, proj_{nullptr};
  torch::nn::Dropout attention_dropout_{nullptr}, residual_dropout_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptConfig& config);
  torch::Tensor forward(torch::Tensor x, torch::Tensor mask);
  CausalSelfAttention& attention() { return attention_; }
  void set_split(const GptSplit& split);

 private:
  GptSplit split_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  CausalSelfAttention attention_{nullptr};
  accel::ParallelLinear fc_{nullptr}, fc_proj_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  explicit GptImpl(const GptConfig& config);
  // tokens: [B, T] int64, T <= block_size; mask: CausalMask(T). Returns
  // the logits, [B, T, vocab_size].
  torch::Tensor forward(torch::Tensor tokens, torch::Tensor mask);
  // With the tokens' positions ([T] or [1, T]): under context parallelism
  // tokens and positions are this rank's part of the sequence
  // (Accelerator::maybe_context_parallel) and mask the whole sequence's.
  torch::Tensor forward(torch::Tensor tokens, torch::Tensor mask,
                        torch::Tensor positions);

  const GptConfig& config() const { return config_; }
  const GptSplit& split() const { return split_; }
  // Gives every block and attention `split` (ParallelizeGpt and
  // ContextParallelGpt call it).
  void set_split(const GptSplit& split);
  // The blocks, in the order forward runs them (to mark them with
  // accel::fully_shard).
  const std::vector<Block>& blocks() const { return block_list_; }
  std::vector<Block>& blocks() { return block_list_; }
  // All parameters (the tied head counts once).
  int64_t parameter_count() const;
  // Those the matrix multiplies use: all but the position embedding (for
  // accel::TransformerTrainingFlopsPerToken).
  int64_t matmul_parameter_count() const;

 private:
  GptConfig config_;
  GptSplit split_;
  torch::nn::Embedding token_embedding_{nullptr};
  torch::nn::Embedding position_embedding_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  std::vector<Block> block_list_;  // The same blocks, typed.
  torch::nn::LayerNorm ln_f_{nullptr};
};
TORCH_MODULE(Gpt);

// Megatron's tensor parallelism of the blocks over `tp` (every rank of it
// alike, before prepare): each attention's q|k|v projection and each
// MLP's first layer column-parallel (a share of the heads, of the hidden
// features), their output projections row-parallel; the embeddings, the
// LayerNorms and the tied head stay whole. With `sequence_parallel`
// (Megatron's sequence parallelism, torch's SequenceParallel) the residual
// stream between the blocks' projections is split along the sequence as
// well: the LayerNorms and dropouts work on this rank's part (their
// parameters' gradients summed over tp in backward), the column-parallel
// layers all-gather the sequence and the row-parallel ones
// reduce-scatter it (in place of an all-reduce), and the final LayerNorm's
// output is gathered before the head; each sequence's length (this rank's
// part of it under context parallelism) must then be a multiple of tp's
// size (so examples::Generate, whose sequences grow a token at a time, needs
// a model parallelized without it). Every dropout of a split tensor keeps its
// share of what one process's dropout would draw (accel::SplitDropout), so that
// tp and cp train as one process does. UsageError when n_head does not split
// over tp's ranks. Returns the layers split (4 per block).
int ParallelizeGpt(GptImpl& gpt, accel::Communicator& tp,
                   bool sequence_parallel = false);

// DeepSpeed-Ulysses' context parallelism of every attention over `cp`
// (accel/parallel/context_parallel.h), after ParallelizeGpt: each rank
// holds a part of every sequence and attends with a share of the heads
// over the whole of it. UsageError when the heads (after tp) do not divide
// over cp. Returns the attentions changed.
int ContextParallelGpt(GptImpl& gpt, accel::Communicator& cp);

// [T, T] bool, lower triangular: position t attends to 0..t.
torch::Tensor CausalMask(int64_t length);

// Mean cross-entropy of next-token prediction: logits [B, T, V] against
// targets [B, T].
torch::Tensor LanguageModelLoss(const torch::Tensor& logits,
                                const torch::Tensor& targets);

// The next token after `logits` ([vocab], one position's): drawn from the
// top_k most likely with `generator` (top_k 1: the most likely).
int64_t SampleNextToken(const torch::Tensor& logits, int64_t top_k,
                        at::Generator& generator);

// `prompt` ([T0] int64) and `count` tokens after it, each sampled from the
// model's logits at the last position given the previous block_size
// tokens. Under ZeRO stage 3 every process must call it alike (each
// forward gathers the units); the same generator seed on every process
// gives every process the same text.
template <typename Model>
torch::Tensor Generate(Model& model, const torch::Tensor& prompt, int64_t count,
                       int64_t block_size, int64_t top_k,
                       at::Generator& generator) {
  torch::NoGradGuard no_grad;
  torch::Tensor tokens = prompt.to(torch::kLong).flatten();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t length = std::min<int64_t>(tokens.size(0), block_size);
    const torch::Tensor context =
        tokens.narrow(0, tokens.size(0) - length, length);
    const torch::Tensor logits =
        model->forward(context.unsqueeze(0), CausalMask(length));
    const int64_t next =
        SampleNextToken(logits[0][length - 1], top_k, generator);
    tokens = torch::cat({tokens, torch::full({1}, next, torch::kLong)});
  }
  return tokens;
}

}  // namespace examples
