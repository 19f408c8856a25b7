#include "accel/parallel/tensor_parallel.h"

#include <torch/autograd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "accel/core/tensor_ops.h"
#include "accel/runtime/base/errors.h"

namespace accel::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels through autograd's saved data as its address: the
// group outlives the graph (the mesh owns it).
int64_t Handle(Communicator& group) {
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(&group));
}
Communicator& GroupOf(AutogradContext* ctx) {
  return *reinterpret_cast<Communicator*>(
      static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
}

CollectiveOptions Named(const char* api) {
  CollectiveOptions options;
  options.api = api;
  return options;
}

torch::Tensor AllReduceSum(const torch::Tensor& x, Communicator& group,
                           const char* api) {
  torch::Tensor sum = x.contiguous().clone();
  if (sum.numel() > 0) {
    group.allreduce(sum.data_ptr(), static_cast<size_t>(sum.numel()),
                    ToDType(sum.scalar_type()), ReduceOp::kSum, Named(api));
  }
  return sum;
}

int64_t Dim(const torch::Tensor& x, int64_t dim) {
  return dim < 0 ? dim + x.dim() : dim;
}

// Every rank's `x` concatenated along `dim`, in rank order.
torch::Tensor AllGather(const torch::Tensor& x, Communicator& group,
                        int64_t dim, const char* api) {
  dim = Dim(x, dim);
  const torch::Tensor moved = x.movedim(dim, 0).contiguous();
  std::vector<int64_t> sizes = moved.sizes().vec();
  sizes[0] *= group.size();
  torch::Tensor all = torch::empty(sizes, moved.options());
  if (moved.numel() > 0) {
    group.allgather(moved.data_ptr(), all.data_ptr(),
                    static_cast<size_t>(moved.numel()),
                    ToDType(moved.scalar_type()), Named(api));
  }
  return all.movedim(0, dim);
}

void RequireDivisible(const torch::Tensor& x, int64_t dim, Communicator& group,
                      const char* api) {
  const int size = group.size();
  if (x.size(dim) % size != 0) {
    throw UsageError(std::string(api) + ": dimension " + std::to_string(dim) +
                     " of a tensor of shape " + c10::str(x.sizes()) +
                     " does not split evenly over the " + std::to_string(size) +
                     " ranks of " +
                     (group.group_name().empty()
                          ? std::string("the job")
                          : "group '" + group.group_name() + "'"));
  }
}

// This rank's slice of `x` along `dim`.
torch::Tensor Slice(const torch::Tensor& x, Communicator& group, int64_t dim,
                    const char* api) {
  dim = Dim(x, dim);
  RequireDivisible(x, dim, group, api);
  const int64_t part = x.size(dim) / group.size();
  return x.narrow(dim, part * group.rank(), part).contiguous();
}

// The sum over the group, of which this rank keeps its slice along `dim`.
torch::Tensor ReduceScatter(const torch::Tensor& x, Communicator& group,
                            int64_t dim, const char* api) {
  dim = Dim(x, dim);
  RequireDivisible(x, dim, group, api);
  const torch::Tensor moved = x.movedim(dim, 0).contiguous();
  std::vector<int64_t> sizes = moved.sizes().vec();
  sizes[0] /= group.size();
  torch::Tensor mine = torch::empty(sizes, moved.options());
  const size_t count = static_cast<size_t>(mine.numel());
  if (moved.numel() > 0) {
    group.reduce_scatter(moved.data_ptr(), mine.data_ptr(),
                         std::vector<size_t>(group.size(), count),
                         ToDType(moved.scalar_type()), ReduceOp::kSum,
                         Named(api));
  }
  return mine.movedim(0, dim);
}

// One autograd function per pair of conjugate collectives: Forward and
// Backward name the two operations (each taking the tensor, the group and
// the dimension).
using Operation = torch::Tensor (*)(const torch::Tensor&, Communicator&,
                                    int64_t, const char*);

torch::Tensor Identity(const torch::Tensor& x, Communicator&, int64_t,
                       const char*) {
  return x;
}
torch::Tensor Sum(const torch::Tensor& x, Communicator& group, int64_t,
                  const char* api) {
  return AllReduceSum(x, group, api);
}

// What a failed collective's error calls each direction of a function:
// the function the model called, and whether in its forward or (through
// autograd) its backward.
struct Names {
  const char* forward;
  const char* backward;
};
constexpr Names kCopyToRegion{"tp::CopyToRegion forward",
                              "tp::CopyToRegion backward"};
constexpr Names kReduceFromRegion{"tp::ReduceFromRegion forward",
                                  "tp::ReduceFromRegion backward"};
constexpr Names kGatherFromRegion{"tp::GatherFromRegion forward",
                                  "tp::GatherFromRegion backward"};
constexpr Names kScatterToRegion{"tp::ScatterToRegion forward",
                                 "tp::ScatterToRegion backward"};
constexpr Names kGatherSequence{"tp::GatherSequence forward",
                                "tp::GatherSequence backward"};
constexpr Names kReduceScatterSequence{"tp::ReduceScatterSequence forward",
                                       "tp::ReduceScatterSequence backward"};

template <Operation kForward, Operation kBackward, const Names& kNames>
struct Conjugate
    : torch::autograd::Function<Conjugate<kForward, kBackward, kNames>> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               int64_t group, int64_t dim) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    Communicator& comm =
        *reinterpret_cast<Communicator*>(static_cast<intptr_t>(group));
    return kForward(x, comm, dim, kNames.forward);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const torch::Tensor grad =
        kBackward(grads[0], GroupOf(ctx), ctx->saved_data["dim"].toInt(),
                  kNames.backward);
    return {grad, torch::Tensor(), torch::Tensor()};
  }
};

template <Operation kForward, Operation kBackward, const Names& kNames>
torch::Tensor Apply(const torch::Tensor& x, Communicator& group, int64_t dim) {
  if (group.size() == 1) return x;
  return Conjugate<kForward, kBackward, kNames>::apply(x, Handle(group), dim);
}

// In place: the values of `x` reduced with `op` over the group.
void AllReduceInPlace(torch::Tensor& x, Communicator& group, ReduceOp op,
                      const char* api) {
  if (x.numel() == 0 || group.size() == 1) return;
  group.allreduce(x.data_ptr(), static_cast<size_t>(x.numel()),
                  ToDType(x.scalar_type()), op, Named(api));
}

struct CrossEntropy : torch::autograd::Function<CrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx,
                               const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t group) {
    Communicator& comm =
        *reinterpret_cast<Communicator*>(static_cast<intptr_t>(group));
    torch::NoGradGuard no_grad;
    const int64_t columns = logits.size(1);
    const int64_t first = columns * comm.rank();
    const int64_t vocabulary = columns * comm.size();
    if (targets.numel() > 0 && (targets.min().item<int64_t>() < 0 ||
                                targets.max().item<int64_t>() >= vocabulary)) {
      throw UsageError(
          "VocabParallelCrossEntropy: a target is outside the vocabulary [0, " +
          std::to_string(vocabulary) + ") (" + std::to_string(columns) +
          " columns on each of " + std::to_string(comm.size()) + " ranks)");
    }
    const char* api = "tp::VocabParallelCrossEntropy forward";
    torch::Tensor max = std::get<0>(logits.max(1)).contiguous();
    AllReduceInPlace(max, comm, ReduceOp::kMax, api);
    const torch::Tensor shifted = logits - max.unsqueeze(1);
    torch::Tensor exp = shifted.exp();
    torch::Tensor sum = exp.sum(1).contiguous();
    AllReduceInPlace(sum, comm, ReduceOp::kSum, api);
    const torch::Tensor local = targets - first;
    const torch::Tensor held = (local >= 0) & (local < columns);
    const torch::Tensor index = local.clamp(0, columns - 1).unsqueeze(1);
    torch::Tensor picked = shifted.gather(1, index)
                               .squeeze(1)
                               .mul(held.to(shifted.dtype()))
                               .contiguous();
    AllReduceInPlace(picked, comm, ReduceOp::kSum, api);
    ctx->save_for_backward({exp.div_(sum.unsqueeze(1)), index, held});
    return (sum.log() - picked).mean();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    torch::Tensor grad = saved[0].clone();  // softmax
    const torch::Tensor& index = saved[1];
    const torch::Tensor& held = saved[2];
    grad.scatter_add_(1, index, -held.to(grad.dtype()).unsqueeze(1));
    grad.mul_(grads[0] / static_cast<double>(grad.size(0)));
    return {grad, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor VocabParallelEmbedding(const torch::Tensor& tokens,
                                     const torch::Tensor& weight,
                                     Communicator& group) {
  const int64_t rows = weight.size(0);
  const torch::Tensor local = tokens - rows * group.rank();
  const torch::Tensor held = (local >= 0) & (local < rows);
  torch::Tensor looked_up = torch::embedding(weight, local.clamp(0, rows - 1));
  looked_up = looked_up * held.unsqueeze(-1).to(looked_up.dtype());
  return ReduceFromRegion(looked_up, group);
}

torch::Tensor VocabParallelCrossEntropy(const torch::Tensor& logits,
                                        const torch::Tensor& targets,
                                        Communicator& group) {
  if (logits.dim() != 2 || targets.dim() != 1 ||
      targets.size(0) != logits.size(0)) {
    throw UsageError(
        "VocabParallelCrossEntropy: expected logits [N, V / tp] and targets "
        "[N], found " +
        c10::str(logits.sizes()) + " and " + c10::str(targets.sizes()));
  }
  return CrossEntropy::apply(logits, targets, Handle(group));
}

torch::Tensor CopyToRegion(const torch::Tensor& x, Communicator& group) {
  return Apply<Identity, Sum, kCopyToRegion>(x, group, 0);
}

torch::Tensor ReduceFromRegion(const torch::Tensor& x, Communicator& group) {
  return Apply<Sum, Identity, kReduceFromRegion>(x, group, 0);
}

torch::Tensor GatherFromRegion(const torch::Tensor& x, Communicator& group,
                               int64_t dim) {
  return Apply<AllGather, Slice, kGatherFromRegion>(x, group, Dim(x, dim));
}

torch::Tensor ScatterToRegion(const torch::Tensor& x, Communicator& group,
                              int64_t dim) {
  return Apply<Slice, AllGather, kScatterToRegion>(x, group, Dim(x, dim));
}

torch::Tensor GatherSequence(const torch::Tensor& x, Communicator& group,
                             int64_t dim) {
  return Apply<AllGather, ReduceScatter, kGatherSequence>(x, group,
                                                          Dim(x, dim));
}

torch::Tensor ReduceScatterSequence(const torch::Tensor& x, Communicator& group,
                                    int64_t dim) {
  return Apply<ReduceScatter, AllGather, kReduceScatterSequence>(x, group,
                                                                 Dim(x, dim));
}

}  // namespace accel::tp
