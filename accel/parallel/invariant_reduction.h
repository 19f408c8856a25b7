// Gradients that are the same to the last bit at any process count that
// divides invariant_micro_batches (AcceleratorOptions): each global batch is
// cut into K micro-batches of equal size, the same ones at 1, 2 or K
// processes; each process runs backward on its K/N of them, and their
// gradients are summed as one balanced binary tree over the K, in batch
// order: the subtrees on each process, the top of the tree across
// processes (after an allgather of each process's subtree sum, every rank
// adds the same pairs in the same order). Divided by K, that is the
// gradient of the mean loss over the global batch, as DDP's average is.
//
// Under DDP the sums depend on the process count: one process sums a batch
// of 32 inside its matrix products, two sum 16 each and then add the two
// halves, and the allreduce of four ranks adds in ring order. In float32
// those roundings differ, and training grows the difference (the weights
// part in the fifth digit after a few hundred steps; a prediction or two
// moves). Here the gradient, the optimizer step and hence the weights are
// the same bits, in float32 and under bf16 autocast (the same operations on
// the same micro-batches), as long as each process computes with the same
// number of threads (see Accelerator's constructor).
//
//   accel::AcceleratorOptions options;
//   options.invariant_micro_batches = 4;        // --invariant_micro_batches
//   options.dataloader_config.split_batches = true;
//   accel::Accelerator accelerator(options);    // at 1, 2 or 4 processes
//   auto [model, optimizer, loader] = accelerator.prepare(net, adamw, data);
//   for (auto& batch : loader) {                // a global batch of 32
//     for (auto& micro : accelerator.micro_batches(batch)) {  // 8 samples
//       accelerator.backward(loss_fn(model->forward(micro.data),
//                                    micro.target));  // once per slice
//     }
//     optimizer.step();                         // the same step at any N
//     optimizer.zero_grad();
//   }
//
// Between a step's slices the gradient is partial: sync_gradients() is
// false, and optimizer.step, clipping, unscaling and save_state are
// UsageErrors; so is a backward beyond the step's slices before the
// optimizer steps or zeroes the gradients.
//
// The price: K/N smaller backward passes per step instead of one, one copy
// of the gradients per micro-batch, and an allgather of N gradients' worth
// per step instead of an allreduce that overlaps backward.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "accel/parallel/gradient_sync.h"
#include "accel/runtime/comm/communicator.h"

namespace accel {

// Sums leaves as a balanced binary tree in the order they are added: a
// leaf joins its left neighbour as soon as both halves of a subtree are
// complete (a binary counter), so 2^k leaves give
// ((l0 + l1) + (l2 + l3)) + ... whether they come one at a time or as the
// sums of aligned subtrees.
class PairwiseSum {
 public:
  // Adds `leaf`, the sum of 2^level leaves (0: a single one).
  void Add(torch::Tensor leaf, int level = 0);
  // The sum of everything added (the remaining subtrees, smallest first),
  // and starts again. Undefined when nothing was added.
  torch::Tensor Take();
  bool empty() const { return stack_.empty(); }

 private:
  std::vector<std::pair<int, torch::Tensor>> stack_;
};

// UsageError unless `micro_batches` (K) is 0 (off) or a power of two that
// `num_processes` divides: the tree's subtrees must fall on process
// boundaries.
void CheckInvariantMicroBatches(int micro_batches, int num_processes);

class InvariantGradientReducer : public GradientReducer {
 public:
  // `comm` is null with one process. `buffers` become rank 0's after every
  // step when `broadcast_buffers` (as DDP's broadcast_buffers).
  InvariantGradientReducer(Communicator* comm,
                           const std::vector<torch::Tensor>& parameters,
                           int micro_batches,
                           const std::vector<torch::Tensor>& buffers,
                           bool broadcast_buffers);
  ~InvariantGradientReducer() override;

  // The first micro-batch of a step sets aside the gradients left from
  // before (zeros after zero_grad); they are added back to the step's
  // result, once, as DDP adds them once.
  void begin_backward() override;
  // After each micro-batch's backward: its gradient becomes a leaf; after
  // this process's last one, the tree's top across processes, and .grad
  // holds the step's gradient.
  void finish() override;
  // UsageError for no_sync (and what turns it on): the micro-batches are
  // this mode's accumulation; gradients kept back from a sync would join
  // one process's leaf, not the tree.
  void set_enabled(bool enabled) override;
  bool enabled() const override { return true; }
  void set_call_site(CallSite site) override { site_ = site; }
  bool mid_step() const override { return done_ != 0; }
  void CheckStepComplete(const char* operation) const override;
  // After it, backward starts the next step; before it, a backward beyond
  // the step's micro-batches is a UsageError (it would add a second tree on
  // top of the first, a sum that depends on the process count).
  void StepEnded() override { complete_ = false; }

  int micro_batches_per_process() const { return per_process_; }

 private:
  struct Group;  // The parameters of one dtype, summed as one flat tensor.
  void Combine();
  std::string Processes() const;  // "1 process", "4 processes".

  Communicator* comm_;
  int micro_batches_;
  int per_process_;
  std::vector<Group> groups_;
  std::vector<torch::Tensor> buffers_;
  bool broadcast_buffers_;
  int done_ = 0;           // Micro-batches of this step whose leaf is in.
  bool complete_ = false;  // The step's gradient is in .grad, not used yet.
  CallSite site_ = CallSite::Here();
};

}  // namespace accel
