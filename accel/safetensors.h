// The safetensors format (Hugging Face's weight files) and Accelerate's
// save_model layout on top of it.
//
//   accel::safetensors::Save({{"weight", w}, {"bias", b}}, "layer.safetensors",
//                            {{"format", "pt"}});
//   std::map<std::string, torch::Tensor> tensors =
//       accel::safetensors::Load("layer.safetensors");
//
//   // Accelerate's save_model: one file, or shards plus an index.
//   accel::SaveModelWeights(*model, "out", "5GB");
//   accel::LoadModelWeightsInto(*model, "out");
//
// A file is: 8 bytes, little-endian, the header length N; N bytes of JSON
// (UTF-8, padded with spaces so the data starts at a multiple of 8):
//   {"__metadata__": {"format": "pt"},
//    "weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...}
// then the tensors' raw little-endian bytes, packed without gaps, offsets
// relative to the start of the data. Dtypes: F64 F32 F16 BF16 I64 I32 I16
// I8 U8 BOOL (what LibTorch 1.13 holds; newer files may use others, which
// Load rejects by name). Python reads these files with the safetensors
// package, or with nothing but json and struct.
//
// The reader trusts nothing in the file: the header length is checked
// against the file size (and 100 MB, safetensors' own limit) before
// anything is allocated; every offset must lie in the data, tensors must
// cover it exactly (no gaps, overlaps or trailing bytes); each tensor's byte
// count must equal its shape times its dtype's size; BOOL bytes must be 0 or
// 1. Any defect is a CheckpointError naming the file and the defect.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace accel::safetensors {

// Writes `tensors` (any device, any layout; copied to contiguous CPU bytes)
// to `path`, beside it first and then renamed into place. Tensors are laid
// out largest element size first, then by name, so each is aligned to its
// element size. UsageError for an undefined or sparse tensor, a dtype the
// format lacks, or the name "__metadata__"; CheckpointError when writing
// fails.
void Save(const std::map<std::string, torch::Tensor>& tensors,
          const std::string& path,
          const std::map<std::string, std::string>& metadata = {});

// Every tensor of the file, on the CPU.
std::map<std::string, torch::Tensor> Load(const std::string& path);

// The "__metadata__" strings (empty when there are none), after checking
// the whole header; reads no tensor data.
std::map<std::string, std::string> LoadMetadata(const std::string& path);

}  // namespace accel::safetensors

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

// Whether `name` is one SaveModelWeights writes: model.safetensors,
// model.safetensors.index.json or model-00001-of-00003.safetensors.
bool IsModelWeightsFileName(const std::string& name);

// Reads either layout back: model.safetensors if present (as transformers
// prefers it), else the index and its shards, checking that every shard
// holds exactly the names the index maps to it.
std::map<std::string, torch::Tensor> LoadModelWeights(const std::string& dir);

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
