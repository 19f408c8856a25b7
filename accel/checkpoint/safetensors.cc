#include "accel/checkpoint/safetensors.h"

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

// Checks a header's JSON against the size of the file it came from; `path`
// and `kind` name the file in every error.
class HeaderParser {
 public:
  explicit HeaderParser(std::string path, const char* kind = "safetensors file")
      : path_(std::move(path)), kind_(kind) {}

  [[noreturn]] void Fail(const std::string& defect) const {
    throw CheckpointError(std::string(kind_) + " '" + path_ + "': " + defect);
  }

  // `text` is the JSON after the 8-byte length, of a file of `file_size`
  // bytes.
  Header Parse(const std::string& text, uint64_t file_size) const;

 protected:
  const std::string& path() const { return path_; }

 private:
  Entry ParseEntry(const std::string& name, const Json& info) const;

  std::string path_;
  const char* kind_;
};

// An open safetensors file and everything that can go wrong reading it.
class Reader : public HeaderParser {
 public:
  explicit Reader(std::string path, const char* kind = "safetensors file")
      : HeaderParser(std::move(path), kind) {
    fd_ = open(this->path().c_str(), O_RDONLY | O_CLOEXEC);
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
  int fd_ = -1;
  uint64_t size_ = 0;
};

// A non-negative JSON integer that fits in int64, or a failure naming
// `what`.
uint64_t ToCount(const HeaderParser& reader, const Json& value,
                 const std::string& what) {
  if (!value.is_number_unsigned() ||
      value.get<uint64_t>() >
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    reader.Fail(what + " must be an integer in [0, 2^63), found " +
                value.dump());
  }
  return value.get<uint64_t>();
}

Entry HeaderParser::ParseEntry(const std::string& name,
                               const Json& info) const {
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
  if (!safetensors::internal::DtypeOfName(dtype_name, &entry.dtype)) {
    Fail(where + ": dtype '" + dtype_name +
         "' is not one LibTorch 1.13 holds (" + SupportedNames() + ")");
  }

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
  return Parse(text, size_);
}

Header HeaderParser::Parse(const std::string& text, uint64_t file_size) const {
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
  header.data_start = 8 + text.size();
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
  if (file_size < header.data_start) {
    Fail("the header ends at byte " + std::to_string(header.data_start) +
         ", after the file's " + std::to_string(file_size) + " bytes");
  }
  const uint64_t data_size = file_size - header.data_start;
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

int64_t TensorInfo::numel() const {
  // Cannot overflow for a header that was read: ParseEntry bounds the
  // product of the dimensions by int64's range.
  int64_t elements = 1;
  for (const int64_t size : shape) elements *= size;
  return elements;
}

std::map<std::string, TensorInfo> LoadTensorInfo(const std::string& path) {
  std::map<std::string, TensorInfo> infos;
  for (Entry& entry : Reader(path).ReadHeader().entries) {
    infos[entry.name] = {entry.dtype, std::move(entry.shape)};
  }
  return infos;
}

std::map<std::string, std::string> LoadMetadata(const std::string& path) {
  return Reader(path).ReadHeader().metadata;
}

namespace internal {

const char* DtypeName(torch::ScalarType dtype) { return FormatName(dtype); }

bool DtypeOfName(const std::string& name, torch::ScalarType* dtype) {
  for (const DTypeName& candidate : kDTypes) {
    if (name == candidate.name) {
      *dtype = candidate.type;
      return true;
    }
  }
  return false;
}

Layout ParseHeader(const std::string& path, const std::string& header,
                   uint64_t file_size) {
  const HeaderParser parser(path);
  if (header.size() > kMaxHeaderBytes) {
    parser.Fail("header length " + std::to_string(header.size()) +
                " exceeds the limit of " + std::to_string(kMaxHeaderBytes));
  }
  Header parsed = parser.Parse(header, file_size);
  Layout layout;
  layout.metadata = std::move(parsed.metadata);
  for (Entry& entry : parsed.entries) {
    layout.tensors[entry.name] = {{entry.dtype, std::move(entry.shape)},
                                  parsed.data_start + entry.begin,
                                  parsed.data_start + entry.end};
  }
  return layout;
}

}  // namespace internal

}  // namespace safetensors

}  // namespace accel
