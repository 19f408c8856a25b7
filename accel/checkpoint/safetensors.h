// The safetensors format (Hugging Face's weight files); Accelerate's
// save_model layout on top of it is accel/checkpoint/model_weights.h.
//
//   accel::safetensors::Save({{"weight", w}, {"bias", b}}, "layer.safetensors",
//                            {{"format", "pt"}});
//   std::map<std::string, torch::Tensor> tensors =
//       accel::safetensors::Load("layer.safetensors");
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

// A tensor as a file's header describes it.
struct TensorInfo {
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
  int64_t numel() const;
};

// Every tensor's dtype and shape, after checking the whole header as Load
// does; reads no tensor data, so a model's size is known without loading it
// (accel-estimate-memory).
std::map<std::string, TensorInfo> LoadTensorInfo(const std::string& path);

// The "__metadata__" strings (empty when there are none), after checking
// the whole header; reads no tensor data.
std::map<std::string, std::string> LoadMetadata(const std::string& path);

// For formats built on safetensors (accel/checkpoint/sharded_state.h), which
// read a file's header themselves and then only some of its data.
namespace internal {

// Where a tensor's bytes lie: [begin, end), counted from the start of the
// file (not of the data).
struct TensorSpan {
  TensorInfo info;
  uint64_t begin;
  uint64_t end;
};

struct Layout {
  std::map<std::string, std::string> metadata;
  std::map<std::string, TensorSpan> tensors;
};

// The format's name of a dtype ("F32", "BF16"), or nullptr when it has none.
const char* DtypeName(torch::ScalarType dtype);
// The dtype a format name stands for; false when none does.
bool DtypeOfName(const std::string& name, torch::ScalarType* dtype);

// Checks `header` (the JSON text after the 8-byte length) as Load does, for
// a file of `file_size` bytes; `path` names the file in errors.
Layout ParseHeader(const std::string& path, const std::string& header,
                   uint64_t file_size);

}  // namespace internal

}  // namespace accel::safetensors
