// Accelerate's ParallelismConfig and the device mesh it describes: the
// job's ranks laid out over named dimensions, with a process group
// (Communicator::Split) along each dimension and along the joint ones
// Accelerate flattens.
//
//   accel::ParallelismConfig config;  // or ::FromEnvironment()
//   config.dp_shard_size = 2;
//   config.tp_size = 2;
//   accel::DeviceMesh mesh(job, config.Resolved(job.size()));  // collective
//   accel::Communicator& tp = mesh.group("tp");   // this rank's tp group
//   tp.allreduce(partial_sums, n, accel::DType::kFloat32,
//                accel::ReduceOp::kSum);
//   int shard = mesh.coordinate("dp_shard");
//
// Dimensions, outermost first, as Accelerate orders them: dp_replicate,
// dp_shard, cp, tp; rank = ((replicate * dp_shard + shard) * cp + c) * tp
// + t, so that a tp group holds neighbouring ranks (on one machine, where
// its frequent collectives are cheapest). Joint dimensions: "dp"
// (dp_replicate x dp_shard: the ranks that see different data), "dp_shard_cp"
// (what ZeRO shards parameters over when cp > 1) and "dp_cp" (what the loss
// is averaged over). A dimension of size 1 is a group of this rank alone.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "accel/runtime/comm/communicator.h"

namespace accel {

struct ParallelismConfig {
  int dp_replicate_size = 1;
  int dp_shard_size = 1;
  int tp_size = 1;
  int cp_size = 1;

  // Accelerate's environment variables (PARALLELISM_CONFIG_DP_REPLICATE_SIZE,
  // _DP_SHARD_SIZE, _TP_SIZE, _CP_SIZE), each where set, over `base`.
  // UsageError naming the variable for a value that is not a whole number.
  static ParallelismConfig FromEnvironment(ParallelismConfig base);
  static ParallelismConfig FromEnvironment();
  int total_size() const {
    return dp_replicate_size * dp_shard_size * tp_size * cp_size;
  }
  // The data-parallel size: ranks that see different batches.
  int dp_size() const { return dp_replicate_size * dp_shard_size; }
  // Accelerate's checks for a job of `num_processes`, as UsageErrors that
  // say what to change: every size at least 1; tensor or context
  // parallelism with pure replication (dp_replicate > 1, dp_shard 1) is
  // refused; the product must be the number of processes. A config of all
  // ones with several processes is plain data parallelism (dp_replicate =
  // num_processes), as Accelerate makes it.
  ParallelismConfig Resolved(int num_processes) const;
  // "dp_replicate 2 x dp_shard 2 x cp 1 x tp 2".
  std::string ToString() const;
  bool operator==(const ParallelismConfig& other) const {
    return dp_replicate_size == other.dp_replicate_size &&
           dp_shard_size == other.dp_shard_size && tp_size == other.tp_size &&
           cp_size == other.cp_size;
  }
  bool operator!=(const ParallelismConfig& other) const {
    return !(*this == other);
  }
};

class DeviceMesh {
 public:
  // The four dimensions, outermost first.
  static const std::vector<std::string>& Dimensions();

  // Collective over `job` (every rank, in the same order as its other
  // collectives): makes the groups of every dimension and joint dimension.
  // `config` must be Resolved for job.size() (UsageError otherwise).
  DeviceMesh(Communicator& job, const ParallelismConfig& config);
  ~DeviceMesh();
  DeviceMesh(const DeviceMesh&) = delete;
  DeviceMesh& operator=(const DeviceMesh&) = delete;

  const ParallelismConfig& config() const { return config_; }
  Communicator& job() { return job_; }
  // This rank's position along a dimension (joint ones too: its rank in
  // that group), and the dimension's size.
  int coordinate(const std::string& dimension) const;
  int size(const std::string& dimension) const;
  // This rank's group along `dimension` ("tp", "dp", "dp_shard_cp", ...).
  // UsageError listing the names for an unknown one.
  Communicator& group(const std::string& dimension);
  // The job rank at `coordinates` (one per dimension, outermost first).
  int RankAt(const std::vector<int>& coordinates) const;

 private:
  // The dimensions (indices into Dimensions()) a name stands for.
  const std::vector<int>& Axes(const std::string& dimension) const;

  Communicator& job_;
  const ParallelismConfig config_;
  std::vector<int> sizes_;        // Per dimension, outermost first.
  std::vector<int> coordinates_;  // This rank's, per dimension.
  std::map<std::string, std::vector<int>> axes_;
  std::map<std::string, std::unique_ptr<Communicator>> groups_;
};

}  // namespace accel
