#include "accel/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this host is not");

namespace accel {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // safetensors' own limit.
constexpr const char* kMetadataKey = "__metadata__";

struct DTypeName {
  const char* name;
  torch::ScalarType type;
};

constexpr DTypeName kDTypes[] = {
    {"F64", torch::kDouble},    {"F32", torch::kFloat}, {"F16", torch::kHalf},
    {"BF16", torch::kBFloat16}, {"I64", torch::kLong},  {"I32", torch::kInt},
    {"I16", torch::kShort},     {"I8", torch::kChar},   {"U8", torch::kByte},
    {"BOOL", torch::kBool},
};

const char* FormatName(torch::ScalarType type) {
  for (const DTypeName& entry : kDTypes) {
    if (entry.type == type) return entry.name;
  }
  return nullptr;
}

std::string SupportedNames() {
  std::string names;
  for (const DTypeName& entry : kDTypes) {
    names += (names.empty() ? "" : " ") + std::string(entry.name);
  }
  return names;
}

std::string ShapeString(c10::IntArrayRef shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return text + "]";
}

// One tensor as the header describes it, after validation.
struct Entry {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

struct Header {
  uint64_t data_start = 0;  // 8 + header length.
  std::map<std::string, std::string> metadata;
  std::vector<Entry> entries;
};

// An open safetensors file and everything that can go wrong reading it.
class Reader {
 public:
  explicit Reader(std::string path, const char* kind = "safetensors file")
      : path_(std::move(path)), kind_(kind) {
    fd_ = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) Fail(std::string("cannot open: ") + std::strerror(errno));
    struct stat info;
    if (fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
      Fail("not a regular file");
    }
    size_ = static_cast<uint64_t>(info.st_size);
  }
  ~Reader() {
    if (fd_ >= 0) close(fd_);
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  [[noreturn]] void Fail(const std::string& defect) const {
    throw CheckpointError(std::string(kind_) + " '" + path_ + "': " + defect);
  }

  uint64_t size() const { return size_; }

  // Exactly `count` bytes at `offset`, which the caller checked against
  // size(); a shorter read means the file changed under us.
  void ReadAt(uint64_t offset, void* out, uint64_t count) const {
    char* bytes = static_cast<char*>(out);
    while (count > 0) {
      const size_t chunk =
          static_cast<size_t>(std::min<uint64_t>(count, 1 << 30));
      const ssize_t got = pread(fd_, bytes, chunk, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        Fail(got < 0 ? std::string("read failed: ") + std::strerror(errno)
                     : "file ended early (truncated while reading?)");
      }
      bytes += got;
      offset += static_cast<uint64_t>(got);
      count -= static_cast<uint64_t>(got);
    }
  }

  Header ReadHeader() const;
  torch::Tensor ReadTensor(const Header& header, const Entry& entry) const;

 private:
  Entry ParseEntry(const std::string& name, const Json& info) const;

  std::string path_;
  const char* kind_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// A non-negative JSON integer that fits in int64, or a failure naming
// `what`.
uint64_t ToCount(const Reader& reader, const Json& value,
                 const std::string& what) {
  if (!value.is_number_unsigned() ||
      value.get<uint64_t>() >
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    reader.Fail(what + " must be an integer in [0, 2^63), found " +
                value.dump());
  }
  return value.get<uint64_t>();
}

Entry Reader::ParseEntry(const std::string& name, const Json& info) const {
  const std::string where = "tensor '" + name + "'";
  if (!info.is_object()) {
    Fail(where +
         ": expected an object with dtype, shape and data_offsets, "
         "found " +
         info.type_name());
  }
  const auto dtype = info.find("dtype");
  const auto shape = info.find("shape");
  const auto offsets = info.find("data_offsets");
  if (dtype == info.end() || shape == info.end() || offsets == info.end()) {
    Fail(where + ": needs dtype, shape and data_offsets, found " + info.dump());
  }
  Entry entry;
  entry.name = name;
  if (!dtype->is_string()) Fail(where + ": dtype must be a string");
  const std::string& dtype_name = dtype->get_ref<const std::string&>();
  const DTypeName* known = nullptr;
  for (const DTypeName& candidate : kDTypes) {
    if (dtype_name == candidate.name) known = &candidate;
  }
  if (known == nullptr) {
    Fail(where + ": dtype '" + dtype_name +
         "' is not one LibTorch 1.13 holds (" + SupportedNames() + ")");
  }
  entry.dtype = known->type;

  if (!shape->is_array()) Fail(where + ": shape must be an array");
  // Counts elements, and also the product of max(dim, 1), which LibTorch's
  // strides need to fit in int64 even when a 0 makes the tensor empty.
  uint64_t elements = 1;
  uint64_t strides = 1;
  for (const Json& dim : *shape) {
    const uint64_t size = ToCount(*this, dim, where + ": each dimension");
    if (__builtin_mul_overflow(elements, size, &elements) ||
        __builtin_mul_overflow(strides, std::max<uint64_t>(size, 1),
                               &strides) ||
        strides > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      Fail(where + ": shape " + shape->dump() + " is too large");
    }
    entry.shape.push_back(static_cast<int64_t>(size));
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(elements, c10::elementSize(entry.dtype), &bytes)) {
    Fail(where + ": shape " + shape->dump() + " is too large");
  }

  if (!offsets->is_array() || offsets->size() != 2) {
    Fail(where + ": data_offsets must be [begin, end], found " +
         offsets->dump());
  }
  entry.begin = ToCount(*this, (*offsets)[0], where + ": data_offsets");
  entry.end = ToCount(*this, (*offsets)[1], where + ": data_offsets");
  if (entry.begin > entry.end) {
    Fail(where + ": data_offsets " + offsets->dump() +
         " end before they begin");
  }
  if (entry.end - entry.begin != bytes) {
    Fail(where + ": " + dtype_name + " " + shape->dump() + " needs " +
         std::to_string(bytes) + " bytes, but data_offsets " + offsets->dump() +
         " hold " + std::to_string(entry.end - entry.begin));
  }
  return entry;
}

Header Reader::ReadHeader() const {
  if (size_ < 8) {
    Fail("the file has " + std::to_string(size_) +
         " bytes, fewer than the 8 of the header length");
  }
  uint64_t length;
  ReadAt(0, &length, 8);
  if (length > size_ - 8) {
    Fail("header length " + std::to_string(length) + " exceeds the " +
         std::to_string(size_ - 8) + " bytes after it");
  }
  if (length > kMaxHeaderBytes) {
    Fail("header length " + std::to_string(length) + " exceeds the limit of " +
         std::to_string(kMaxHeaderBytes));
  }
  std::string text(length, '\0');
  ReadAt(8, text.data(), length);
  if (text.empty() || text[0] != '{') {
    Fail("the header does not start with '{'");
  }
  Json json;
  try {
    json = Json::parse(text);
  } catch (const Json::exception& e) {
    Fail(std::string("the header is not valid JSON: ") + e.what());
  }
  if (!json.is_object()) Fail("the header is not a JSON object");

  Header header;
  header.data_start = 8 + length;
  for (const auto& [name, info] : json.items()) {
    if (name != kMetadataKey) {
      header.entries.push_back(ParseEntry(name, info));
      continue;
    }
    if (!info.is_object()) Fail("__metadata__ must be an object");
    for (const auto& [key, value] : info.items()) {
      if (!value.is_string()) {
        Fail("__metadata__ value of '" + key + "' must be a string, found " +
             value.dump());
      }
      header.metadata[key] = value.get<std::string>();
    }
  }

  // The tensors must tile the data exactly: sorted by offset, each starts
  // where the previous ended, and the last ends at the end of the file.
  std::vector<const Entry*> by_offset;
  for (const Entry& entry : header.entries) by_offset.push_back(&entry);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Entry* a, const Entry* b) {
              return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
            });
  uint64_t covered = 0;
  for (const Entry* entry : by_offset) {
    if (entry->begin != covered) {
      Fail("tensor '" + entry->name + "' starts at data offset " +
           std::to_string(entry->begin) + ", but the data before it ends at " +
           std::to_string(covered) +
           (entry->begin < covered ? " (overlap)" : " (gap)"));
    }
    covered = entry->end;
  }
  const uint64_t data_size = size_ - header.data_start;
  if (covered != data_size) {
    Fail("the tensors cover " + std::to_string(covered) +
         " bytes of data, but the file holds " + std::to_string(data_size) +
         (covered < data_size ? " (trailing bytes)" : " (truncated)"));
  }
  return header;
}

torch::Tensor Reader::ReadTensor(const Header& header,
                                 const Entry& entry) const {
  torch::Tensor tensor = torch::empty(entry.shape, entry.dtype);
  ReadAt(header.data_start + entry.begin, tensor.data_ptr(),
         entry.end - entry.begin);
  if (entry.dtype == torch::kBool &&
      tensor.view(torch::kByte).gt(1).any().item<bool>()) {
    Fail("BOOL tensor '" + entry.name + "' holds bytes other than 0 and 1");
  }
  return tensor;
}

std::string Join(const std::string& dir, const std::string& file) {
  return dir.empty() || dir.back() == '/' ? dir + file : dir + "/" + file;
}

}  // namespace

namespace safetensors {

void Save(const std::map<std::string, torch::Tensor>& tensors,
          const std::string& path,
          const std::map<std::string, std::string>& metadata) {
  struct Item {
    std::string name;
    torch::Tensor data;  // Contiguous, on the CPU.
  };
  std::vector<Item> items;
  for (const auto& [name, tensor] : tensors) {
    const std::string where =
        "safetensors::Save('" + path + "'): tensor '" + name + "'";
    if (name == kMetadataKey) {
      throw UsageError(where + ": the name is reserved for metadata");
    }
    if (!tensor.defined()) throw UsageError(where + " is undefined");
    if (tensor.layout() != torch::kStrided) {
      throw UsageError(where +
                       " is not dense (sparse tensors cannot be "
                       "saved; call to_dense() first)");
    }
    if (FormatName(tensor.scalar_type()) == nullptr) {
      throw UsageError(where + " has dtype " +
                       std::string(c10::toString(tensor.scalar_type())) +
                       ", which safetensors lacks (" + SupportedNames() + ")");
    }
    items.push_back({name, tensor.detach().to(torch::kCPU).contiguous()});
  }
  // Widest elements first so that every tensor is aligned to its element
  // size (the data starts at a multiple of 8); then by name.
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) {
                     return a.data.element_size() > b.data.element_size();
                   });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const Item& item : items) {
    const uint64_t bytes = item.data.nbytes();
    header[item.name] = {{"dtype", FormatName(item.data.scalar_type())},
                         {"shape", item.data.sizes().vec()},
                         {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    throw UsageError("safetensors::Save('" + path +
                     "'): a tensor name or metadata string is not valid "
                     "UTF-8: " +
                     e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t length = text.size();

  AtomicFile file(path);
  file.Write(&length, sizeof(length));
  file.Write(text);
  for (const Item& item : items) {
    if (item.data.nbytes() > 0) {
      file.Write(item.data.data_ptr(), item.data.nbytes());
    }
  }
  file.Commit();
}

std::map<std::string, torch::Tensor> Load(const std::string& path) {
  const Reader reader(path);
  const Header header = reader.ReadHeader();
  std::map<std::string, torch::Tensor> tensors;
  for (const Entry& entry : header.entries) {
    tensors[entry.name] = reader.ReadTensor(header, entry);
  }
  return tensors;
}

std::map<std::string, std::string> LoadMetadata(const std::string& path) {
  return Reader(path).ReadHeader().metadata;
}

}  // namespace safetensors

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr size_t kMaxListed = 10;

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

// torch's state_dict order: each module's parameters, then its buffers,
// then its children, depth first.
void CollectStateDict(const torch::nn::Module& module,
                      const std::string& prefix, NamedTensors* out) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    if (item.value().defined())
      out->emplace_back(prefix + item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    if (item.value().defined())
      out->emplace_back(prefix + item.key(), item.value());
  }
  for (const auto& child : module.named_children()) {
    CollectStateDict(*child.value(), prefix + child.key() + ".", out);
  }
}

NamedTensors StateDict(const torch::nn::Module& module) {
  NamedTensors entries;
  CollectStateDict(module, "", &entries);
  return entries;
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

std::string ReadSmallFile(const std::string& path) {
  const Reader reader(path, "index");
  if (reader.size() > kMaxHeaderBytes) {
    reader.Fail("an index of " + std::to_string(reader.size()) +
                " bytes is beyond any plausible model");
  }
  std::string text(reader.size(), '\0');
  reader.ReadAt(0, text.data(), text.size());
  return text;
}

std::map<std::string, torch::Tensor> LoadSharded(const std::string& dir) {
  const std::string index_path = Join(dir, kIndexFile);
  const auto fail = [&](const std::string& defect) {
    throw CheckpointError("index '" + index_path + "': " + defect);
  };
  Json index;
  try {
    index = Json::parse(ReadSmallFile(index_path));
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
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& [file, names] : names_by_file) {
    std::map<std::string, torch::Tensor> shard =
        safetensors::Load(Join(dir, file));
    std::vector<std::string> missing, unlisted;
    for (const std::string& name : names) {
      if (shard.count(name) == 0) missing.push_back(name);
    }
    for (auto& [name, tensor] : shard) {
      if (names.count(name) == 0) {
        unlisted.push_back(name);
      } else {
        tensors[name] = std::move(tensor);
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
  return tensors;
}

}  // namespace

std::vector<std::string> SaveModelWeights(const torch::nn::Module& module,
                                          const std::string& dir,
                                          const std::string& max_shard_size) {
  const int64_t max_bytes = ParseByteSize(max_shard_size);
  if (max_bytes <= 0) {
    throw UsageError(
        "SaveModelWeights: max_shard_size must be positive, found '" +
        max_shard_size + "'");
  }
  const NamedTensors entries = StateDict(module);
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
  if (IsFile(Join(dir, kSingleFile))) {
    return safetensors::Load(Join(dir, kSingleFile));
  }
  if (IsFile(Join(dir, kIndexFile))) return LoadSharded(dir);
  throw CheckpointError("no model weights in '" + dir + "': neither " +
                        kSingleFile + " nor " + kIndexFile);
}

void LoadModelWeightsInto(torch::nn::Module& module, const std::string& dir) {
  std::map<std::string, torch::Tensor> loaded = LoadModelWeights(dir);
  const NamedTensors targets = StateDict(module);
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
