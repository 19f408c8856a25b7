// The Accelerator's device mesh (AcceleratorOptions::parallelism_config):
// building it, the coordinates Accelerate names, and the groups accel's own
// work runs over (accelerator.h).
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "accel/accelerator.h"
#include "accel/parallel/context_parallel.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"

namespace accel {

void Accelerator::MakeDeviceMesh() {
  std::optional<ParallelismConfig> wanted = options_.parallelism_config;
  if (!wanted && options_.hybrid_shard) {
    const ParallelismConfig hybrid =
        HybridShardingConfig(num_processes(), env_.local_world_size);
    if (hybrid.dp_replicate_size == 1) {
      if (is_main_process() && num_processes() > 1) {
        ACCEL_LOG(INFO) << "hybrid sharding on one machine: ZeRO stage "
                        << options_.zero_stage
                        << " over its processes (nothing to replicate)";
      }
      return;
    }
    wanted = hybrid;
  }
  if (!wanted) return;
  parallelism_config_ = wanted->Resolved(num_processes());
  const ParallelismConfig& config = *parallelism_config_;
  state_->num_processes = config.dp_size();
  if (num_processes() == 1) return;  // Nothing to lay out.
  if (options_.dataloader_config.dispatch_batches &&
      config.tp_size * config.cp_size > 1) {
    throw UsageError(
        "dataloader_config.dispatch_batches with a parallelism config of "
        "tensor or context parallelism (" +
        config.ToString() +
        ") is not in accel: the main process would send its batches to "
        "every process, not to each data-parallel rank's group");
  }
  state_->mesh = std::make_shared<DeviceMesh>(communicator(), config);
  if (is_main_process()) {
    ACCEL_LOG(INFO) << "device mesh " << config.ToString()
                    << (config.dp_replicate_size > 1 && options_.zero_stage > 0
                            ? " (ZeRO shards within dp_shard x cp and "
                              "replicates across dp_replicate: HSDP)"
                            : "");
  }
}

int Accelerator::MeshCoordinate(const char* dimension, const char* api) const {
  if (!parallelism_config_) {
    throw UsageError(std::string(api) +
                     ": no parallelism_config was given (AcceleratorOptions::"
                     "parallelism_config, --parallelism_config_*_size)");
  }
  const DeviceMesh* mesh = state_->mesh.get();
  return mesh == nullptr ? 0 : mesh->coordinate(dimension);
}

int Accelerator::data_parallel_rank() const {
  return MeshCoordinate("dp_replicate", "data_parallel_rank");
}
int Accelerator::data_parallel_shard_rank() const {
  return MeshCoordinate("dp_shard", "data_parallel_shard_rank");
}
int Accelerator::tensor_parallel_rank() const {
  return MeshCoordinate("tp", "tensor_parallel_rank");
}
int Accelerator::context_parallel_rank() const {
  return MeshCoordinate("cp", "context_parallel_rank");
}

int Accelerator::data_parallel_size() const {
  return parallelism_config_ ? parallelism_config_->dp_size() : num_processes();
}

int Accelerator::data_parallel_index() const {
  const DeviceMesh* mesh = state_->mesh.get();
  return mesh == nullptr ? process_index() : mesh->coordinate("dp");
}

void Accelerator::maybe_context_parallel(
    const std::vector<torch::Tensor*>& buffers,
    const std::vector<int64_t>& buffer_seq_dims) {
  if (buffers.size() != buffer_seq_dims.size()) {
    throw UsageError(
        "maybe_context_parallel: " + std::to_string(buffers.size()) +
        " buffers but " + std::to_string(buffer_seq_dims.size()) +
        " buffer_seq_dims");
  }
  // Checked at any mesh, so that a one-process run finds the mistake too.
  std::vector<int64_t> dims;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const std::string which =
        "maybe_context_parallel: buffer " + std::to_string(i);
    if (buffers[i] == nullptr || !buffers[i]->defined()) {
      throw UsageError(which + " is null or an undefined tensor");
    }
    const int64_t rank = buffers[i]->dim();
    const int64_t dim = buffer_seq_dims[i];
    if (dim < -rank || dim >= std::max<int64_t>(rank, 1) || rank == 0) {
      throw UsageError(which + " (shape " + c10::str(buffers[i]->sizes()) +
                       ") has no dimension " + std::to_string(dim) +
                       " (its buffer_seq_dims entry)");
    }
    dims.push_back(dim < 0 ? dim + rank : dim);
  }
  DeviceMesh* mesh = state_->mesh.get();
  if (mesh == nullptr || mesh->size("cp") == 1) return;
  Communicator& cp = mesh->group("cp");
  for (size_t i = 0; i < buffers.size(); ++i) {
    const int64_t length = buffers[i]->size(dims[i]);
    if (length % cp.size() != 0) {
      throw UsageError("maybe_context_parallel: buffer " + std::to_string(i) +
                       " (shape " + c10::str(buffers[i]->sizes()) +
                       ") has a sequence of " + std::to_string(length) +
                       " along dimension " + std::to_string(dims[i]) +
                       ", which does not split over cp_size " +
                       std::to_string(cp.size()) + "; make it a multiple");
    }
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    *buffers[i] = cp::ShardSequence(*buffers[i], cp, dims[i]);
  }
}

TensorParallelNorm Accelerator::TensorParallelOf() const {
  TensorParallelNorm tensor_parallel;
  DeviceMesh* mesh = state_->mesh.get();
  if (mesh == nullptr || mesh->size("tp") == 1) return tensor_parallel;
  tensor_parallel.group = &mesh->group("tp");
  for (const auto& model : state_->prepared.models()) {
    for (const void* key : TensorParallelParameters(*model)) {
      tensor_parallel.split.push_back(key);
    }
  }
  return tensor_parallel;
}

void Accelerator::RefuseSplitLayers(const char* api, const char* why) const {
  for (const auto& model : state_->prepared.models()) {
    if (TensorParallelParameters(*model).empty()) continue;
    throw UsageError(
        std::string(api) +
        ": the model has tensor-parallel layers (parallelize_module), of "
        "which each rank holds a share; accel saves them only in its "
        "sharded checkpoints, which need a prepared optimizer whose state "
        "accel knows, and " +
        why);
  }
}

Communicator& Accelerator::DataGroup() {
  DeviceMesh* mesh = state_->mesh.get();
  return mesh == nullptr ? communicator() : mesh->group("dp");
}

Communicator& Accelerator::GradientGroup() {
  DeviceMesh* mesh = state_->mesh.get();
  return mesh == nullptr ? communicator() : mesh->group("dp_cp");
}

Communicator& Accelerator::ShardGroup() {
  DeviceMesh* mesh = state_->mesh.get();
  return mesh == nullptr ? communicator() : mesh->group("dp_shard_cp");
}

Communicator* Accelerator::ReplicaGroup() {
  DeviceMesh* mesh = state_->mesh.get();
  if (mesh == nullptr || mesh->size("dp_replicate") == 1) return nullptr;
  return &mesh->group("dp_replicate");
}

}  // namespace accel
