// Data-parallel training that goes on through lost ranks, without a restart
// or a checkpoint (torchft's model): every step's replicas agree on who is
// there, sum the gradients over those present, and a replacement that the
// launcher starts takes the parameters, optimizer state, random generator
// and step from a live replica. Run under `accel launch --fault_tolerance
// --max_restarts=N` (N replacements at most).
//
//   torch::nn::Sequential model(...);
//   torch::optim::SGD optimizer(model->parameters(), 0.1);
//   accel::FaultToleranceOptions options;
//   options.backend = "gloo";  // Link it: deps += "//backends/gloo".
//   accel::FaultTolerance ft(*model, optimizer, options);
//   while (ft.step() < steps && ft.StartStep()) {
//     auto [begin, end] = ft.Share(global_batch);  // This replica's samples.
//     torch::Tensor loss = LossSum(ft.step(), begin, end) / global_batch;
//     loss.backward();
//     ft.Commit();  // Sums the gradients; steps the optimizer if it held.
//   }
//   if (ft.rank() == 0) std::cout << ft.Summary() << "\n";
//
// The data of a step is the caller's function of ft.step(), split among the
// replicas present (Share): a step that fails (a replica was lost during it)
// runs again with the others on the same samples, so no sample is lost or
// counted twice, and the loss, summed over the share and divided by the
// global batch, gives the same mean whatever the number of replicas.
//
// Where accel differs from Accelerate: Accelerate has no such mode (torchft
// is a separate Python library); this one is data parallel only (no ZeRO,
// tensor or context parallelism yet) and CPU tensors.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "accel/runtime/ft/replica.h"
#include "accel/tracking/tracker_set.h"

namespace accel {

class ProcessGroup;

// The gradients of `parameters`, flattened in order (zeros where one has
// none): what Commit sums over the replicas, and what a replay of a run
// (sum the members' in rank order, as one host's collectives do) sums.
// `spare` zeros more at the end (Commit's one, for the replica).
torch::Tensor FlatGradients(const std::vector<torch::Tensor>& parameters,
                            int64_t spare = 0);
// Sets each parameter's gradient from `flat` (FlatGradients' layout; what
// follows the last parameter is ignored).
void SetFlatGradients(const std::vector<torch::Tensor>& parameters,
                      const torch::Tensor& flat);

struct FaultToleranceOptions {
  std::string backend = "gloo";  // gloo (MPI cannot lose a rank).
  // Bound on a collective among the replicas.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  // See ft::LighthouseOptions.
  int min_replicas = 0;
  std::chrono::milliseconds join_timeout = std::chrono::seconds(60);
  std::chrono::milliseconds heartbeat_timeout = std::chrono::seconds(3);
  // Trackers (as --report_to: "jsonl", "tensorboard") for rank 0's record
  // of every membership change, at its step: ft/replicas, ft/lost,
  // ft/joined and ft/recovery_s (a loss: from the failed step to the new
  // quorum; a join: sending the state); under logging_dir/fault_tolerance.
  std::vector<std::string> log_with;
  std::string logging_dir;
};

class FaultTolerance {
 public:
  // Joins this process's job from the launcher's environment.
  FaultTolerance(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                 const FaultToleranceOptions& options = {});
  ~FaultTolerance();

  // Waits for this step's quorum (a replacement loads the state here).
  // False when the job finished without this replica.
  bool StartStep();
  // [begin, end) of this replica's samples among a step's global batch.
  std::pair<int64_t, int64_t> Share(int64_t global_batch) const;
  // Sums the gradients over the replicas; when every replica's sum held,
  // runs the optimizer's step and returns true. Zeroes the gradients.
  bool Commit();

  int64_t step() const { return replica_->step(); }
  int rank() const;
  int world_size() const;
  int replicas() const { return replica_->quorum_size(); }
  const ft::Replica& replica() const { return *replica_; }
  // "fault tolerance: 4000 steps here, 458 with fewer than 4 replicas, 20
  // run again; replicas lost: 20, joined: 20" (no newline).
  std::string Summary() const;

  // The state a joiner receives, as bytes (model, optimizer, generator).
  std::string SaveState();
  void LoadState(const std::string& bytes);

 private:
  torch::nn::Module& model_;
  torch::optim::Optimizer& optimizer_;
  // Logs the changes the replica saw since the last call.
  void LogChanges();

  std::unique_ptr<ProcessGroup> group_;
  std::unique_ptr<ft::Replica> replica_;
  std::unique_ptr<TrackerSet> trackers_;
  size_t changes_logged_ = 0;
};

}  // namespace accel
