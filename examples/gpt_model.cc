#include "examples/gpt_model.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/functional/normalization.h>

#include <cmath>
#include <limits>
#include <string>

#include "accel/accelerator.h"
#include "accel/parallel/context_parallel.h"
#include "accel/parallel/tensor_parallel.h"

namespace examples {
namespace {

// A LayerNorm of this rank's part of the sequence under sequence
// parallelism: its parameters' gradients summed over tp in backward (each
// rank's is its part's), as one process's are the whole sequence's.
torch::Tensor Norm(torch::nn::LayerNorm& norm, const torch::Tensor& x,
                   const GptSplit& split) {
  if (!split.sequence_parallel) return norm(x);
  namespace F = torch::nn::functional;
  return F::layer_norm(
      x, F::LayerNormFuncOptions(norm->options.normalized_shape())
             .weight(accel::tp::CopyToRegion(norm->weight, *split.tp))
             .bias(accel::tp::CopyToRegion(norm->bias, *split.tp))
             .eps(norm->options.eps()));
}

torch::Tensor Dropout(const torch::nn::Dropout& dropout, const torch::Tensor& x,
                      const std::vector<accel::DropoutShare>& shares) {
  return accel::SplitDropout(x, dropout->options.p(), dropout->is_training(),
                             shares);
}

accel::DropoutShare ShareOf(const accel::Communicator& group) {
  return {.dim = 1, .index = group.rank(), .count = group.size()};
}

}  // namespace

std::vector<accel::DropoutShare> GptSplit::HeadShares() const {
  std::vector<accel::DropoutShare> shares;
  if (tp != nullptr) shares.push_back(ShareOf(*tp));
  if (cp != nullptr) shares.push_back(ShareOf(*cp));
  return shares;
}

std::vector<accel::DropoutShare> GptSplit::SequenceShares() const {
  std::vector<accel::DropoutShare> shares;
  if (cp != nullptr) shares.push_back(ShareOf(*cp));
  if (sequence_parallel) shares.push_back(ShareOf(*tp));
  return shares;
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& config)
    : n_head_(config.n_head) {
  qkv_ = register_module(
      "qkv", accel::ParallelLinear(config.n_embd, 3 * config.n_embd));
  proj_ = register_module("proj",
                          accel::ParallelLinear(config.n_embd, config.n_embd));
  attention_dropout_ =
      register_module("attention_dropout", torch::nn::Dropout(config.dropout));
  residual_dropout_ =
      register_module("residual_dropout", torch::nn::Dropout(config.dropout));
}

torch::Tensor CausalSelfAttentionImpl::forward(torch::Tensor x,
                                               torch::Tensor mask) {
  const int64_t head = qkv_->options.in_features() / n_head_;
  // [B, T, 3C] -> q, k, v of [B, T, heads, head]; under tensor parallelism
  // this rank's share of the heads (3C / tp features); under sequence
  // parallelism qkv_ gathers the sequence (x held this rank's part).
  const torch::Tensor all = qkv_(x);
  const int64_t batch = all.size(0), length = all.size(1);
  const int64_t local = all.size(2) / 3;
  auto split = all.split(local, 2);
  // Under context parallelism T is this rank's part of the sequence: each
  // rank trades it for the whole sequence of a share of the heads.
  auto heads = [&](const torch::Tensor& t) {
    torch::Tensor h = t.view({batch, length, local / head, head});
    if (split_.cp != nullptr) {
      h = accel::cp::SequenceToHeads(h, *split_.cp, 1, 2);
    }
    return h.transpose(1, 2);  // [B, heads, T, head]
  };
  const torch::Tensor q = heads(split[0]), k = heads(split[1]),
                      v = heads(split[2]);
  if (mask.dim() != 2 || mask.size(0) != q.size(2) ||
      mask.size(1) != q.size(2)) {
    throw accel::UsageError(
        "GPT attention: a mask of shape " + c10::str(mask.sizes()) +
        " for a sequence of " + std::to_string(q.size(2)) + " positions" +
        (split_.cp == nullptr
             ? " (with a sequence cut by maybe_context_parallel, call "
               "examples::ContextParallelGpt first)"
             : ""));
  }
  torch::Tensor scores =
      torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(head));
  scores = scores.masked_fill(mask.logical_not(),
                              -std::numeric_limits<float>::infinity());
  const torch::Tensor weights =
      Dropout(attention_dropout_, torch::softmax(scores, /*dim=*/-1),
              split_.HeadShares());
  torch::Tensor y = torch::matmul(weights, v).transpose(1, 2);
  if (split_.cp != nullptr) {
    y = accel::cp::HeadsToSequence(y, *split_.cp, 1, 2);
  }
  return Dropout(residual_dropout_,
                 proj_(y.contiguous().view({batch, length, local})),
                 split_.SequenceShares());
}

int64_t CausalSelfAttentionImpl::local_heads() const {
  return qkv_->weight.size(0) / 3 / (qkv_->options.in_features() / n_head_);
}

BlockImpl::BlockImpl(const GptConfig& config) {
  ln1_ = register_module(
      "ln1",
      torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})));
  attention_ = register_module("attention", CausalSelfAttention(config));
  ln2_ = register_module(
      "ln2",
      torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})));
  fc_ = register_module(
      "fc", accel::ParallelLinear(config.n_embd, 4 * config.n_embd));
  fc_proj_ = register_module(
      "fc_proj", accel::ParallelLinear(4 * config.n_embd, config.n_embd));
  dropout_ = register_module("dropout", torch::nn::Dropout(config.dropout));
}

void BlockImpl::set_split(const GptSplit& split) {
  split_ = split;
  attention_->set_split(split);
}

torch::Tensor BlockImpl::forward(torch::Tensor x, torch::Tensor mask) {
  x = x + attention_(Norm(ln1_, x, split_), mask);
  return x + Dropout(dropout_,
                     fc_proj_(torch::gelu(fc_(Norm(ln2_, x, split_)))),
                     split_.SequenceShares());
}

GptImpl::GptImpl(const GptConfig& config) : config_(config) {
  if (config.n_embd % config.n_head != 0) {
    throw accel::UsageError("GPT: n_embd (" + std::to_string(config.n_embd) +
                            ") must be a multiple of n_head (" +
                            std::to_string(config.n_head) + ")");
  }
  token_embedding_ =
      register_module("token_embedding",
                      torch::nn::Embedding(config.vocab_size, config.n_embd));
  position_embedding_ =
      register_module("position_embedding",
                      torch::nn::Embedding(config.block_size, config.n_embd));
  dropout_ = register_module("dropout", torch::nn::Dropout(config.dropout));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.n_layer; ++i) {
    block_list_.emplace_back(config);
    blocks_->push_back(block_list_.back());
  }
  ln_f_ = register_module(
      "ln_f",
      torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})));
  // GPT-2's initialisation: N(0, 0.02) for weights and embeddings.
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    if (p.key().find("weight") != std::string::npos && p.value().dim() == 2) {
      p.value().normal_(0.0, 0.02);
    } else if (p.key().find("ln") == std::string::npos) {
      p.value().zero_();
    }
  }
}

torch::Tensor GptImpl::forward(torch::Tensor tokens, torch::Tensor mask) {
  return forward(
      tokens, mask,
      torch::arange(tokens.size(1), tokens.options().dtype(torch::kLong)));
}

torch::Tensor GptImpl::forward(torch::Tensor tokens, torch::Tensor mask,
                               torch::Tensor positions) {
  const int64_t last =
      positions.numel() == 0 ? -1 : positions.max().item<int64_t>();
  if (tokens.size(1) > config_.block_size || last >= config_.block_size) {
    throw accel::UsageError(
        "GPT: a sequence of " + std::to_string(tokens.size(1)) +
        " tokens (positions up to " + std::to_string(last) +
        ") is longer than block_size " + std::to_string(config_.block_size));
  }
  torch::Tensor x = token_embedding_(tokens) + position_embedding_(positions);
  if (split_.sequence_parallel) {
    if (x.size(1) % split_.tp->size() != 0) {
      throw accel::UsageError(
          "GPT: sequence parallelism over " +
          std::to_string(split_.tp->size()) +
          " tensor-parallel ranks splits each sequence, but this rank's are " +
          std::to_string(x.size(1)) +
          " token(s) long; make the sequence length (over cp_size) a "
          "multiple of tp_size (a sequence-parallel model cannot take the "
          "growing sequences of examples::Generate)");
    }
    x = accel::tp::ScatterToRegion(x, *split_.tp, 1);
  }
  x = Dropout(dropout_, x, split_.SequenceShares());
  for (Block& block : block_list_) {
    if (config_.activation_checkpointing) {
      // The function runs again in backward, after this forward has
      // returned: the mask goes in as an argument (kept until then), not
      // by a reference to this frame's copy.
      x = accel::checkpoint(
          [&block](const torch::Tensor& input, const torch::Tensor& causal) {
            return accel::forward(block, input, causal);
          },
          x, mask);
    } else {
      x = accel::forward(block, x, mask);
    }
  }
  x = Norm(ln_f_, x, split_);
  if (split_.sequence_parallel) {
    x = accel::tp::GatherFromRegion(x, *split_.tp, 1);
  }
  // The head is the token embedding, transposed (weight tying): one
  // parameter, so the optimizer, the gradient sync and ZeRO see it once.
  return torch::nn::functional::linear(x, token_embedding_->weight);
}

void GptImpl::set_split(const GptSplit& split) {
  split_ = split;
  for (Block& block : block_list_) block->set_split(split);
}

int ParallelizeGpt(GptImpl& gpt, accel::Communicator& tp,
                   bool sequence_parallel) {
  if (gpt.config().n_head % tp.size() != 0) {
    throw accel::UsageError(
        "GPT: tensor parallelism over " + std::to_string(tp.size()) +
        " ranks splits the attention heads, but n_head is " +
        std::to_string(gpt.config().n_head) + "; give a tp_size dividing it");
  }
  const bool sequence = sequence_parallel && tp.size() > 1;
  const int split = accel::parallelize_module(
      gpt, tp,
      {{"blocks.*.attention.qkv",
        accel::ColwiseParallel{.fused = 3, .sequence_parallel = sequence}},
       {"blocks.*.attention.proj",
        accel::RowwiseParallel{.sequence_parallel = sequence}},
       {"blocks.*.fc", accel::ColwiseParallel{.sequence_parallel = sequence}},
       {"blocks.*.fc_proj",
        accel::RowwiseParallel{.sequence_parallel = sequence}}});
  GptSplit layout = gpt.split();
  layout.tp = tp.size() > 1 ? &tp : nullptr;
  layout.sequence_parallel = sequence;
  gpt.set_split(layout);
  return split;
}

int ContextParallelGpt(GptImpl& gpt, accel::Communicator& cp) {
  for (Block& block : gpt.blocks()) {
    const int64_t heads = block->attention()->local_heads();
    if (heads % cp.size() != 0) {
      throw accel::UsageError(
          "GPT: context parallelism over " + std::to_string(cp.size()) +
          " ranks splits each rank's " + std::to_string(heads) +
          " attention head(s) (n_head " + std::to_string(gpt.config().n_head) +
          " over tensor parallelism); give a cp_size dividing it");
    }
  }
  GptSplit layout = gpt.split();
  layout.cp = cp.size() > 1 ? &cp : nullptr;
  gpt.set_split(layout);
  return static_cast<int>(gpt.blocks().size());
}

int64_t GptImpl::parameter_count() const {
  int64_t count = 0;
  for (const auto& p : parameters()) count += p.numel();
  return count;
}

int64_t GptImpl::matmul_parameter_count() const {
  return parameter_count() - position_embedding_->weight.numel();
}

int64_t SampleNextToken(const torch::Tensor& logits, int64_t top_k,
                        at::Generator& generator) {
  const auto [values, indices] =
      logits.to(torch::kFloat)
          .topk(std::clamp<int64_t>(top_k, 1, logits.size(-1)));
  const torch::Tensor probabilities = torch::softmax(values, -1);
  const int64_t pick =
      torch::multinomial(probabilities, 1, /*replacement=*/false, generator)
          .item<int64_t>();
  return indices[pick].item<int64_t>();
}

torch::Tensor CausalMask(int64_t length) {
  return torch::ones({length, length}, torch::kBool).tril();
}

torch::Tensor LanguageModelLoss(const torch::Tensor& logits,
                                const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

}  // namespace examples
