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

template <Operation kForward, Operation kBackward>
struct Conjugate : torch::autograd::Function<Conjugate<kForward, kBackward>> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               int64_t group, int64_t dim) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    Communicator& comm =
        *reinterpret_cast<Communicator*>(static_cast<intptr_t>(group));
    return kForward(x, comm, dim, "tensor parallel forward");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const torch::Tensor grad =
        kBackward(grads[0], GroupOf(ctx), ctx->saved_data["dim"].toInt(),
                  "tensor parallel backward");
    return {grad, torch::Tensor(), torch::Tensor()};
  }
};

template <Operation kForward, Operation kBackward>
torch::Tensor Apply(const torch::Tensor& x, Communicator& group, int64_t dim) {
  if (group.size() == 1) return x;
  return Conjugate<kForward, kBackward>::apply(x, Handle(group), dim);
}

}  // namespace

torch::Tensor CopyToRegion(const torch::Tensor& x, Communicator& group) {
  return Apply<Identity, Sum>(x, group, 0);
}

torch::Tensor ReduceFromRegion(const torch::Tensor& x, Communicator& group) {
  return Apply<Sum, Identity>(x, group, 0);
}

torch::Tensor GatherFromRegion(const torch::Tensor& x, Communicator& group,
                               int64_t dim) {
  return Apply<AllGather, Slice>(x, group, Dim(x, dim));
}

torch::Tensor ScatterToRegion(const torch::Tensor& x, Communicator& group,
                              int64_t dim) {
  return Apply<Slice, AllGather>(x, group, Dim(x, dim));
}

torch::Tensor GatherSequence(const torch::Tensor& x, Communicator& group,
                             int64_t dim) {
  return Apply<AllGather, ReduceScatter>(x, group, Dim(x, dim));
}

torch::Tensor ReduceScatterSequence(const torch::Tensor& x, Communicator& group,
                                    int64_t dim) {
  return Apply<ReduceScatter, AllGather>(x, group, Dim(x, dim));
}

}  // namespace accel::tp
