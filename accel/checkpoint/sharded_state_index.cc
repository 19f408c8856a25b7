// The index of a sharded state (sharded_state_catalog.h): written once every
// rank file is complete, read by every rank of a loading job. Since version
// 2 it holds the piece table, so that a rank learns where every element
// lies from one file and then opens (and checks) only the rank files it
// reads: what keeps a load's time per rank to the bytes it reads rather
// than to the number of files (docs/benchmarks.md). CompareWithIndex holds
// each file's header to the table before its data is used.
#include <algorithm>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "accel/checkpoint/sharded_state_catalog.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"

namespace accel::sharded_state_internal {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

constexpr char kFormat[] = "accel.sharded_state";
// About 60 bytes per piece: a million pieces (say 1,000 ranks of 1,000
// tensors) fit.
constexpr uint64_t kMaxIndexBytes = uint64_t{1} << 30;

// A member of a JSON object, by reference (Json::value copies), or null.
const Json& Field(const Json& object, const char* key) {
  static const Json kNull;
  if (!object.is_object()) return kNull;
  const auto found = object.find(key);
  return found == object.end() ? kNull : *found;
}

// Throws a CheckpointError naming the index.
class IndexDefects {
 public:
  explicit IndexDefects(const std::string& dir)
      : dir_(dir), path_(JoinPath(dir, kShardIndexName)) {}
  const std::string& path() const { return path_; }
  [[noreturn]] void Fail(const std::string& defect) const {
    throw CheckpointError("sharded state '" + dir_ + "': index '" + path_ +
                          "': " + defect);
  }

 private:
  std::string dir_;
  std::string path_;
};

// The caller's metadata of one file: an object of strings.
std::map<std::string, std::string> MetadataOf(const IndexDefects& index,
                                              int rank, const Json& value) {
  if (!value.is_object()) {
    index.Fail("files[" + std::to_string(rank) +
               "].metadata must be an object of strings, found " +
               value.dump());
  }
  std::map<std::string, std::string> metadata;
  for (const auto& [key, text] : value.items()) {
    if (!text.is_string()) {
      index.Fail("files[" + std::to_string(rank) + "].metadata[\"" + key +
                 "\"] must be a string, found " + text.dump());
    }
    metadata[key] = text.get<std::string>();
  }
  return metadata;
}

// One entry of "files", checked: the record of the rank's file.
RankFile FileOf(const IndexDefects& index, int rank, int world_size,
                const Json& entry, bool with_metadata) {
  RankFile file;
  file.name = ShardFileName(rank, world_size);
  if (!entry.is_object() || entry.value("rank", Json()) != rank ||
      entry.value("name", Json()) != file.name ||
      !entry.value("bytes", Json()).is_number_unsigned() ||
      !ParseHex(entry.value("header_fnv1a64", Json()),
                &file.record.header_hash)) {
    index.Fail("files[" + std::to_string(rank) + "] must be {\"rank\": " +
               std::to_string(rank) + ", \"name\": \"" + file.name +
               "\", \"bytes\": ..., \"header_fnv1a64\": ...}, found " +
               entry.dump());
  }
  file.record.bytes = entry["bytes"].get<uint64_t>();
  if (with_metadata) {
    file.metadata = MetadataOf(index, rank, Field(entry, "metadata"));
  }
  return file;
}

// One piece of the table: [rank, offset, length, byte, "checksum"].
Piece PieceOf(const IndexDefects& index, const std::string& name,
              const TensorEntry& tensor, int world_size, const Json& value) {
  Piece piece{};
  int64_t rank = -1;
  const bool parsed =
      value.is_array() && value.size() == 5 && Int64Of(value[0], &rank) &&
      Int64Of(value[1], &piece.offset) && Int64Of(value[2], &piece.length) &&
      value[3].is_number_unsigned() && ParseHex(value[4], &piece.checksum);
  if (!parsed || rank >= world_size || piece.length == 0 ||
      piece.offset > tensor.numel - piece.length) {
    index.Fail("tensor '" + name + "': piece " + value.dump() +
               " is not [rank (0 to " + std::to_string(world_size - 1) +
               "), offset, length (> 0), byte, \"checksum\"] within its " +
               std::to_string(tensor.numel) + " elements");
  }
  piece.rank = static_cast<int>(rank);
  piece.begin = value[3].get<uint64_t>();
  return piece;
}

// One entry of "tensors": {"dtype": ..., "shape": [...], "pieces": [...]}.
void AddIndexedTensor(const IndexDefects& index, Catalog* catalog,
                      const std::string& name, const Json& value) {
  TensorEntry tensor;
  const Json& dtype = Field(value, "dtype");
  const Json& pieces = Field(value, "pieces");
  if (!dtype.is_string() ||
      !safetensors::internal::DtypeOfName(dtype.get<std::string>(),
                                          &tensor.info.dtype) ||
      !ShapeOf(Field(value, "shape"), &tensor.info.shape, &tensor.numel) ||
      !pieces.is_array()) {
    index.Fail("tensor '" + name +
               "' must be {\"dtype\": a safetensors dtype, \"shape\": [...], "
               "\"pieces\": [...]}, found " +
               value.dump().substr(0, 200));
  }
  tensor.first_rank = -1;
  for (const Json& entry : pieces) {
    tensor.pieces.push_back(
        PieceOf(index, name, tensor, catalog->world_size, entry));
    ++catalog->pieces_per_rank[tensor.pieces.back().rank];
    if (tensor.first_rank < 0) tensor.first_rank = tensor.pieces.back().rank;
  }
  if (tensor.first_rank < 0) tensor.first_rank = 0;
  catalog->tensors.emplace(name, std::move(tensor));
}

// The piece of rank `rank` that starts at `offset`, or nullptr.
const Piece* PieceAt(const TensorEntry& tensor, int rank, int64_t offset) {
  const auto found = std::lower_bound(
      tensor.pieces.begin(), tensor.pieces.end(), offset,
      [](const Piece& piece, int64_t value) { return piece.offset < value; });
  return found != tensor.pieces.end() && found->offset == offset &&
                 found->rank == rank
             ? &*found
             : nullptr;
}

std::string PieceText(const TensorEntry& tensor, const Piece& piece) {
  return c10::toString(tensor.info.dtype) + std::string(" ") +
         ShapeText(tensor.info.shape) + ", elements " +
         RangeText(piece.offset, piece.offset + piece.length) + " at byte " +
         std::to_string(piece.begin) + ", checksum " + Hex(piece.checksum);
}

}  // namespace

// The pieces of one file's header (`mine`, a catalog of that file alone)
// against the ones the index lists in it.
void CompareWithIndex(const Catalog& catalog, int rank, const Catalog& mine) {
  const auto fail = [&](const std::string& defect) {
    catalog.FailFile(rank, defect +
                               ": the index was changed, or written for "
                               "other files, after the save");
  };
  int64_t pieces = 0;
  for (const auto& [name, entry] : mine.tensors) {
    const auto listed = catalog.tensors.find(name);
    if (listed == catalog.tensors.end()) {
      fail("its header holds tensor '" + name + "', which the index lacks");
    }
    const TensorEntry& tensor = listed->second;
    if (tensor.info.dtype != entry.info.dtype ||
        tensor.info.shape != entry.info.shape) {
      fail("tensor '" + name + "' is " + c10::toString(entry.info.dtype) + " " +
           ShapeText(entry.info.shape) + " in its header, " +
           c10::toString(tensor.info.dtype) + " " +
           ShapeText(tensor.info.shape) + " in the index");
    }
    for (const Piece& piece : entry.pieces) {
      ++pieces;
      const Piece* indexed = PieceAt(tensor, rank, piece.offset);
      if (indexed == nullptr || indexed->length != piece.length ||
          indexed->begin != piece.begin ||
          indexed->checksum != piece.checksum) {
        fail("tensor '" + name + "': its header holds " +
             PieceText(entry, piece) + ", the index " +
             (indexed != nullptr ? PieceText(tensor, *indexed)
                                 : std::string("no such piece in it")));
      }
    }
  }
  if (pieces != catalog.pieces_per_rank[rank]) {
    fail("the index lists " + std::to_string(catalog.pieces_per_rank[rank]) +
         " non-empty pieces in it, its header " + std::to_string(pieces));
  }
}

Catalog ReadIndex(const std::string& dir) {
  const IndexDefects index(dir);
  const std::string why_not = WhyNotARegularFile(index.path());
  if (!why_not.empty()) {
    index.Fail("is missing (" + why_not +
               "): the save did not finish, or the folder holds no sharded "
               "state");
  }
  const std::string text =
      ReadSmallFile(index.path(), kMaxIndexBytes, "sharded-state index");
  Json json;
  try {
    json = Json::parse(text);
  } catch (const Json::exception& e) {
    index.Fail(std::string("not valid JSON: ") + e.what());
  }
  if (!json.is_object() || json.value("format", Json()) != kFormat) {
    index.Fail(std::string("not a sharded-state index (expected \"format\": "
                           "\"") +
               kFormat + "\")");
  }
  const Json& version = Field(json, "version");
  if (version != 1 && version != kIndexVersion) {
    index.Fail("format version " + version.dump() +
               ", this build reads versions 1 to " +
               std::to_string(kIndexVersion));
  }
  const Json& run_id = Field(json, "run_id");
  const Json& world = Field(json, "world_size");
  const Json& files = Field(json, "files");
  if (!run_id.is_string() || run_id.get<std::string>().empty() ||
      !world.is_number_unsigned() || world.get<uint64_t>() < 1 ||
      world.get<uint64_t>() > kMaxWorldSize || !files.is_array() ||
      files.size() != world.get<uint64_t>()) {
    index.Fail("needs run_id (a string), world_size (1 to " +
               std::to_string(kMaxWorldSize) +
               ") and one entry of \"files\" per rank");
  }
  const int world_size = world.get<int>();
  const bool has_table = version == kIndexVersion;
  Catalog catalog = EmptyCatalog(dir, world_size, run_id.get<std::string>());
  for (int rank = 0; rank < world_size; ++rank) {
    catalog.files.push_back(
        FileOf(index, rank, world_size, files[rank], has_table));
  }
  if (!has_table) {
    // Written before the table existed: learn the pieces from the headers.
    std::vector<FileRecord> records;
    for (const RankFile& file : catalog.files) records.push_back(file.record);
    catalog = ReadCatalog(dir, world_size, catalog.run_id, &records);
  } else {
    const Json& tensors = Field(json, "tensors");
    if (!tensors.is_object()) {
      index.Fail("\"tensors\" (the piece table) must be an object");
    }
    for (const auto& [name, value] : tensors.items()) {
      AddIndexedTensor(index, &catalog, name, value);
    }
    CheckTiling(&catalog);
  }
  catalog.header_bytes += text.size();
  return catalog;
}

std::string IndexText(const Catalog& catalog) {
  // One line per file and per tensor: small enough to read, grep and diff.
  const OrderedJson top = {{"format", kFormat},
                           {"version", kIndexVersion},
                           {"run_id", catalog.run_id},
                           {"world_size", catalog.world_size}};
  std::string text = top.dump();
  text.pop_back();  // The closing brace.
  text += ",\n\"files\": [";
  for (size_t rank = 0; rank < catalog.files.size(); ++rank) {
    const RankFile& file = catalog.files[rank];
    const OrderedJson entry = {{"rank", rank},
                               {"name", file.name},
                               {"bytes", file.record.bytes},
                               {"header_fnv1a64", Hex(file.record.header_hash)},
                               {"metadata", file.metadata}};
    text += (rank == 0 ? "\n " : ",\n ") + entry.dump();
  }
  text += "],\n\"tensors\": {";
  bool first = true;
  for (const auto& [name, tensor] : catalog.tensors) {
    OrderedJson pieces = OrderedJson::array();
    for (const Piece& piece : tensor.pieces) {
      pieces.push_back({piece.rank, piece.offset, piece.length, piece.begin,
                        Hex(piece.checksum)});
    }
    const OrderedJson entry = {
        {"dtype", safetensors::internal::DtypeName(tensor.info.dtype)},
        {"shape", tensor.info.shape},
        {"pieces", std::move(pieces)}};
    text += (first ? "\n " : ",\n ") + Json(name).dump() + ": " + entry.dump();
    first = false;
  }
  return text + "}}\n";
}

}  // namespace accel::sharded_state_internal
