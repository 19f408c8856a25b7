// Sharded checkpoints that reshard: the writers (WriteShardFile,
// WriteShardIndex) and ShardedStateReader. What the files hold and how they
// are checked is in sharded_state_catalog.{h,cc}.
#include "accel/checkpoint/sharded_state.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "accel/checkpoint/sharded_state_catalog.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"

namespace accel {

using safetensors::TensorInfo;
using sharded_state_internal::Catalog;
using sharded_state_internal::ChecksumOf;
using sharded_state_internal::File;
using sharded_state_internal::Hex;
using sharded_state_internal::IndexText;
using sharded_state_internal::JoinPath;
using sharded_state_internal::kMaxWorldSize;
using sharded_state_internal::kMetadataKey;
using sharded_state_internal::kVersion;
using sharded_state_internal::NumelOf;
using sharded_state_internal::Piece;
using sharded_state_internal::PieceChecksum;
using sharded_state_internal::RangeText;
using sharded_state_internal::ReadCatalog;
using sharded_state_internal::ReadIndex;
using sharded_state_internal::ShapeText;
using sharded_state_internal::TensorEntry;

namespace {

using Json = nlohmann::json;

// The conversion buffer of a Read whose `out` has another dtype; a multiple
// of 8 so that a piece's checksum sees whole words until its last chunk.
constexpr int64_t kBufferBytes = 4 << 20;

// The arguments both writers take, checked before they touch a file.
void CheckWorld(const char* where, int world_size, const std::string& run_id) {
  if (world_size < 1 || world_size > kMaxWorldSize) {
    throw UsageError(std::string(where) + ": world_size must be in [1, " +
                     std::to_string(kMaxWorldSize) + "], found " +
                     std::to_string(world_size));
  }
  if (run_id.empty()) {
    throw UsageError(std::string(where) +
                     ": run_id is empty; pass the same id on every rank "
                     "(for example the checkpoint's step and the job's id)");
  }
}

// A piece given to WriteShardFile, on the CPU and contiguous, after checks.
torch::Tensor CheckedPieceData(const std::string& where,
                               const ShardPiece& piece) {
  const std::string what = where + ": piece '" + piece.name + "'";
  if (piece.name.empty()) throw UsageError(where + ": a piece has no name");
  if (!piece.data.defined()) throw UsageError(what + ": data is undefined");
  if (piece.data.dim() != 1) {
    throw UsageError(what +
                     ": data must be 1-D (the piece's elements, "
                     "flattened), found shape " +
                     ShapeText(piece.data.sizes().vec()));
  }
  const int64_t numel = NumelOf(piece.global_shape);
  if (numel < 0) {
    throw UsageError(what + ": global_shape " + ShapeText(piece.global_shape) +
                     " has a negative dimension or too many elements");
  }
  const int64_t length = piece.data.numel();
  if (piece.offset < 0 || piece.offset > numel - length) {
    throw UsageError(what + ": elements " +
                     RangeText(piece.offset, piece.offset + length) +
                     " do not lie within its " + std::to_string(numel) +
                     " elements (shape " + ShapeText(piece.global_shape) + ")");
  }
  return piece.data.detach().to(torch::kCPU).contiguous();
}

}  // namespace

std::string ShardFileName(int rank, int world_size) {
  char name[64];
  std::snprintf(name, sizeof(name), "rank-%05d-of-%05d.safetensors", rank,
                world_size);
  return name;
}

void WriteShardFile(const std::string& dir, int rank, int world_size,
                    const std::string& run_id,
                    const std::vector<ShardPiece>& pieces,
                    const std::map<std::string, std::string>& metadata) {
  const std::string where =
      "WriteShardFile('" + dir + "', rank " + std::to_string(rank) + ")";
  CheckWorld(where.c_str(), world_size, run_id);
  if (rank < 0 || rank >= world_size) {
    throw UsageError(where + ": rank must be in [0, " +
                     std::to_string(world_size) + ")");
  }
  if (metadata.count(kMetadataKey) != 0) {
    throw UsageError(where + ": metadata key \"" + kMetadataKey +
                     "\" is reserved for the pieces' description");
  }
  std::map<std::string, torch::Tensor> tensors;
  Json descriptions = Json::object();
  for (const ShardPiece& piece : pieces) {
    torch::Tensor data = CheckedPieceData(where, piece);
    if (!tensors.emplace(piece.name, data).second) {
      throw UsageError(where + ": two pieces of tensor '" + piece.name +
                       "' (a rank holds one contiguous range of each)");
    }
    descriptions[piece.name] = {
        {"global_shape", piece.global_shape},
        {"offset", piece.offset},
        {"checksum", Hex(ChecksumOf(data.data_ptr(), data.nbytes()))}};
  }
  std::map<std::string, std::string> all_metadata = metadata;
  all_metadata[kMetadataKey] = Json{
      {"version", kVersion},
      {"run_id", run_id},
      {"rank", rank},
      {"world_size", world_size},
      {"pieces", descriptions}}.dump();
  MakeDirectories(dir);
  safetensors::Save(tensors, JoinPath(dir, ShardFileName(rank, world_size)),
                    all_metadata);
}

void WriteShardIndex(const std::string& dir, int world_size,
                     const std::string& run_id) {
  CheckWorld(("WriteShardIndex('" + dir + "')").c_str(), world_size, run_id);
  const Catalog catalog = ReadCatalog(dir, world_size, run_id, nullptr);
  WriteFileAtomically(JoinPath(dir, kShardIndexName), IndexText(catalog));
}

// ---- The reader -------------------------------------------------------------

namespace {

// The rank files a reader has checked against its index (CheckRankFile):
// each the first time the reader opens it, and after that that it is still
// the file it checked.
class CheckedFiles {
 public:
  explicit CheckedFiles(const Catalog& catalog)
      : catalog_(catalog), seen_(catalog.world_size) {}

  // Opens rank `rank`'s file for a read; CheckpointError when it is not the
  // file the index records. Safe to call from several threads at once.
  std::unique_ptr<File> Open(int rank) {
    std::unique_ptr<File> file = sharded_state_internal::OpenRankFile(
        catalog_, rank,
        ": the index lists it, so it was lost or moved after the save");
    std::lock_guard<std::mutex> lock(mutex_);
    std::optional<File::Identity>& seen = seen_[rank];
    if (!seen) {
      header_bytes_ +=
          sharded_state_internal::CheckRankFile(catalog_, rank, *file);
      seen = file->identity();
    } else if (!(file->identity() == *seen) ||
               file->size() != catalog_.files[rank].record.bytes) {
      catalog_.FailFile(rank,
                        "was replaced or changed since the checkpoint was "
                        "opened (another save into the same folder?)");
    }
    return file;
  }

  uint64_t header_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return header_bytes_;
  }

 private:
  const Catalog& catalog_;
  mutable std::mutex mutex_;
  std::vector<std::optional<File::Identity>> seen_;
  uint64_t header_bytes_ = 0;
};

}  // namespace

struct ShardedStateReader::State {
  explicit State(Catalog read) : catalog(std::move(read)), files(catalog) {}

  const Catalog catalog;
  CheckedFiles files;  // Refers to catalog.
  std::atomic<uint64_t> data_bytes{0};
  std::atomic<uint64_t> reads{0};

  const TensorEntry& Find(const std::string& name) const {
    const auto found = catalog.tensors.find(name);
    if (found == catalog.tensors.end()) {
      catalog.Fail("holds no tensor '" + name + "' (it holds " +
                   std::to_string(catalog.tensors.size()) + ")");
    }
    return found->second;
  }
};

namespace {

// The files one Read call opens, each checked against the index.
class OpenFiles {
 public:
  OpenFiles(const Catalog& catalog, CheckedFiles& checked,
            const std::string& tensor)
      : catalog_(catalog), checked_(checked), tensor_(tensor) {}

  const File& Get(int rank) {
    std::unique_ptr<File>& file = files_[rank];
    if (!file) {
      try {
        file = checked_.Open(rank);
      } catch (const CheckpointError& e) {
        throw CheckpointError(std::string(e.what()) + " (reading tensor '" +
                              tensor_ + "')");
      }
    }
    return *file;
  }

  [[noreturn]] void Fail(int rank, const std::string& defect) const {
    catalog_.FailFile(rank, "reading tensor '" + tensor_ + "': " + defect);
  }

 private:
  const Catalog& catalog_;
  CheckedFiles& checked_;
  const std::string& tensor_;
  std::map<int, std::unique_ptr<File>> files_;
};

// A Read's arguments, checked before any file is opened: UsageError for an
// unusable `out` or a negative offset, CheckpointError for a range that the
// tensor does not have.
void CheckRequest(const Catalog& catalog, const TensorEntry& tensor,
                  const std::string& name, int64_t offset,
                  const torch::Tensor& out) {
  const std::string where = "ShardedStateReader::Read('" + name + "')";
  if (!out.defined()) throw UsageError(where + ": out is undefined");
  if (!out.device().is_cpu() || out.layout() != torch::kStrided ||
      !out.is_contiguous()) {
    throw UsageError(where +
                     ": out must be a contiguous, dense CPU tensor (read "
                     "into one, then copy it where it belongs)");
  }
  const int64_t length = out.numel();
  if (offset < 0) {
    throw UsageError(where + ": offset must be >= 0, found " +
                     std::to_string(offset));
  }
  if (offset > tensor.numel - length) {
    catalog.Fail("tensor '" + name + "' has " + std::to_string(tensor.numel) +
                 " elements (shape " + ShapeText(tensor.info.shape) +
                 "), so it cannot give elements " +
                 RangeText(offset, offset + length));
  }
}

// The piece that holds element `offset`: pieces tile [0, numel), so it is
// the one before the first that starts after it.
std::vector<Piece>::const_iterator PieceAt(const TensorEntry& tensor,
                                           int64_t offset) {
  auto piece = std::upper_bound(
      tensor.pieces.begin(), tensor.pieces.end(), offset,
      [](int64_t value, const Piece& p) { return value < p.offset; });
  return --piece;
}

// One Read call: copies elements [offset, offset + out.numel()) of a tensor
// into `out` piece by piece, reading only their bytes, and counts what it
// read (which Read adds to the reader's counts once it succeeded).
class RangeRead {
 public:
  RangeRead(const Catalog& catalog, CheckedFiles& checked,
            const TensorEntry& tensor, const std::string& name, int64_t offset,
            torch::Tensor out)
      : files_(catalog, checked, name),
        dtype_(tensor.info.dtype),
        element_(static_cast<int64_t>(c10::elementSize(dtype_))),
        direct_(out.scalar_type() == dtype_),
        offset_(offset),
        length_(out.numel()),
        out_(out),
        flat_(out.view({-1})) {}

  // Copies the elements of `piece` that lie in the range, and checks the
  // piece's checksum: the bytes before and after them are read too (into
  // a buffer of at most kBufferBytes), so that a damaged piece fails every
  // rank that reads any of it, also when a reshard reads only a part.
  void Copy(const Piece& piece) {
    const int64_t lo = std::max(offset_, piece.offset);
    const int64_t hi = std::min(offset_ + length_, piece.offset + piece.length);
    Cursor cursor{piece, files_.Get(piece.rank), piece.begin, {}};
    Skip(&cursor, lo - piece.offset);
    if (direct_) {
      ReadNext(&cursor,
               static_cast<char*>(out_.data_ptr()) + (lo - offset_) * element_,
               hi - lo);
    } else {
      CopyConverted(&cursor, lo, hi);
    }
    Skip(&cursor, piece.offset + piece.length - hi);
    if (cursor.checksum.Finish() != piece.checksum) {
      files_.Fail(piece.rank,
                  "the bytes of elements " +
                      RangeText(piece.offset, piece.offset + piece.length) +
                      " do not match their checksum (damaged "
                      "after the save)");
    }
  }

  uint64_t bytes() const { return bytes_; }
  uint64_t calls() const { return calls_; }  // pread calls.

 private:
  // Where the next bytes of one piece come from, and what they add up to.
  struct Cursor {
    const Piece& piece;
    const File& file;
    uint64_t file_at;  // The next byte's position in the file.
    PieceChecksum checksum;
  };

  // Reads the piece's next `count` elements into `into`, as they are.
  void ReadNext(Cursor* cursor, void* into, int64_t count) {
    const int rank = cursor->piece.rank;
    const uint64_t size = static_cast<uint64_t>(count * element_);
    const std::string why =
        cursor->file.ReadAt(cursor->file_at, into, size, &calls_);
    if (!why.empty()) files_.Fail(rank, why);
    // Any other byte would be undefined behaviour once read as a bool.
    if (dtype_ == torch::kBool &&
        std::any_of(static_cast<const uint8_t*>(into),
                    static_cast<const uint8_t*>(into) + size,
                    [](uint8_t b) { return b > 1; })) {
      files_.Fail(rank, "BOOL elements hold bytes other than 0 and 1");
    }
    cursor->checksum.Update(into, size);
    cursor->file_at += size;
    bytes_ += size;
  }

  // The piece's next `count` elements, read only for its checksum.
  void Skip(Cursor* cursor, int64_t count) {
    const int64_t chunk = kBufferBytes / element_;
    if (count > 0 && !skipped_.defined()) {
      skipped_ = torch::empty({std::min(chunk, count)}, dtype_);
    }
    for (int64_t done = 0; done < count;) {
      const int64_t n = std::min({chunk, count - done, skipped_.numel()});
      ReadNext(cursor, skipped_.data_ptr(), n);
      done += n;
    }
  }

  // Elements [lo, hi) of `out` through the buffer, converted to out's dtype
  // a chunk at a time, so that no read needs more than kBufferBytes.
  void CopyConverted(Cursor* cursor, int64_t lo, int64_t hi) {
    const int64_t chunk = kBufferBytes / element_;
    if (!buffer_.defined()) {
      buffer_ = torch::empty({std::min(chunk, length_)}, dtype_);
    }
    for (int64_t at = lo; at < hi; at += chunk) {
      const int64_t count = std::min(chunk, hi - at);
      ReadNext(cursor, buffer_.data_ptr(), count);
      flat_.narrow(0, at - offset_, count).copy_(buffer_.narrow(0, 0, count));
    }
  }

  OpenFiles files_;
  const torch::ScalarType dtype_;  // The tensor's, in the files.
  const int64_t element_;          // Its size in bytes.
  const bool direct_;              // out has that dtype: no buffer needed.
  const int64_t offset_;
  const int64_t length_;
  torch::Tensor out_;
  torch::Tensor flat_;     // out_, as 1-D.
  torch::Tensor buffer_;   // Only when converting; at most kBufferBytes.
  torch::Tensor skipped_;  // A piece's bytes outside the range.
  uint64_t calls_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace

ShardedStateReader::ShardedStateReader(std::unique_ptr<State> state)
    : state_(std::move(state)) {}
ShardedStateReader::ShardedStateReader(ShardedStateReader&&) noexcept = default;
ShardedStateReader& ShardedStateReader::operator=(
    ShardedStateReader&&) noexcept = default;
ShardedStateReader::~ShardedStateReader() = default;

ShardedStateReader ShardedStateReader::Open(const std::string& dir) {
  ShardedStateReader reader = OpenIndex(dir);
  for (int rank = 0; rank < reader.world_size(); ++rank) {
    reader.state_->files.Open(rank);
  }
  return reader;
}

ShardedStateReader ShardedStateReader::OpenIndex(const std::string& dir) {
  return ShardedStateReader(std::make_unique<State>(ReadIndex(dir)));
}

std::vector<std::string> ShardedStateReader::names() const {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : state_->catalog.tensors) {
    names.push_back(name);
  }
  return names;
}

bool ShardedStateReader::contains(const std::string& name) const {
  return state_->catalog.tensors.count(name) != 0;
}

const TensorInfo& ShardedStateReader::info(const std::string& name) const {
  return state_->Find(name).info;
}

void ShardedStateReader::Read(const std::string& name, int64_t offset,
                              torch::Tensor out) const {
  const TensorEntry& tensor = state_->Find(name);
  CheckRequest(state_->catalog, tensor, name, offset, out);
  const int64_t length = out.numel();
  if (length == 0) return;
  RangeRead range(state_->catalog, state_->files, tensor, name, offset, out);
  for (auto piece = PieceAt(tensor, offset);
       piece != tensor.pieces.end() && piece->offset < offset + length;
       ++piece) {
    range.Copy(*piece);
  }
  state_->data_bytes += range.bytes();
  state_->reads += range.calls();
}
torch::Tensor ShardedStateReader::ReadWhole(const std::string& name) const {
  const TensorInfo& tensor = info(name);
  torch::Tensor whole = torch::empty(tensor.shape, tensor.dtype);
  Read(name, 0, whole);
  return whole;
}

void ShardedStateReader::VerifyFile(int rank) const {
  if (rank < 0 || rank >= world_size()) {
    throw UsageError("ShardedStateReader::VerifyFile(" + std::to_string(rank) +
                     "): the checkpoint has ranks 0 to " +
                     std::to_string(world_size() - 1));
  }
  state_->files.Open(rank);  // Its header, also when it holds no piece.
  for (const auto& [name, tensor] : state_->catalog.tensors) {
    for (const Piece& piece : tensor.pieces) {
      if (piece.rank != rank) continue;
      // An empty range: Copy reads the whole piece only for its checksum.
      RangeRead range(state_->catalog, state_->files, tensor, name,
                      piece.offset, torch::empty({0}, tensor.info.dtype));
      range.Copy(piece);
      state_->data_bytes += range.bytes();
      state_->reads += range.calls();
    }
  }
}

int ShardedStateReader::world_size() const {
  return state_->catalog.world_size;
}

const std::string& ShardedStateReader::run_id() const {
  return state_->catalog.run_id;
}

const std::map<std::string, std::string>& ShardedStateReader::metadata(
    int rank) const {
  if (rank < 0 || rank >= world_size()) {
    throw UsageError("ShardedStateReader::metadata(" + std::to_string(rank) +
                     "): the checkpoint has ranks 0 to " +
                     std::to_string(world_size() - 1));
  }
  return state_->catalog.files[rank].metadata;
}

ShardedStateReader::IoCounts ShardedStateReader::io_counts() const {
  IoCounts counts;
  counts.index_and_header_bytes =
      state_->catalog.header_bytes + state_->files.header_bytes();
  counts.data_bytes = state_->data_bytes.load();
  counts.reads = state_->reads.load();
  return counts;
}

}  // namespace accel
