#include "accel/checkpoint/tensor_shares.h"

#include <cctype>
#include <nlohmann/json.hpp>
#include <set>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

using Json = nlohmann::json;

// The length of "@tp<r>of<n>" at `at` of `name`, or 0 when it is not one.
size_t MarkerLength(const std::string& name, size_t at) {
  if (name.compare(at, 3, "@tp") != 0) return 0;
  size_t i = at + 3;
  const auto digits = [&] {
    const size_t first = i;
    while (i < name.size() &&
           std::isdigit(static_cast<unsigned char>(name[i]))) {
      ++i;
    }
    return i > first;
  };
  if (!digits() || name.compare(i, 2, "of") != 0) return 0;
  i += 2;
  if (!digits() || (i < name.size() && name[i] != '/')) return 0;
  return i - at;
}

std::map<std::string, TensorSplit> DecodeSplits(
    const ShardedStateReader& reader) {
  std::map<std::string, TensorSplit> splits;
  const auto& metadata = reader.metadata(0);
  const auto found = metadata.find(kTensorSplitsKey);
  const std::string where = std::string("the checkpoint's ") +
                            kTensorSplitsKey + " (rank 0's metadata)";
  // Every rank writes the same table: one that differs was changed.
  for (int rank = 1; rank < reader.world_size(); ++rank) {
    const auto& other = reader.metadata(rank);
    const auto theirs = other.find(kTensorSplitsKey);
    const bool same =
        (found == metadata.end()) == (theirs == other.end()) &&
        (found == metadata.end() || found->second == theirs->second);
    if (!same) {
      throw CheckpointError(std::string("the checkpoint's ") +
                            kTensorSplitsKey +
                            " differ between rank 0's and "
                            "rank " +
                            std::to_string(rank) +
                            "'s files: the files were changed after the save");
    }
  }
  if (found == metadata.end()) return splits;
  try {
    // Kept in a variable: items() refers to it for the whole loop.
    const Json parsed = Json::parse(found->second);
    if (!parsed.is_object()) {
      throw CheckpointError(where + " is not a JSON object");
    }
    for (const auto& [name, value] : parsed.items()) {
      TensorSplit split{.dim = value.at("dim").get<int64_t>(),
                        .fused = value.at("fused").get<int64_t>(),
                        .size = value.at("size").get<int>()};
      if (split.dim < 0 || split.fused < 1 || split.size < 2) {
        throw CheckpointError(where + ": " + name + " has split " +
                              split.ToString());
      }
      splits.emplace(name, split);
    }
  } catch (const Json::exception& error) {
    throw CheckpointError(where + " is not what accel writes: " + error.what());
  }
  for (const auto& [name, split] : splits) {
    for (int r = 0; r < split.size; ++r) {
      if (!reader.contains(ShareName(name, r, split.size))) {
        throw CheckpointError(where + " says " + name + " was saved in " +
                              std::to_string(split.size) +
                              " shares, but the checkpoint holds no " +
                              ShareName(name, r, split.size));
      }
    }
  }
  return splits;
}

}  // namespace

std::string ShareName(const std::string& name, int rank, int size) {
  return name + "@tp" + std::to_string(rank) + "of" + std::to_string(size);
}

std::string EncodeTensorSplits(
    const std::map<std::string, TensorSplit>& splits) {
  Json json = Json::object();
  for (const auto& [name, split] : splits) {
    json[name] = {
        {"dim", split.dim}, {"fused", split.fused}, {"size", split.size}};
  }
  return json.dump();
}

SharesReader::SharesReader(const ShardedStateReader& reader)
    : reader_(reader), splits_(DecodeSplits(reader)) {}

const TensorSplit* SharesReader::SplitOf(const std::string& parameter) const {
  const auto found = splits_.find(parameter);
  return found == splits_.end() ? nullptr : &found->second;
}

std::string SharesReader::Held(const StateName& name) const {
  const TensorSplit* split = SplitOf(name.parameter);
  return split == nullptr ? name.Whole() : name.Share(0, split->size);
}

bool SharesReader::Contains(const StateName& name) const {
  return reader_.contains(Held(name));
}

std::vector<int64_t> SharesReader::Shape(const StateName& name) const {
  std::vector<int64_t> shape = reader_.info(Held(name)).shape;
  const TensorSplit* split = SplitOf(name.parameter);
  if (split == nullptr || shape.empty()) return shape;
  if (split->dim >= static_cast<int64_t>(shape.size())) {
    throw CheckpointError("the checkpoint holds " + Held(name) + " of shape " +
                          c10::str(c10::IntArrayRef(shape)) +
                          ", which its split (" + split->ToString() +
                          ") does not fit");
  }
  return WholeShape(shape, *split);
}

torch::ScalarType SharesReader::Dtype(const StateName& name) const {
  return reader_.info(Held(name)).dtype;
}

torch::Tensor SharesReader::ReadWhole(const StateName& name) const {
  const TensorSplit* split = SplitOf(name.parameter);
  if (split == nullptr) return reader_.ReadWhole(name.Whole());
  if (reader_.info(Held(name)).shape.empty()) {
    return reader_.ReadWhole(Held(name));
  }
  std::vector<torch::Tensor> shares;
  for (int r = 0; r < split->size; ++r) {
    shares.push_back(reader_.ReadWhole(name.Share(r, split->size)));
  }
  try {
    return JoinShares(shares, *split);
  } catch (const UsageError& error) {
    throw CheckpointError("the checkpoint's shares of " + name.Whole() +
                          " do not join: " + error.what());
  }
}

void SharesReader::Read(const StateName& name, const TensorSplit& split,
                        int rank, int64_t offset, torch::Tensor out) const {
  const TensorSplit* saved = SplitOf(name.parameter);
  if (saved == nullptr && split.size == 1) {
    reader_.Read(name.Whole(), offset, out);
    return;
  }
  if (saved != nullptr && *saved == split) {
    reader_.Read(name.Share(rank, split.size), offset, out);
    return;
  }
  // Another split than the saved one: cut this share from the whole.
  const torch::Tensor whole = ReadWhole(name);
  torch::Tensor share;
  try {
    share = split.size == 1 ? whole : ShareOf(whole, split, rank);
  } catch (const UsageError& error) {
    throw CheckpointError("the checkpoint's " + name.Whole() + " (shape " +
                          c10::str(whole.sizes()) + ") does not split as " +
                          split.ToString() + ": " + error.what());
  }
  const torch::Tensor flat = share.reshape({-1});
  if (offset < 0 || offset + out.numel() > flat.numel()) {
    throw CheckpointError("elements [" + std::to_string(offset) + ", " +
                          std::to_string(offset + out.numel()) + ") of share " +
                          std::to_string(rank) + " of " + name.Whole() +
                          " are beyond its " + std::to_string(flat.numel()));
  }
  out.view({-1}).copy_(flat.narrow(0, offset, out.numel()));
}

std::vector<std::string> SharesReader::Suffixes(
    const std::string& prefix, const std::string& parameter) const {
  const std::string start = prefix + parameter;
  const TensorSplit* split = SplitOf(parameter);
  const std::string first_share =
      split == nullptr ? "" : ShareName("", 0, split->size);
  std::set<std::string> suffixes;
  for (const std::string& name : reader_.names()) {
    if (name.compare(0, start.size(), start) != 0) continue;
    std::string rest = name.substr(start.size());
    if (split != nullptr) {
      if (rest.compare(0, first_share.size(), first_share) != 0) continue;
      rest = rest.substr(first_share.size());
    }
    if (rest.empty() || rest[0] == '/') suffixes.insert(rest);
  }
  return {suffixes.begin(), suffixes.end()};
}

std::vector<std::string> SharesReader::Names() const {
  std::set<std::string> names;
  for (const std::string& name : reader_.names()) {
    const size_t at = name.find("@tp");
    const size_t length = at == std::string::npos ? 0 : MarkerLength(name, at);
    names.insert(length == 0 ? name
                             : name.substr(0, at) + name.substr(at + length));
  }
  return {names.begin(), names.end()};
}

}  // namespace accel
