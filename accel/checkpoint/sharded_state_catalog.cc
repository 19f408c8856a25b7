// The catalog of a sharded state: reading and checking the index and the
// rank files' headers (sharded_state_catalog.h says what it holds).
#include "accel/checkpoint/sharded_state_catalog.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"

namespace accel::sharded_state_internal {

using Json = nlohmann::json;

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // safetensors' own limit.

// The hash of a header that the index records (FNV-1a, 64 bits).
uint64_t Fnv1a(const std::string& bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (const unsigned char c : bytes) hash = (hash ^ c) * 0x100000001b3ull;
  return hash;
}

// A little-endian word: the host's order (sharded_state_catalog.h checks).
uint64_t LoadWord(const unsigned char* bytes) {
  uint64_t word;
  std::memcpy(&word, bytes, 8);
  return word;
}

}  // namespace

// ---- Checksums --------------------------------------------------------------

void PieceChecksum::Update(const void* data, uint64_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  total_ += size;
  while (pending_ > 0 && pending_ < 8 && size > 0) {
    word_bytes_[pending_++] = *bytes++;
    --size;
  }
  if (pending_ == 8) {
    Mix(LoadWord(word_bytes_));
    pending_ = 0;
  }
  for (; size >= 8; size -= 8, bytes += 8) Mix(LoadWord(bytes));
  for (; size > 0; --size) word_bytes_[pending_++] = *bytes++;
}

uint64_t PieceChecksum::Finish() {
  if (pending_ > 0) {
    std::memset(word_bytes_ + pending_, 0, 8 - pending_);
    Mix(LoadWord(word_bytes_));
    pending_ = 0;
  }
  uint64_t h = hash_ ^ total_;
  h ^= h >> 33;  // murmur3's fmix64.
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

void PieceChecksum::Mix(uint64_t word) {
  hash_ = (hash_ ^ word) * 0x9e3779b97f4a7c15ull;
  hash_ ^= hash_ >> 32;
}

uint64_t ChecksumOf(const void* data, uint64_t size) {
  PieceChecksum checksum;
  checksum.Update(data, size);
  return checksum.Finish();
}

std::string Hex(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx",
                static_cast<unsigned long long>(value));
  return text;
}

// ---- Small helpers ----------------------------------------------------------

bool ParseHex(const Json& value, uint64_t* out) {
  if (!value.is_string()) return false;
  const std::string& text = value.get_ref<const std::string&>();
  if (text.size() != 16) return false;
  uint64_t result = 0;
  for (const char c : text) {
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                             : -1;
    if (digit < 0) return false;
    result = result << 4 | static_cast<uint64_t>(digit);
  }
  *out = result;
  return true;
}

bool Int64Of(const Json& value, int64_t* out) {
  if (!value.is_number_unsigned() ||
      value.get<uint64_t>() >
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return false;
  }
  *out = value.get<int64_t>();
  return true;
}

bool ShapeOf(const Json& value, std::vector<int64_t>* shape, int64_t* numel) {
  if (!value.is_array()) return false;
  shape->clear();
  for (const Json& dim : value) {
    shape->emplace_back();
    if (!Int64Of(dim, &shape->back())) return false;
  }
  *numel = NumelOf(*shape);
  return *numel >= 0;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return text + "]";
}

std::string RangeText(int64_t begin, int64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

int64_t NumelOf(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (const int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(numel, dim, &numel)) return -1;
  }
  return numel;
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

File::File(const std::string& path) {
  fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    why_not_ = ErrnoText(errno);
    return;
  }
  struct stat info;
  if (fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
    why_not_ = "not a regular file";
    close(fd_);
    fd_ = -1;
    return;
  }
  size_ = static_cast<uint64_t>(info.st_size);
  identity_ = {info.st_dev, info.st_ino, info.st_mtim.tv_sec,
               info.st_mtim.tv_nsec};
}

File::~File() {
  if (fd_ >= 0) close(fd_);
}

std::string File::ReadAt(uint64_t offset, void* out, uint64_t count,
                         uint64_t* calls) const {
  char* bytes = static_cast<char*>(out);
  while (count > 0) {
    const size_t chunk =
        static_cast<size_t>(std::min<uint64_t>(count, 1 << 30));
    const ssize_t got = pread(fd_, bytes, chunk, static_cast<off_t>(offset));
    if (calls != nullptr) ++*calls;
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return std::string("read failed: ") + ErrnoText(errno);
    if (got == 0) {
      return "the file ends at byte " + std::to_string(offset) +
             " (truncated after it was checked?)";
    }
    bytes += got;
    offset += static_cast<uint64_t>(got);
    count -= static_cast<uint64_t>(got);
  }
  return "";
}

// ---- The catalog ------------------------------------------------------------

void Catalog::Fail(const std::string& defect) const {
  throw CheckpointError("sharded state '" + dir + "': " + defect);
}

void Catalog::FailFile(int rank, const std::string& defect) const {
  Fail("file '" + ShardFileName(rank, world_size) + "' (rank " +
       std::to_string(rank) + "): " + defect);
}

std::string Catalog::FileOf(int rank) const {
  return "'" + ShardFileName(rank, world_size) + "'";
}

namespace {

// The 8-byte length and the JSON after it, without any tensor data.
std::string ReadHeaderText(const Catalog& catalog, int rank, const File& file,
                           const FileRecord* recorded) {
  const auto truncated = [&]() -> std::string {
    return recorded == nullptr || file.size() >= recorded->bytes
               ? ""
               : " (truncated: the index records " +
                     std::to_string(recorded->bytes) + " bytes)";
  };
  uint64_t length = 0;
  if (file.size() < 8) {
    catalog.FailFile(rank, "holds " + std::to_string(file.size()) +
                               " bytes, fewer than the 8 of a header "
                               "length" +
                               truncated());
  }
  std::string why = file.ReadAt(0, &length, 8);
  if (!why.empty()) catalog.FailFile(rank, why);
  if (length > kMaxHeaderBytes || length > file.size() - 8) {
    catalog.FailFile(rank, "header length " + std::to_string(length) +
                               " exceeds the " +
                               std::to_string(file.size() - 8) +
                               " bytes after it" + truncated());
  }
  std::string text(length, '\0');
  why = file.ReadAt(8, text.data(), length);
  if (!why.empty()) catalog.FailFile(rank, why);
  return text;
}

// Checks the accel metadata's identity against the checkpoint's; "" when
// it matches, else the difference.
std::string IdentityMismatch(const Catalog& catalog, int rank,
                             const Json& identity) {
  const Json& run_id = identity["run_id"];
  if (!run_id.is_string() || run_id.get<std::string>() != catalog.run_id) {
    return "it was written by run " + run_id.dump() + ", not this " +
           "checkpoint's \"" + catalog.run_id + "\" (a file of another save?)";
  }
  const Json& world_size = identity["world_size"];
  if (!world_size.is_number_integer() ||
      world_size.get<int64_t>() != catalog.world_size) {
    return "it was written for world size " + world_size.dump() +
           ", not this checkpoint's " + std::to_string(catalog.world_size);
  }
  const Json& written_rank = identity["rank"];
  if (!written_rank.is_number_integer() ||
      written_rank.get<int64_t>() != rank) {
    return "it was written by rank " + written_rank.dump() + ", not rank " +
           std::to_string(rank);
  }
  return "";
}

// The accel metadata of a header, as JSON (with null fields when absent).
Json AccelMetadata(const Catalog& catalog, int rank,
                   const safetensors::internal::Layout& layout) {
  const auto found = layout.metadata.find(kMetadataKey);
  if (found == layout.metadata.end()) {
    catalog.FailFile(rank, std::string("its metadata lacks \"") + kMetadataKey +
                               "\": not a file of a sharded state");
  }
  Json json;
  try {
    json = Json::parse(found->second);
  } catch (const Json::exception& e) {
    catalog.FailFile(rank, std::string("its \"") + kMetadataKey +
                               "\" is not valid JSON: " + e.what());
  }
  if (!json.is_object()) {
    catalog.FailFile(
        rank, std::string("its \"") + kMetadataKey + "\" is not a JSON object");
  }
  for (const char* key : {"version", "run_id", "rank", "world_size"}) {
    if (!json.contains(key)) json[key] = nullptr;
  }
  if (json["version"] != kVersion) {
    catalog.FailFile(rank, "format version " + json["version"].dump() +
                               ", this build reads version " +
                               std::to_string(kVersion));
  }
  return json;
}

// The layout of a file whose header hash differs from the index's: said
// as the identity it has, when it parses, else as the hash.
[[noreturn]] void FailChangedHeader(const Catalog& catalog, int rank,
                                    const std::string& text, const File& file,
                                    const FileRecord& recorded) {
  std::string identity;
  try {
    const auto layout = safetensors::internal::ParseHeader(
        JoinPath(catalog.dir, ShardFileName(rank, catalog.world_size)), text,
        file.size());
    identity =
        IdentityMismatch(catalog, rank, AccelMetadata(catalog, rank, layout));
  } catch (const CheckpointError&) {
    // Damaged beyond parsing: the hash says enough.
  }
  catalog.FailFile(
      rank, (identity.empty() ? "" : identity + "; ") + "its header (FNV-1a " +
                Hex(Fnv1a(text)) + ") is not the one the index recorded (" +
                Hex(recorded.header_hash) +
                "): the file was replaced or changed after the save");
}

// Names the tensors whose bytes lie past the end of a truncated file.
[[noreturn]] void FailSize(const Catalog& catalog, int rank, const File& file,
                           const FileRecord& recorded,
                           const safetensors::internal::Layout& layout) {
  std::string lost;
  int count = 0;
  for (const auto& [name, span] : layout.tensors) {
    if (span.end > file.size() && count++ < 3) {
      lost += (lost.empty() ? "" : ", ") + ("'" + name + "'");
    }
  }
  catalog.FailFile(
      rank,
      "holds " + std::to_string(file.size()) +
          " bytes, but the index records " + std::to_string(recorded.bytes) +
          (file.size() < recorded.bytes && count == 0 ? " (truncated)"
           : file.size() < recorded.bytes
               ? " (truncated): tensor " + lost +
                     (count > 3 ? " and " + std::to_string(count - 3) + " more"
                                : "") +
                     " lost data"
               : " (bytes were appended after the save)"));
}

// Adds one piece of tensor `name` from rank `rank`'s file, checking its
// description against the header entry and the other files.
void AddPiece(Catalog* catalog, int rank, const std::string& name,
              const safetensors::internal::TensorSpan& span,
              const Json& description) {
  const auto fail = [&](const std::string& defect) {
    catalog->FailFile(rank, "tensor '" + name + "': " + defect);
  };
  if (!description.is_object()) fail("its piece description is not an object");
  const Json& shape_json = description.value("global_shape", Json());
  const Json& offset_json = description.value("offset", Json());
  uint64_t checksum = 0;
  if (!shape_json.is_array() || !offset_json.is_number_unsigned() ||
      !ParseHex(description.value("checksum", Json()), &checksum)) {
    fail(
        "its piece needs global_shape (array), offset (integer >= 0) and "
        "checksum (16 hex digits), found " +
        description.dump());
  }
  std::vector<int64_t> shape;
  int64_t numel = 0;
  if (!ShapeOf(shape_json, &shape, &numel)) {
    fail("global_shape " + shape_json.dump() +
         " is not a shape of at most 2^63 - 1 elements");
  }
  if (span.info.shape.size() != 1) {
    fail("a piece must be 1-D, found shape " + ShapeText(span.info.shape));
  }
  const int64_t length = span.info.shape[0];
  const uint64_t offset = offset_json.get<uint64_t>();
  if (offset > static_cast<uint64_t>(numel) ||
      static_cast<int64_t>(offset) > numel - length) {
    fail("the piece of elements " +
         RangeText(static_cast<int64_t>(std::min<uint64_t>(offset, INT64_MAX)),
                   static_cast<int64_t>(std::min<uint64_t>(offset, INT64_MAX)) +
                       length) +
         " lies beyond its " + std::to_string(numel) + " elements (shape " +
         ShapeText(shape) + ")");
  }

  auto [entry, added] = catalog->tensors.try_emplace(name);
  TensorEntry& tensor = entry->second;
  if (added) {
    tensor.info = {span.info.dtype, shape};
    tensor.numel = numel;
    tensor.first_rank = rank;
  } else if (tensor.info.dtype != span.info.dtype ||
             tensor.info.shape != shape) {
    fail(std::string("it is ") + c10::toString(span.info.dtype) + " " +
         ShapeText(shape) + " here, but " + c10::toString(tensor.info.dtype) +
         " " + ShapeText(tensor.info.shape) + " in " +
         catalog->FileOf(tensor.first_rank));
  }
  if (length > 0) {
    tensor.pieces.push_back(
        {rank, static_cast<int64_t>(offset), length, span.begin, checksum});
    ++catalog->pieces_per_rank[rank];
  }
}

// A rank file's header, read and checked: of the recorded size and hash
// (when `recorded` is given), of this checkpoint's run, rank and world size.
struct CheckedHeader {
  std::string text;
  safetensors::internal::Layout layout;
  Json identity;  // The accel metadata.
};

CheckedHeader ReadRankHeader(const Catalog& catalog, int rank, const File& file,
                             const FileRecord* recorded) {
  CheckedHeader header;
  header.text = ReadHeaderText(catalog, rank, file, recorded);
  if (recorded != nullptr && Fnv1a(header.text) != recorded->header_hash) {
    FailChangedHeader(catalog, rank, header.text, file, *recorded);
  }
  // Checked against the size the index records, so that a truncated file
  // can say which tensors it lost.
  header.layout = safetensors::internal::ParseHeader(
      JoinPath(catalog.dir, ShardFileName(rank, catalog.world_size)),
      header.text, recorded != nullptr ? recorded->bytes : file.size());
  header.identity = AccelMetadata(catalog, rank, header.layout);
  const std::string mismatch = IdentityMismatch(catalog, rank, header.identity);
  if (!mismatch.empty()) catalog.FailFile(rank, mismatch);
  if (recorded != nullptr && file.size() != recorded->bytes) {
    FailSize(catalog, rank, file, *recorded, header.layout);
  }
  return header;
}

// Adds the pieces a checked header describes.
void AddPieces(Catalog* catalog, int rank, const CheckedHeader& header) {
  const Json pieces = header.identity.value("pieces", Json::object());
  if (!pieces.is_object()) {
    catalog->FailFile(rank, "\"pieces\" is not an object");
  }
  for (const auto& [tensor, span] : header.layout.tensors) {
    if (!pieces.contains(tensor)) {
      catalog->FailFile(rank, "tensor '" + tensor +
                                  "' has no piece description (offset, "
                                  "global_shape) in the metadata");
    }
    AddPiece(catalog, rank, tensor, span, pieces[tensor]);
  }
  for (const auto& [tensor, description] : pieces.items()) {
    if (header.layout.tensors.count(tensor) == 0) {
      catalog->FailFile(rank, "tensor '" + tensor +
                                  "' is described in the metadata but the "
                                  "file holds no data for it");
    }
  }
}

// Reads rank `rank`'s header and adds its pieces; `recorded` is what the
// index says of the file (nullptr while the index is being written).
void AddRankFile(Catalog* catalog, int rank, const FileRecord* recorded) {
  const std::unique_ptr<File> file = OpenRankFile(
      *catalog, rank,
      recorded != nullptr ? ""
                          : ": did every rank call WriteShardFile, and all of "
                            "them return (a barrier), before WriteShardIndex? "
                            "Ranks on other machines must write into a folder "
                            "this one sees too (a shared disk)");
  const CheckedHeader header = ReadRankHeader(*catalog, rank, *file, recorded);
  catalog->header_bytes += 8 + header.text.size();
  AddPieces(catalog, rank, header);
  RankFile rank_file;
  rank_file.name = ShardFileName(rank, catalog->world_size);
  rank_file.record = {file->size(), Fnv1a(header.text)};
  rank_file.metadata = header.layout.metadata;
  rank_file.metadata.erase(kMetadataKey);
  catalog->files.push_back(std::move(rank_file));
}

}  // namespace

Catalog EmptyCatalog(const std::string& dir, int world_size,
                     const std::string& run_id) {
  Catalog catalog;
  catalog.dir = dir;
  catalog.world_size = world_size;
  catalog.run_id = run_id;
  catalog.pieces_per_rank.assign(world_size, 0);
  return catalog;
}

std::unique_ptr<File> OpenRankFile(const Catalog& catalog, int rank,
                                   const std::string& hint) {
  const std::string path =
      JoinPath(catalog.dir, ShardFileName(rank, catalog.world_size));
  const std::string why_not = WhyNotARegularFile(path);
  if (!why_not.empty()) {
    catalog.FailFile(rank, "is missing (" + why_not + ")" + hint);
  }
  auto file = std::make_unique<File>(path);
  if (!file->ok()) {
    catalog.FailFile(rank, "cannot be opened: " + file->why_not());
  }
  return file;
}

uint64_t CheckRankFile(const Catalog& catalog, int rank, const File& file) {
  const CheckedHeader header =
      ReadRankHeader(catalog, rank, file, &catalog.files[rank].record);
  Catalog mine = EmptyCatalog(catalog.dir, catalog.world_size, catalog.run_id);
  AddPieces(&mine, rank, header);
  CompareWithIndex(catalog, rank, mine);
  return 8 + header.text.size();
}

// Each tensor's non-empty pieces, sorted, must tile [0, numel) exactly.
void CheckTiling(Catalog* catalog) {
  for (auto& [name, tensor] : catalog->tensors) {
    std::sort(tensor.pieces.begin(), tensor.pieces.end(),
              [](const Piece& a, const Piece& b) {
                return std::tie(a.offset, a.rank) < std::tie(b.offset, b.rank);
              });
    const std::string what = "tensor '" + name + "' (" +
                             c10::toString(tensor.info.dtype) + " " +
                             ShapeText(tensor.info.shape) + ", " +
                             std::to_string(tensor.numel) + " elements): ";
    const auto held = [&](const Piece& piece) {
      return catalog->FileOf(piece.rank) + " holds elements " +
             RangeText(piece.offset, piece.offset + piece.length);
    };
    int64_t covered = 0;
    const Piece* previous = nullptr;
    for (const Piece& piece : tensor.pieces) {
      if (piece.offset < covered) {
        catalog->Fail(
            what + "elements " +
            RangeText(piece.offset,
                      std::min(covered, piece.offset + piece.length)) +
            " are in two files: " + held(*previous) + " and " + held(piece));
      }
      if (piece.offset > covered) {
        catalog->Fail(
            what + "elements " + RangeText(covered, piece.offset) +
            " are in no file: " + (previous ? held(*previous) + ", and " : "") +
            held(piece));
      }
      covered = piece.offset + piece.length;
      previous = &piece;
    }
    if (covered != tensor.numel) {
      catalog->Fail(
          what + "elements " + RangeText(covered, tensor.numel) +
          " are in no file" +
          (previous ? ": the last piece ends there (" + held(*previous) + ")"
                    : ": every file holds an empty piece of it (" +
                          catalog->FileOf(tensor.first_rank) + " and others)"));
    }
  }
}

Catalog ReadCatalog(const std::string& dir, int world_size,
                    const std::string& run_id,
                    const std::vector<FileRecord>* recorded) {
  Catalog catalog = EmptyCatalog(dir, world_size, run_id);
  for (int rank = 0; rank < world_size; ++rank) {
    AddRankFile(&catalog, rank,
                recorded != nullptr ? &(*recorded)[rank] : nullptr);
  }
  CheckTiling(&catalog);
  return catalog;
}

}  // namespace accel::sharded_state_internal
