// Accelerate's save_model layout over safetensors files (safetensors.h):
// one model.safetensors, or shards plus an index, as Hugging Face writes
// and reads them.
//
//   accel::SaveModelWeights(*model, "out", "5GB");
//   accel::LoadModelWeightsInto(*model, "out");
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "accel/checkpoint/safetensors.h"

namespace accel {

// Accelerate's save_model: model.safetensors, or model-00001-of-0000N.
// safetensors shards plus model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {name: file}}) when the
// weights exceed max_shard_size, split as huggingface_hub does: tensors in
// order fill a shard until the next would overflow it, and a tensor bigger
// than the shard size gets its own shard. Names and order are torch's
// state_dict: for each module in pre-order, its parameters then its
// buffers, dotted ("encoder.0.weight"). Files carry {"format": "pt"} as
// metadata, like Accelerate's. Creates `dir` if needed; files of an earlier
// save there that this one does not replace (other shards, the index or the
// single file) are removed after the new ones are in place. Returns the
// paths written, index last.
//
// Unlike Accelerate, parameters that share storage (tied weights) are each
// saved under their own name rather than dropped, so that loading finds
// every name the module has.
std::vector<std::string> SaveModelWeights(
    const torch::nn::Module& module, const std::string& dir,
    const std::string& max_shard_size = "10GB");
// The same for tensors by name, in the order given (a module's state
// gathered from ZeRO-3 shards).
std::vector<std::string> SaveModelWeights(
    const std::vector<std::pair<std::string, torch::Tensor>>& entries,
    const std::string& dir, const std::string& max_shard_size = "10GB");

// Whether `name` is one SaveModelWeights writes: model.safetensors,
// model.safetensors.index.json or model-00001-of-00003.safetensors.
bool IsModelWeightsFileName(const std::string& name);

// Reads either layout back: model.safetensors if present (as transformers
// prefers it), else the index and its shards, checking that every shard
// holds exactly the names the index maps to it.
std::map<std::string, torch::Tensor> LoadModelWeights(const std::string& dir);

// The weights' dtypes and shapes from the files' headers alone (no tensor
// data is read, so any size is quick): `path` is a folder as
// LoadModelWeights reads it, one .safetensors file, or an index (.json)
// whose shards are beside it, checked as LoadModelWeights checks them.
std::map<std::string, safetensors::TensorInfo> LoadModelWeightsInfo(
    const std::string& path);

// Copies the weights into `module`, after checking names, shapes and dtypes
// (CheckpointError listing every mismatch; then nothing is changed), like
// load_state. Tensors move to each parameter's device.
void LoadModelWeightsInto(torch::nn::Module& module, const std::string& dir);

// "10GB" = 10^10, "5MiB" = 5 * 2^20, "100KB", "1.5GB", "123" (bytes).
// Units B, KB, MB, GB, TB, PB (powers of 1000) and KiB, MiB, GiB, TiB, PiB
// (powers of 1024), any case, optional space before the unit. UsageError
// otherwise (negative, not a number, unknown unit, beyond int64).
int64_t ParseByteSize(const std::string& text);

}  // namespace accel
