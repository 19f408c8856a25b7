#include "accel/parallel/invariant_reduction.h"

#include <string>
#include <utility>

#include "accel/core/tensor_ops.h"
#include "accel/runtime/base/errors.h"

namespace accel {

void PairwiseSum::Add(torch::Tensor leaf, int level) {
  while (!stack_.empty() && stack_.back().first == level) {
    // Left neighbour first; float addition commutes, so every rank that
    // adds this pair gets the same bits either way.
    leaf = stack_.back().second.add(leaf);
    stack_.pop_back();
    ++level;
  }
  stack_.emplace_back(level, std::move(leaf));
}

torch::Tensor PairwiseSum::Take() {
  torch::Tensor total;
  while (!stack_.empty()) {
    total = total.defined() ? stack_.back().second.add(total)
                            : std::move(stack_.back().second);
    stack_.pop_back();
  }
  return total;
}

void CheckInvariantMicroBatches(int micro_batches, int num_processes) {
  if (micro_batches == 0) return;
  const std::string given =
      "invariant_micro_batches (--invariant_micro_batches) is " +
      std::to_string(micro_batches);
  if (micro_batches < 0 || (micro_batches & (micro_batches - 1)) != 0) {
    throw UsageError(given +
                     "; it must be 0 (off) or a power of two (1, 2, 4, 8, "
                     "...), so that each process's micro-batches form "
                     "whole subtrees of the sum");
  }
  if (micro_batches % num_processes != 0) {
    throw UsageError(given + ", which " + std::to_string(num_processes) +
                     " processes do not divide: each process takes an equal "
                     "share of the micro-batches; run on a power of two "
                     "processes up to " +
                     std::to_string(micro_batches) +
                     ", or raise invariant_micro_batches");
  }
}

struct InvariantGradientReducer::Group {
  std::vector<torch::Tensor> parameters;
  int64_t numel = 0;
  PairwiseSum sum;
  // The gradients held before the step's first backward (see
  // begin_backward); undefined where a parameter had none.
  std::vector<torch::Tensor> carried;

  // The current gradients, one flat tensor (zeros where none), and the
  // parameters left without, so that the next backward writes fresh ones.
  torch::Tensor TakeGradients() {
    std::vector<torch::Tensor> flat;
    flat.reserve(parameters.size());
    for (torch::Tensor& p : parameters) {
      torch::Tensor& grad = p.mutable_grad();
      flat.push_back(grad.defined() ? grad.reshape(-1)
                                    : torch::zeros({p.numel()}, p.options()));
      grad = torch::Tensor();
    }
    return torch::cat(flat);
  }
};

InvariantGradientReducer::InvariantGradientReducer(
    Communicator* comm, const std::vector<torch::Tensor>& parameters,
    int micro_batches, const std::vector<torch::Tensor>& buffers,
    bool broadcast_buffers)
    : comm_(comm),
      micro_batches_(micro_batches),
      buffers_(buffers),
      broadcast_buffers_(broadcast_buffers) {
  const int processes = comm == nullptr ? 1 : comm->size();
  CheckInvariantMicroBatches(micro_batches, processes);
  per_process_ = micro_batches / processes;
  std::map<torch::ScalarType, size_t> group_of;
  for (const torch::Tensor& p : parameters) {
    if (!p.requires_grad()) continue;
    auto [it, added] = group_of.emplace(p.scalar_type(), groups_.size());
    if (added) groups_.emplace_back();
    Group& group = groups_[it->second];
    group.parameters.push_back(p);
    group.numel += p.numel();
  }
}

InvariantGradientReducer::~InvariantGradientReducer() = default;

void InvariantGradientReducer::set_enabled(bool enabled) {
  if (enabled) return;
  throw UsageError(
      "no_sync (or accumulate, LocalSGD, join_uneven_inputs) is not "
      "available with invariant_micro_batches: its micro-batches are the "
      "accumulation, and gradients kept back from a sync would be summed "
      "outside their tree; loop over accelerator.micro_batches(batch) "
      "instead");
}

void InvariantGradientReducer::begin_backward() {
  if (done_ != 0) return;
  if (complete_) {
    throw UsageError(
        "backward: this process's " + std::to_string(per_process_) +
        " micro-batch(es) of the step have run backward already "
        "(invariant_micro_batches=" +
        std::to_string(micro_batches_) + " at " + Processes() +
        "): call backward once per slice of accelerator.micro_batches(batch) "
        "(summing a slice's losses first), then optimizer.step() or "
        "zero_grad() before the next step's");
  }
  for (Group& group : groups_) {
    group.carried.clear();
    for (torch::Tensor& p : group.parameters) {
      group.carried.push_back(std::exchange(p.mutable_grad(), {}));
    }
  }
}

void InvariantGradientReducer::finish() {
  for (Group& group : groups_) group.sum.Add(group.TakeGradients());
  if (++done_ < per_process_) return;
  done_ = 0;
  Combine();
  complete_ = true;
}

void InvariantGradientReducer::Combine() {
  const CollectiveOptions options{{}, "backward", site_};
  for (Group& group : groups_) {
    torch::Tensor total = group.sum.Take();
    if (comm_ != nullptr && comm_->size() > 1) {
      // Every rank's subtree, in rank order; every rank adds the same pairs.
      const torch::Tensor all = Gather(*comm_, total, options);
      for (int rank = 0; rank < comm_->size(); ++rank) {
        group.sum.Add(all.narrow(0, rank * group.numel, group.numel));
      }
      total = group.sum.Take();
    }
    total.div_(micro_batches_);
    int64_t offset = 0;
    for (size_t i = 0; i < group.parameters.size(); ++i) {
      torch::Tensor& p = group.parameters[i];
      // detach(): a plain tensor to autograd (zero_grad detaches gradients
      // in place, which a view refuses), sharing the total's memory.
      torch::Tensor grad =
          total.narrow(0, offset, p.numel()).view_as(p).detach();
      offset += p.numel();
      const torch::Tensor& carried = group.carried[i];
      if (carried.defined()) grad.add_(carried);
      p.mutable_grad() = grad;
    }
    group.carried.clear();
  }
  if (broadcast_buffers_ && comm_ != nullptr && comm_->size() > 1 &&
      !buffers_.empty()) {
    std::vector<std::string> names;
    for (size_t i = 0; i < buffers_.size(); ++i) {
      names.push_back("buffer_" + std::to_string(i));
    }
    BroadcastCoalesced(*comm_, names, buffers_, 0, options);
  }
}

void InvariantGradientReducer::CheckStepComplete(const char* operation) const {
  if (done_ == 0) return;
  throw UsageError(std::string(operation) + " after " + std::to_string(done_) +
                   " of the " + std::to_string(per_process_) +
                   " micro-batches this process runs per step under "
                   "invariant_micro_batches=" +
                   std::to_string(micro_batches_) + " at " + Processes() +
                   ": the step's gradient is not complete; call backward "
                   "once for each of accelerator.micro_batches(batch), then " +
                   operation);
}

std::string InvariantGradientReducer::Processes() const {
  const int processes = micro_batches_ / per_process_;
  return std::to_string(processes) +
         (processes == 1 ? " process" : " processes");
}

}  // namespace accel
