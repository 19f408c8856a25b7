#include "accel/checkpoint/model_weights.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "accel/checkpoint/safetensors.h"
#include "accel/checkpoint/state_dict.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"

namespace accel {
namespace {

using Json = nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr size_t kMaxListed = 10;
constexpr uint64_t kMaxIndexBytes = 100'000'000;

std::string ShardName(size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors",
                index + 1, count);
  return name;
}

// "model-00002-of-00003.safetensors" and the like.
bool IsShardName(const std::string& name) {
  const std::string pattern = "model-#####-of-#####.safetensors";
  if (name.size() != pattern.size()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const bool ok = pattern[i] == '#'
                        ? std::isdigit(static_cast<unsigned char>(name[i]))
                        : name[i] == pattern[i];
    if (!ok) return false;
  }
  return true;
}

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

std::string Join(const std::string& dir, const std::string& file) {
  return dir.empty() || dir.back() == '/' ? dir + file : dir + "/" + file;
}

// The module's state in save_model's order and names.
NamedTensors Named(const torch::nn::Module& module) {
  NamedTensors named;
  for (const StateEntry& entry : StateDict(module)) {
    named.emplace_back(entry.name, entry.tensor);
  }
  return named;
}

std::string ShapeString(c10::IntArrayRef shape) {
  std::ostringstream text;
  text << shape;
  return text.str();
}

// huggingface_hub's split_torch_state_dict_into_shards: fill shards in
// order; a tensor that would overflow the current shard starts a new one;
// a tensor bigger than max_bytes gets a shard of its own, placed before
// the shard being filled.
std::vector<NamedTensors> SplitIntoShards(const NamedTensors& entries,
                                          int64_t max_bytes) {
  std::vector<NamedTensors> shards;
  NamedTensors current;
  int64_t current_bytes = 0;
  for (const auto& entry : entries) {
    const int64_t bytes = static_cast<int64_t>(entry.second.nbytes());
    if (bytes > max_bytes) {
      shards.push_back({entry});
      continue;
    }
    if (current_bytes + bytes > max_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(entry);
    current_bytes += bytes;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
  return shards;
}

}  // namespace

bool IsModelWeightsFileName(const std::string& name) {
  return IsShardName(name) || name == kSingleFile || name == kIndexFile;
}

namespace {

// Removes what an earlier save left in `dir` that this one did not write.
void RemoveStaleFiles(const std::string& dir,
                      const std::set<std::string>& written) {
  for (const std::string& name : ListFolder(dir)) {
    if (IsModelWeightsFileName(name) && written.count(name) == 0)
      std::remove(Join(dir, name).c_str());
  }
}

// "a, b and 3 more".
std::string ListItems(const std::vector<std::string>& items) {
  std::string text;
  for (size_t i = 0; i < items.size() && i < kMaxListed; ++i) {
    text += (i ? ", " : "") + items[i];
  }
  if (items.size() > kMaxListed) {
    text += " and " + std::to_string(items.size() - kMaxListed) + " more";
  }
  return text;
}

// "'a', 'b' and 3 more".
std::string ListNames(const std::vector<std::string>& names) {
  std::vector<std::string> quoted;
  for (const std::string& name : names) quoted.push_back("'" + name + "'");
  return ListItems(quoted);
}

[[noreturn]] void FailIndex(const std::string& index_path,
                            const std::string& defect) {
  throw CheckpointError("index '" + index_path + "': " + defect);
}

// The names the index at `index_path` maps to each shard file.
std::map<std::string, std::set<std::string>> ReadIndex(
    const std::string& index_path) {
  const auto fail = [&](const std::string& defect) {
    FailIndex(index_path, defect);
  };
  Json index;
  try {
    index = Json::parse(ReadSmallFile(index_path, kMaxIndexBytes, "index"));
  } catch (const Json::exception& e) {
    fail(std::string("not valid JSON: ") + e.what());
  }
  if (!index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    fail("expected an object with a \"weight_map\" object");
  }
  std::map<std::string, std::set<std::string>> names_by_file;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) {
      fail("weight_map value of '" + name + "' must be a file name");
    }
    const std::string& file_name = file.get_ref<const std::string&>();
    if (file_name.empty() || file_name == "." || file_name == ".." ||
        file_name.find('/') != std::string::npos) {
      fail("weight_map sends '" + name + "' to '" + file_name +
           "', which is not a file name in the same folder");
    }
    names_by_file[file_name].insert(name);
  }
  return names_by_file;
}

// The index at `index_path` and its shards in the same folder, each read by
// `read_shard` (whole tensors, or only their header's shapes), checking that
// every shard holds exactly the names the index maps to it.
template <typename Value>
std::map<std::string, Value> ReadSharded(
    const std::string& index_path,
    const std::function<std::map<std::string, Value>(const std::string&)>&
        read_shard) {
  const std::string dir = FolderOf(index_path);
  const auto fail = [&](const std::string& defect) {
    FailIndex(index_path, defect);
  };
  const auto names_by_file = ReadIndex(index_path);
  std::map<std::string, Value> values;
  for (const auto& [file, names] : names_by_file) {
    std::map<std::string, Value> shard = read_shard(Join(dir, file));
    std::vector<std::string> missing, unlisted;
    for (const std::string& name : names) {
      if (shard.count(name) == 0) missing.push_back(name);
    }
    for (auto& [name, value] : shard) {
      if (names.count(name) == 0) {
        unlisted.push_back(name);
      } else {
        values[name] = std::move(value);
      }
    }
    if (!missing.empty()) {
      fail("maps " + ListNames(missing) + " to '" + file +
           "', which does not hold them");
    }
    if (!unlisted.empty()) {
      fail("'" + file + "' holds " + ListNames(unlisted) +
           ", which the index does not map to it");
    }
  }
  return values;
}

// save_model's layout in `dir` read by `read_file`: model.safetensors if
// present (as transformers prefers it), else the index and its shards.
template <typename Value>
std::map<std::string, Value> ReadModelWeights(
    const std::string& dir,
    const std::function<std::map<std::string, Value>(const std::string&)>&
        read_file) {
  if (IsFile(Join(dir, kSingleFile))) return read_file(Join(dir, kSingleFile));
  if (IsFile(Join(dir, kIndexFile))) {
    return ReadSharded<Value>(Join(dir, kIndexFile), read_file);
  }
  throw CheckpointError("no model weights in '" + dir + "': neither " +
                        kSingleFile + " nor " + kIndexFile);
}

}  // namespace

std::vector<std::string> SaveModelWeights(const torch::nn::Module& module,
                                          const std::string& dir,
                                          const std::string& max_shard_size) {
  return SaveModelWeights(Named(module), dir, max_shard_size);
}

std::vector<std::string> SaveModelWeights(const NamedTensors& entries,
                                          const std::string& dir,
                                          const std::string& max_shard_size) {
  const int64_t max_bytes = ParseByteSize(max_shard_size);
  if (max_bytes <= 0) {
    throw UsageError(
        "SaveModelWeights: max_shard_size must be positive, found '" +
        max_shard_size + "'");
  }
  const std::vector<NamedTensors> shards = SplitIntoShards(entries, max_bytes);
  MakeDirectories(dir);

  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  std::vector<std::string> written;
  std::set<std::string> written_names;
  Json weight_map = Json::object();
  int64_t total_size = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name =
        shards.size() == 1 ? kSingleFile : ShardName(i, shards.size());
    std::map<std::string, torch::Tensor> tensors;
    for (const auto& [tensor_name, tensor] : shards[i]) {
      tensors[tensor_name] = tensor;
      weight_map[tensor_name] = name;
      total_size += static_cast<int64_t>(tensor.nbytes());
    }
    safetensors::Save(tensors, Join(dir, name), metadata);
    written.push_back(Join(dir, name));
    written_names.insert(name);
  }
  if (shards.size() > 1) {
    const Json index = {{"metadata", {{"total_size", total_size}}},
                        {"weight_map", weight_map}};
    WriteFileAtomically(Join(dir, kIndexFile), index.dump(2) + "\n");
    written.push_back(Join(dir, kIndexFile));
    written_names.insert(kIndexFile);
  }
  RemoveStaleFiles(dir, written_names);
  return written;
}

std::map<std::string, torch::Tensor> LoadModelWeights(const std::string& dir) {
  return ReadModelWeights<torch::Tensor>(dir, safetensors::Load);
}

std::map<std::string, safetensors::TensorInfo> LoadModelWeightsInfo(
    const std::string& path) {
  const std::function<std::map<std::string, safetensors::TensorInfo>(
      const std::string&)>
      read_header = safetensors::LoadTensorInfo;
  if (IsFile(path)) {
    const bool is_index =
        path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
    return is_index ? ReadSharded(path, read_header) : read_header(path);
  }
  return ReadModelWeights(path, read_header);
}

void LoadModelWeightsInto(torch::nn::Module& module, const std::string& dir) {
  std::map<std::string, torch::Tensor> loaded = LoadModelWeights(dir);
  const NamedTensors targets = Named(module);
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> known;
  for (const auto& [name, target] : targets) {
    known.insert(name);
    const auto it = loaded.find(name);
    if (it == loaded.end()) {
      missing.push_back(name);
    } else if (it->second.sizes() != target.sizes() ||
               it->second.scalar_type() != target.scalar_type()) {
      mismatched.push_back("'" + name + "' (model " +
                           c10::toString(target.scalar_type()) + " " +
                           ShapeString(target.sizes()) + ", file " +
                           c10::toString(it->second.scalar_type()) + " " +
                           ShapeString(it->second.sizes()) + ")");
    }
  }
  for (const auto& [name, tensor] : loaded) {
    if (known.count(name) == 0) unexpected.push_back(name);
  }
  std::string problems;
  if (!missing.empty()) {
    problems += "; missing from the file: " + ListNames(missing);
  }
  if (!unexpected.empty()) {
    problems += "; not in the model: " + ListNames(unexpected);
  }
  if (!mismatched.empty()) {
    problems += "; different shape or dtype: " + ListItems(mismatched);
  }
  if (!problems.empty()) {
    throw CheckpointError("model weights in '" + dir +
                          "' do not match the model" + problems);
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, target] : targets) target.copy_(loaded.at(name));
}

int64_t ParseByteSize(const std::string& text) {
  const auto fail = [&](const std::string& why) {
    throw UsageError("cannot read the byte size '" + text + "': " + why +
                     " (examples: \"10GB\", \"5MiB\", \"100KB\", \"123\")");
  };
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) {
    ++begin;
  }
  while (end > begin &&
         std::isspace(static_cast<unsigned char>(text[end - 1]))) {
    --end;
  }
  size_t number_end = begin;
  while (number_end < end &&
         (std::isdigit(static_cast<unsigned char>(text[number_end])) ||
          text[number_end] == '.')) {
    ++number_end;
  }
  const std::string number = text.substr(begin, number_end - begin);
  size_t unit_begin = number_end;
  while (unit_begin < end && text[unit_begin] == ' ') ++unit_begin;
  std::string unit = text.substr(unit_begin, end - unit_begin);
  for (char& c : unit) c = static_cast<char>(std::toupper(c));
  if (number.empty() || number == "." ||
      std::count(number.begin(), number.end(), '.') > 1) {
    fail("expected a non-negative number");
  }

  static const std::map<std::string, std::pair<int64_t, int>> kUnits = {
      {"", {1000, 0}},    {"B", {1000, 0}},   {"KB", {1000, 1}},
      {"MB", {1000, 2}},  {"GB", {1000, 3}},  {"TB", {1000, 4}},
      {"PB", {1000, 5}},  {"KIB", {1024, 1}}, {"MIB", {1024, 2}},
      {"GIB", {1024, 3}}, {"TIB", {1024, 4}}, {"PIB", {1024, 5}},
  };
  const auto unit_it = kUnits.find(unit);
  if (unit_it == kUnits.end()) {
    fail("unknown unit '" + text.substr(unit_begin, end - unit_begin) +
         "'; use B, KB, MB, GB, TB, PB or KiB, MiB, GiB, TiB, PiB");
  }
  int64_t multiplier = 1;
  for (int i = 0; i < unit_it->second.second; ++i) {
    multiplier *= unit_it->second.first;
  }

  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (number.find('.') == std::string::npos) {
    // Whole numbers exactly, without a detour through double.
    int64_t value = 0;
    for (char digit : number) {
      if (__builtin_mul_overflow(value, 10, &value) ||
          __builtin_add_overflow(value, digit - '0', &value)) {
        fail("beyond the int64 range");
      }
    }
    int64_t bytes;
    if (__builtin_mul_overflow(value, multiplier, &bytes)) {
      fail("beyond the int64 range");
    }
    return bytes;
  }
  const double bytes =
      std::strtod(number.c_str(), nullptr) * static_cast<double>(multiplier);
  if (!(bytes < static_cast<double>(kMax))) fail("beyond the int64 range");
  return static_cast<int64_t>(bytes);  // Whole bytes, rounded down.
}

}  // namespace accel
