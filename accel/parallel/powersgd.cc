#include "accel/parallel/powersgd.h"

#include <algorithm>

#include "accel/core/tensor_ops.h"
#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

// Gram-Schmidt over the columns, in place, as torch's _orthogonalize.
void Orthogonalize(torch::Tensor& matrix, double epsilon) {
  const int64_t columns = matrix.size(1);
  for (int64_t i = 0; i < columns; ++i) {
    torch::Tensor column = matrix.narrow(1, i, 1);
    if (epsilon == 0) {
      column.div_(column.norm());
    } else {
      column.div_(column.norm() + epsilon);
    }
    if (i + 1 < columns) {
      torch::Tensor rest = matrix.narrow(1, i + 1, columns - i - 1);
      rest.sub_((column * rest).sum(0, /*keepdim=*/true) * column);
    }
  }
}

// Sums `tensors` (each contiguous) across ranks in one allreduce.
uint64_t SumTogether(Communicator& comm,
                     const std::vector<torch::Tensor>& parts,
                     const CollectiveOptions& call) {
  if (parts.empty()) return 0;
  std::vector<torch::Tensor> flat;
  for (const auto& part : parts) flat.push_back(part.reshape({-1}));
  torch::Tensor packed = torch::cat(flat);
  comm.allreduce(packed.data_ptr(), static_cast<size_t>(packed.numel()),
                 ToDType(packed.scalar_type()), ReduceOp::kSum, call);
  int64_t offset = 0;
  for (const auto& part : parts) {
    part.copy_(packed.narrow(0, offset, part.numel()).view(part.sizes()));
    offset += part.numel();
  }
  return packed.numel() * packed.element_size();
}

}  // namespace

PowerSgdBucket::PowerSgdBucket(const PowerSgdOptions& options,
                               const std::vector<std::vector<int64_t>>& shapes)
    : options_(options) {
  if (options.matrix_approximation_rank < 1) {
    throw UsageError(
        "PowerSGD: matrix_approximation_rank must be at least 1, "
        "found " +
        std::to_string(options.matrix_approximation_rank));
  }
  if (options.start_powerSGD_iter < 0 || options.min_compression_rate < 0 ||
      options.orthogonalization_epsilon < 0) {
    throw UsageError(
        "PowerSGD: start_powerSGD_iter, min_compression_rate and "
        "orthogonalization_epsilon must not be negative");
  }
  const int64_t rank = options.matrix_approximation_rank;
  int64_t offset = 0;
  for (const auto& shape : shapes) {
    int64_t numel = 1;
    for (int64_t size : shape) numel *= size;
    const int64_t rows = shape.size() > 1 ? shape[0] : 0;
    const int64_t columns = rows > 0 ? numel / rows : 0;
    const int64_t r = std::min({rank, rows, columns});
    if (rows > 0 && static_cast<double>(rows * columns) >
                        (rows + columns) * r * options.min_compression_rate) {
      matrices_.push_back({offset, rows, columns, {}, {}});
    } else if (numel > 0) {
      whole_.emplace_back(offset, numel);
      whole_numel_ += numel;
    }
    offset += numel;
  }
}

uint64_t PowerSgdBucket::Reduce(Communicator& comm, torch::Tensor& flat,
                                const CollectiveOptions& call) {
  torch::NoGradGuard no_grad;
  const double ranks = comm.size();
  if (options_.use_error_feedback) {
    if (!error_.defined()) {
      error_ = torch::zeros_like(flat);
    } else {
      flat.add_(error_);
    }
  }
  const torch::Tensor before =
      options_.use_error_feedback ? flat.clone() : torch::Tensor();
  // What gains nothing from compression: summed whole.
  std::vector<torch::Tensor> whole;
  for (const auto& [offset, numel] : whole_) {
    whole.push_back(flat.narrow(0, offset, numel));
  }
  uint64_t bytes = SumTogether(comm, whole, call);
  for (auto& part : whole) part.div_(ranks);
  // Qs: the last step's (warm start), or drawn alike on every rank.
  for (Matrix& m : matrices_) {
    const int64_t r = std::min<int64_t>(
        {options_.matrix_approximation_rank, m.rows, m.columns});
    if (!m.q.defined() || !options_.warm_start) {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(
          options_.random_seed * 1000003 + draws_++);
      m.q = torch::randn({m.columns, r}, generator, flat.options());
      m.p = torch::empty({m.rows, r}, flat.options());
    }
    Orthogonalize(m.q, options_.orthogonalization_epsilon);
  }
  std::vector<torch::Tensor> ps, qs;
  for (Matrix& m : matrices_) {
    torch::Tensor gradient =
        flat.narrow(0, m.offset, m.rows * m.columns).view({m.rows, m.columns});
    torch::matmul_out(m.p, gradient, m.q);
    ps.push_back(m.p);
  }
  bytes += SumTogether(comm, ps, call);
  for (Matrix& m : matrices_) {
    Orthogonalize(m.p, options_.orthogonalization_epsilon);
    torch::Tensor gradient =
        flat.narrow(0, m.offset, m.rows * m.columns).view({m.rows, m.columns});
    torch::matmul_out(m.q, gradient.t(), m.p);
    qs.push_back(m.q);
  }
  bytes += SumTogether(comm, qs, call);
  for (Matrix& m : matrices_) {
    m.q.div_(ranks);
    torch::Tensor gradient =
        flat.narrow(0, m.offset, m.rows * m.columns).view({m.rows, m.columns});
    torch::matmul_out(gradient, m.p, m.q.t());
  }
  if (options_.use_error_feedback) {
    // What this rank's input differs from what it got, as torch keeps it
    // (whole members too: over the ranks those differences sum to zero).
    torch::sub_out(error_, before, flat);
  }
  return bytes;
}

}  // namespace accel
