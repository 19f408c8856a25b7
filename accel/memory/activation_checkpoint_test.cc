// accel::checkpoint against the same computation without it: gradients bit
// for bit (dropout and bfloat16 autocast included), the bytes kept for
// backward, the RNG restore, InActivationRecompute() and its arguments.
#include "accel/memory/activation_checkpoint.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "accel/memory/host_memory_tracker.h"

namespace accel {
namespace {

// Linear, GELU, dropout, Linear: a transformer's MLP in small.
struct MlpBlockImpl : torch::nn::Module {
  explicit MlpBlockImpl(int64_t width)
      : fc1(register_module("fc1", torch::nn::Linear(width, 2 * width))),
        fc2(register_module("fc2", torch::nn::Linear(2 * width, width))),
        dropout(register_module("dropout", torch::nn::Dropout(0.3))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(dropout(torch::gelu(fc1(x))));
  }
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(MlpBlock);

struct Gradients {
  torch::Tensor loss;
  torch::Tensor input;
  std::vector<torch::Tensor> parameters;
  torch::Tensor next_draw;  // What the RNG gives after backward.
};

void ClearGradients(torch::nn::Module& module) {
  for (torch::Tensor& parameter : module.parameters()) {
    parameter.mutable_grad() = torch::Tensor();
  }
}

// Applies `blocks` in turn to a fixed input, each checkpointed or not, with
// the same seed, and returns the loss and every gradient.
Gradients Train(const std::vector<MlpBlock>& blocks, bool checkpointed,
                ActivationCheckpointOptions options = {}) {
  torch::manual_seed(1);
  const torch::Tensor input = torch::randn({16, 32}).requires_grad_(true);
  for (MlpBlock block : blocks) ClearGradients(*block);
  torch::manual_seed(2);
  torch::Tensor hidden = input;
  for (MlpBlock block : blocks) {
    if (checkpointed) {
      hidden = checkpoint(
          options,
          [block](const torch::Tensor& h) mutable { return block->forward(h); },
          hidden);
    } else {
      hidden = block->forward(hidden);
    }
  }
  const torch::Tensor loss = (hidden * hidden).sum();
  loss.backward();
  Gradients gradients{
      loss.detach(), input.grad().clone(), {}, torch::rand({4})};
  // Each distinct parameter once (a block applied three times shares them).
  std::vector<const torch::TensorImpl*> seen;
  for (MlpBlock block : blocks) {
    for (const torch::Tensor& parameter : block->parameters()) {
      if (std::find(seen.begin(), seen.end(),
                    parameter.unsafeGetTensorImpl()) != seen.end()) {
        continue;
      }
      seen.push_back(parameter.unsafeGetTensorImpl());
      EXPECT_TRUE(parameter.grad().defined());
      gradients.parameters.push_back(parameter.grad().clone());
    }
  }
  return gradients;
}

// How many of `a`'s parameter gradients equal `b`'s, bit for bit.
int EqualParameterGradients(const Gradients& a, const Gradients& b) {
  int equal = 0;
  for (size_t i = 0; i < a.parameters.size(); ++i) {
    if (torch::equal(a.parameters[i], b.parameters[i])) ++equal;
  }
  return equal;
}

TEST(ActivationCheckpointTest, GradientsAreBitIdenticalWithDropout) {
  torch::manual_seed(0);
  MlpBlock block(32);
  block->train();
  // The same block applied three times: each recompute adds to the shared
  // parameters' .grad, as the three uses do in one graph.
  const std::vector<MlpBlock> blocks = {block, block, block};
  const Gradients plain = Train(blocks, /*checkpointed=*/false);
  const Gradients checkpointed = Train(blocks, /*checkpointed=*/true);
  ASSERT_EQ(plain.parameters.size(), 4u);
  ASSERT_EQ(checkpointed.parameters.size(), 4u);
  EXPECT_TRUE(torch::equal(plain.loss, checkpointed.loss));
  EXPECT_TRUE(torch::equal(plain.input, checkpointed.input));
  EXPECT_EQ(EqualParameterGradients(plain, checkpointed), 4);
  // The recompute's draws were undone: the program's next ones are those
  // it would have had without checkpointing.
  EXPECT_TRUE(torch::equal(plain.next_draw, checkpointed.next_draw));
  // Dropout did act: another seed changes the gradients.
  torch::manual_seed(3);
  const torch::Tensor other = block->forward(torch::ones({16, 32}));
  torch::manual_seed(3);
  EXPECT_TRUE(torch::equal(other, block->forward(torch::ones({16, 32}))));
  torch::manual_seed(4);
  EXPECT_FALSE(torch::equal(other, block->forward(torch::ones({16, 32}))));
  std::printf("loss %.6f, |input grad| %.6f, 4/4 parameter gradients equal\n",
              plain.loss.item<float>(), plain.input.norm().item<float>());
}

TEST(ActivationCheckpointTest, WithoutPreservingRngStateDropoutDiffers) {
  torch::manual_seed(0);
  MlpBlock block(32);
  block->train();
  const std::vector<MlpBlock> blocks = {block, block, block};
  const Gradients plain = Train(blocks, /*checkpointed=*/false);
  ActivationCheckpointOptions options;
  options.preserve_rng_state = false;
  const Gradients unrestored = Train(blocks, /*checkpointed=*/true, options);
  // Forward is the same (same draws), backward used other masks.
  EXPECT_TRUE(torch::equal(plain.loss, unrestored.loss));
  EXPECT_FALSE(torch::equal(plain.input, unrestored.input));
  const int equal = EqualParameterGradients(plain, unrestored);
  EXPECT_EQ(equal, 0);
  std::printf(
      "preserve_rng_state=false: %d/4 parameter gradients equal, "
      "input gradients differ by %.4f (max abs)\n",
      equal, (plain.input - unrestored.input).abs().max().item<float>());
}

// Bytes held after forward, over those held before, for an 8-layer
// 512-wide block on a batch of 256.
TEST(ActivationCheckpointTest, KeepsFarFewerBytesForBackward) {
  HostMemoryTracker& memory = HostMemoryTracker::Install();
  torch::manual_seed(0);
  torch::nn::Sequential wide;
  for (int i = 0; i < 8; ++i) {
    wide->push_back(torch::nn::Linear(512, 512));
    wide->push_back(torch::nn::GELU());
  }
  const torch::Tensor input = torch::randn({256, 512}).requires_grad_(true);
  auto fn = [wide](const torch::Tensor& x) mutable { return wide->forward(x); };
  {
    torch::NoGradGuard warm_up;  // Kernels' one-time buffers, if any.
    fn(input);
  }
  auto kept_bytes = [&](bool checkpointed, torch::Tensor& input_grad) {
    ClearGradients(*wide);
    input.mutable_grad() = torch::Tensor();
    const int64_t before = memory.held_bytes();
    torch::Tensor output = checkpointed ? checkpoint(fn, input) : fn(input);
    const int64_t kept = memory.held_bytes() - before;
    output.sum().backward();
    input_grad = input.grad().clone();
    return kept;
  };
  torch::Tensor plain_grad;
  torch::Tensor checkpointed_grad;
  const int64_t plain = kept_bytes(false, plain_grad);
  const int64_t checkpointed = kept_bytes(true, checkpointed_grad);
  const double ratio = static_cast<double>(checkpointed) / plain;
  std::printf(
      "kept for backward: %lld bytes without checkpointing, %lld with "
      "(ratio %.4f; the output alone is %lld)\n",
      static_cast<long long>(plain), static_cast<long long>(checkpointed),
      ratio, static_cast<long long>(256 * 512 * 4));
  // Without: each Linear's and GELU's input, 16 x 512 KiB, and the output.
  EXPECT_GE(plain, 16 * 256 * 512 * 4);
  EXPECT_LE(ratio, 0.25);
  EXPECT_TRUE(torch::equal(plain_grad, checkpointed_grad));
}

TEST(ActivationCheckpointTest, InActivationRecomputeOnlyWhileFnReruns) {
  torch::manual_seed(0);
  torch::nn::Linear linear(8, 8);
  std::vector<bool> in_fn;
  std::vector<bool> in_hook;
  linear->weight.register_hook([&](const torch::Tensor& grad) {
    in_hook.push_back(InActivationRecompute());
    return grad;
  });
  const torch::Tensor x = torch::randn({4, 8}).requires_grad_(true);
  EXPECT_FALSE(InActivationRecompute());
  torch::Tensor y = checkpoint(
      [&](const torch::Tensor& h) {
        in_fn.push_back(InActivationRecompute());
        return linear->forward(h).tanh();
      },
      x);
  EXPECT_EQ(in_fn, std::vector<bool>({false}));  // Forward's run.
  y.sum().backward();
  EXPECT_EQ(in_fn, std::vector<bool>({false, true}));  // And the recompute.
  EXPECT_EQ(in_hook, std::vector<bool>({false}));      // Gradients flow after.
  EXPECT_FALSE(InActivationRecompute());

  // A recompute that throws leaves the flag, the RNG and autocast as they
  // were.
  torch::Tensor z = checkpoint(
      [&](const torch::Tensor& h) {
        torch::rand({1});
        if (InActivationRecompute()) throw std::runtime_error("recompute");
        return linear->forward(h);
      },
      x);
  torch::manual_seed(5);
  const torch::Tensor expected = torch::rand({4});
  torch::manual_seed(5);
  EXPECT_THROW(z.sum().backward(), std::exception);
  EXPECT_FALSE(InActivationRecompute());
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
}

TEST(ActivationCheckpointTest, OtherArgumentsPassThroughAndSeveralOutputs) {
  torch::manual_seed(0);
  const torch::Tensor x = torch::randn({5, 3}).requires_grad_(true);
  const torch::Tensor w = torch::randn({3, 3}).requires_grad_(true);
  const torch::Tensor bias = torch::randn({3});  // Requires no grad.
  auto fn = [](const torch::Tensor& input, double scale,
               const torch::Tensor& constant, const torch::Tensor& weight,
               int64_t power) {
    const torch::Tensor h = input.matmul(weight) * scale + constant;
    return std::make_tuple(h.pow(power), h.sin(), h.argmax(1));
  };
  auto run = [&](bool checkpointed) {
    x.mutable_grad() = torch::Tensor();
    w.mutable_grad() = torch::Tensor();
    auto [a, b, index] = checkpointed ? checkpoint(fn, x, 0.5, bias, w, 3)
                                      : fn(x, 0.5, bias, w, 3);
    EXPECT_TRUE(a.requires_grad());
    EXPECT_FALSE(index.requires_grad());  // Integral: no gradient.
    (a.sum() + b.sum()).backward();
    EXPECT_FALSE(bias.grad().defined());
    return std::make_tuple(a.detach(), index, x.grad().clone(),
                           w.grad().clone());
  };
  const auto plain = run(false);
  const auto checkpointed = run(true);
  EXPECT_TRUE(torch::equal(std::get<0>(plain), std::get<0>(checkpointed)));
  EXPECT_TRUE(torch::equal(std::get<1>(plain), std::get<1>(checkpointed)));
  EXPECT_TRUE(torch::equal(std::get<2>(plain), std::get<2>(checkpointed)));
  EXPECT_TRUE(torch::equal(std::get<3>(plain), std::get<3>(checkpointed)));

  // A vector of outputs, of which backward reaches only one.
  std::vector<torch::Tensor> outputs = checkpoint(
      [](const torch::Tensor& input) {
        return std::vector<torch::Tensor>{input * 2, input * 3};
      },
      x);
  ASSERT_EQ(outputs.size(), 2u);
  x.mutable_grad() = torch::Tensor();
  outputs[1].sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({5, 3}, 3.0)));
}

TEST(ActivationCheckpointTest, WithoutGradOrGradRequiringInputsFnJustRuns) {
  torch::manual_seed(0);
  torch::nn::Linear linear(3, 3);
  const torch::Tensor data = torch::randn({2, 3});  // Requires no grad.
  auto fn = [linear](const torch::Tensor& x) mutable {
    return linear->forward(x);
  };
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor y = checkpoint(fn, data);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(torch::equal(y, linear->forward(data)));
  }
  // No input requires grad: fn runs as is, and the parameters still get
  // their gradients.
  const torch::Tensor y = checkpoint(fn, data);
  EXPECT_TRUE(y.requires_grad());
  y.sum().backward();
  ASSERT_TRUE(linear->weight.grad().defined());
  EXPECT_TRUE(
      torch::allclose(linear->weight.grad(), data.sum(0).expand({3, 3})));
}

TEST(ActivationCheckpointTest, SecondBackwardNeedsRetainGraph) {
  torch::manual_seed(0);
  const torch::Tensor x = torch::randn({4}).requires_grad_(true);
  auto fn = [](const torch::Tensor& h) { return h.exp(); };
  torch::Tensor y = checkpoint(fn, x).sum();
  y.backward();
  try {
    y.backward();
    ADD_FAILURE() << "a second backward through freed inputs ran";
  } catch (const c10::Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("accel::checkpoint"), std::string::npos) << message;
    EXPECT_NE(message.find("retain_graph"), std::string::npos) << message;
  }
  // With retain_graph, twice is twice the gradient.
  x.mutable_grad() = torch::Tensor();
  torch::Tensor twice = checkpoint(fn, x).sum();
  twice.backward({}, /*retain_graph=*/true);
  twice.backward();
  EXPECT_TRUE(torch::allclose(x.grad(), 2 * x.exp()));

  // torch::autograd::grad would stop short of the parameters inside.
  torch::Tensor z = checkpoint(fn, x).sum();
  EXPECT_THROW(torch::autograd::grad({z}, {x}), c10::Error);
}

// Autocast's per-thread settings for as long as it lives.
class CpuAutocast {
 public:
  CpuAutocast() {
    at::autocast::set_autocast_cpu_dtype(torch::kBFloat16);
    at::autocast::set_cpu_enabled(true);
  }
  ~CpuAutocast() {
    at::autocast::set_cpu_enabled(false);
    at::autocast::clear_cache();
  }
};

TEST(ActivationCheckpointTest, CpuAutocastBf16GradientsAreIdentical) {
  torch::manual_seed(0);
  // Three blocks: with autocast's cache, a weight used by several
  // applications would be cast once in one graph but once per recompute.
  const std::vector<MlpBlock> blocks = {MlpBlock(32), MlpBlock(32),
                                        MlpBlock(32)};
  auto train = [&](bool checkpointed) {
    torch::manual_seed(1);
    const torch::Tensor input = torch::randn({16, 32}).requires_grad_(true);
    for (MlpBlock block : blocks) ClearGradients(*block);
    torch::manual_seed(2);
    torch::Tensor loss;
    {
      CpuAutocast autocast;
      torch::Tensor hidden = input;
      for (MlpBlock block : blocks) {
        if (checkpointed) {
          hidden = checkpoint(
              [block](const torch::Tensor& h) mutable {
                return block->forward(h);
              },
              hidden);
        } else {
          hidden = block->forward(hidden);
        }
      }
      EXPECT_EQ(hidden.scalar_type(), torch::kBFloat16);
      loss = hidden.to(torch::kFloat).pow(2).mean();
    }
    loss.backward();  // Outside autocast, as a training loop does.
    std::vector<torch::Tensor> gradients = {input.grad().clone()};
    for (MlpBlock block : blocks) {
      for (const torch::Tensor& parameter : block->parameters()) {
        EXPECT_TRUE(parameter.grad().defined());
        gradients.push_back(parameter.grad().clone());
      }
    }
    return gradients;
  };
  const std::vector<torch::Tensor> plain = train(false);
  const std::vector<torch::Tensor> checkpointed = train(true);
  ASSERT_EQ(plain.size(), checkpointed.size());
  int equal = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(plain[i].scalar_type(), torch::kFloat32);
    if (torch::equal(plain[i], checkpointed[i])) ++equal;
  }
  EXPECT_EQ(equal, static_cast<int>(plain.size()));
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
  std::printf("autocast bf16: %d/%zu gradients equal\n", equal, plain.size());

  // Forward's run is without grad, and LibTorch caches the cast of a leaf
  // that requires grad (a weight, here also the input) whatever the grad
  // mode: cached there, it would carry no grad_fn, and a later use of the
  // same leaf in the same autocast region would reuse it and give the leaf
  // no gradient.
  const torch::Tensor x = torch::randn({4, 32}).requires_grad_(true);
  const torch::Tensor w = torch::randn({32, 32}).requires_grad_(true);
  auto reuse = [&](bool checkpointed) {
    x.mutable_grad() = torch::Tensor();
    w.mutable_grad() = torch::Tensor();
    auto mm = [](const torch::Tensor& a, const torch::Tensor& b) {
      return torch::mm(a, b);
    };
    {
      CpuAutocast autocast;
      if (checkpointed) {
        checkpoint(mm, x, w);
      } else {
        mm(x, w);
      }
      const torch::Tensor out = mm(x, w);
      EXPECT_TRUE(out.requires_grad());
      if (out.requires_grad()) out.to(torch::kFloat).sum().backward();
    }
    EXPECT_TRUE(x.grad().defined());
    EXPECT_TRUE(w.grad().defined());
    return std::make_pair(x.grad(), w.grad());
  };
  const auto reference = reuse(false);
  const auto after_checkpoint = reuse(true);
  if (after_checkpoint.first.defined() && after_checkpoint.second.defined()) {
    EXPECT_TRUE(torch::equal(reference.first, after_checkpoint.first));
    EXPECT_TRUE(torch::equal(reference.second, after_checkpoint.second));
  }
}

}  // namespace
}  // namespace accel
