// Tensor-parallel shares in sharded checkpoints (sharded_state.h): a
// parameter that tensor parallelism split (accel/core/tensor_split.h) is
// saved as one tensor per share, "<name>@tp<rank>of<size>", each cut into
// pieces by ZeRO like any other tensor, and its optimizer state likewise
// ("optimizer_0/<name>@tp1of2/exp_avg"). Every rank file's metadata says
// how each such parameter was split, under "accel_tensor_splits":
//   {"model_0/blocks.0.fc_proj.weight": {"dim": 1, "fused": 1, "size": 2}}
// SharesReader reads a checkpoint by the parameters' own names: the whole
// tensor, or any share at any tensor-parallel size, whether the checkpoint
// holds it whole or in shares of the same or another size.
//
//   accel::SharesReader shares(reader);
//   const accel::StateName weight{"", "model_0/blocks.0.fc.weight", ""};
//   torch::Tensor whole = shares.ReadWhole(weight);       // [256, 64]
//   shares.Read(weight, {.dim = 0, .size = 4}, /*rank=*/1, offset, out);
//
// A share of the size it was saved at is read piece by piece (only its
// bytes); one at another size is cut from the whole tensor, read into
// memory first (one tensor at a time).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "accel/checkpoint/sharded_state.h"
#include "accel/core/tensor_split.h"

namespace accel {

// The metadata key of the splits.
inline constexpr char kTensorSplitsKey[] = "accel_tensor_splits";

// "<name>@tp<rank>of<size>".
std::string ShareName(const std::string& name, int rank, int size);

// The metadata value for `splits` (parameter name -> split).
std::string EncodeTensorSplits(
    const std::map<std::string, TensorSplit>& splits);

// A tensor of a checkpoint by its parameter's name: prefix + parameter +
// suffix ("" + "model_0/fc.weight" + "", or "optimizer_0/" +
// "model_0/fc.weight" + "/exp_avg").
struct StateName {
  std::string prefix;
  std::string parameter;
  std::string suffix;

  std::string Whole() const { return prefix + parameter + suffix; }
  std::string Share(int rank, int size) const {
    return prefix + ShareName(parameter, rank, size) + suffix;
  }
};

class SharesReader {
 public:
  // CheckpointError when the metadata of the splits cannot be read, or
  // names a parameter whose shares are not all there.
  explicit SharesReader(const ShardedStateReader& reader);

  // How the checkpoint split `parameter`; nullptr when it holds it whole.
  const TensorSplit* SplitOf(const std::string& parameter) const;
  // Whether it holds the tensor, whole or in shares.
  bool Contains(const StateName& name) const;
  // The whole tensor's shape and dtype; CheckpointError when not held.
  std::vector<int64_t> Shape(const StateName& name) const;
  torch::ScalarType Dtype(const StateName& name) const;
  // The whole tensor (a scalar saved with each share: share 0's).
  torch::Tensor ReadWhole(const StateName& name) const;
  // Fills `out` (as ShardedStateReader::Read) with elements [offset,
  // offset + out.numel()) of share `rank` of the tensor cut as `split`
  // (split.size 1: of the whole tensor).
  void Read(const StateName& name, const TensorSplit& split, int rank,
            int64_t offset, torch::Tensor out) const;
  // The suffixes of the tensors held under prefix + parameter ("/exp_avg",
  // "/step", ...), whole or in shares, sorted.
  std::vector<std::string> Suffixes(const std::string& prefix,
                                    const std::string& parameter) const;
  // Every tensor held, shares under their parameter's name, sorted.
  std::vector<std::string> Names() const;

 private:
  // The held name of share 0, or the whole name.
  std::string Held(const StateName& name) const;

  const ShardedStateReader& reader_;
  std::map<std::string, TensorSplit> splits_;
};

}  // namespace accel
