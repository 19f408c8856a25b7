// Private to //accel/checkpoint:sharded_state (sharded_state.cc): the catalog
// of a sharded state, what WriteShardIndex and ShardedStateReader::Open learn
// from the index and the rank files' headers, every check of them done on the
// way, and the pieces those checks and Read share (the checksum, the file
// read with pread, the index's text). Kept apart from the public API so that
// the format's checks can be read (and changed) in one place; the format
// itself is described in sharded_state.h.
//
//   Catalog catalog = ReadIndex(dir);  // Open: the index's piece table.
//   const TensorEntry& w = catalog.tensors.at("w");  // Its pieces, tiled.
//   CheckRankFile(catalog, 2, *OpenRankFile(catalog, 2));  // Before a read.
//   Catalog fresh = ReadCatalog(dir, world_size, run_id, nullptr);  // Writer.
//   WriteFileAtomically(index_path, IndexText(fresh));
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "accel/checkpoint/safetensors.h"
#include "accel/checkpoint/sharded_state.h"

// The files' numbers are read and written as the host holds them in memory.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "sharded state files are little-endian; this host is not");

namespace accel::sharded_state_internal {

// The key of a rank file's metadata that describes its pieces.
inline constexpr char kMetadataKey[] = "accel_sharded_state";
// The format version of the rank files' metadata.
inline constexpr int kVersion = 1;
// The index's: 2 adds the piece table and the files' metadata (so that a
// rank reads the headers of only the files it reads); an index of version 1
// still loads, from every file's header.
inline constexpr int kIndexVersion = 2;
// The most ranks an index may list: bounds what a damaged index allocates.
inline constexpr int kMaxWorldSize = 1 << 20;

// ---- Checksums --------------------------------------------------------------

// The checksum of a piece's bytes (sharded_state.h defines it), fed in any
// number of parts: Read checks a piece chunk by chunk. Word-wise, so it keeps
// up with the disk.
class PieceChecksum {
 public:
  void Update(const void* data, uint64_t size);
  uint64_t Finish();

 private:
  void Mix(uint64_t word);

  uint64_t hash_ = 0xcbf29ce484222325ull;
  uint64_t total_ = 0;
  unsigned char word_bytes_[8];
  size_t pending_ = 0;
};

// The checksum of `size` bytes in one part, as WriteShardFile records it.
uint64_t ChecksumOf(const void* data, uint64_t size);

// 16 lowercase hex digits: how checksums and header hashes are written.
std::string Hex(uint64_t value);
// Hex's text back; false for anything else.
bool ParseHex(const nlohmann::json& value, uint64_t* out);

// A JSON integer in [0, 2^63); false for anything else.
bool Int64Of(const nlohmann::json& value, int64_t* out);
// A JSON shape (an array of such integers) and its element count; false when
// it is not one or the count overflows int64.
bool ShapeOf(const nlohmann::json& value, std::vector<int64_t>* shape,
             int64_t* numel);

// ---- Small helpers for messages and paths -----------------------------------

std::string ShapeText(const std::vector<int64_t>& shape);  // "[7, 5]".
std::string RangeText(int64_t begin, int64_t end);         // "[3, 9)".

// The element count of `shape`, or -1 when a dimension is negative or the
// count overflows int64.
int64_t NumelOf(const std::vector<int64_t>& shape);

std::string JoinPath(const std::string& dir, const std::string& name);

// An open file read with pread; closed when it goes out of scope.
class File {
 public:
  // ok() says whether it opened; why_not() why it did not.
  explicit File(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  bool ok() const { return fd_ >= 0; }
  const std::string& why_not() const { return why_not_; }
  uint64_t size() const { return size_; }
  // Which file this is and when it last changed: a Read opens each file
  // anew and compares it with what Open saw.
  struct Identity {
    dev_t device = 0;
    ino_t inode = 0;
    int64_t mtime_s = 0;
    int64_t mtime_ns = 0;
    bool operator==(const Identity& other) const {
      return std::tie(device, inode, mtime_s, mtime_ns) ==
             std::tie(other.device, other.inode, other.mtime_s, other.mtime_ns);
    }
  };
  const Identity& identity() const { return identity_; }

  // Exactly `count` bytes at `offset`; "" on success, else why not. Returns
  // the number of pread calls in *calls.
  std::string ReadAt(uint64_t offset, void* out, uint64_t count,
                     uint64_t* calls = nullptr) const;

 private:
  std::string why_not_;
  int fd_ = -1;
  uint64_t size_ = 0;
  Identity identity_;
};

// ---- The catalog: what Open and WriteShardIndex learn from the headers ------

// One non-empty piece, as one rank's file holds it.
struct Piece {
  int rank;
  int64_t offset;  // In elements of the flattened tensor.
  int64_t length;
  uint64_t begin;  // Where its bytes start in the file.
  uint64_t checksum;
};

struct TensorEntry {
  safetensors::TensorInfo info;
  int64_t numel = 0;
  int first_rank = 0;         // The file that first described it, for messages.
  std::vector<Piece> pieces;  // Non-empty ones, sorted by offset once built.
};

// What the index records of a file.
struct FileRecord {
  uint64_t bytes = 0;
  uint64_t header_hash = 0;
};

struct RankFile {
  std::string name;  // ShardFileName(rank, world_size).
  FileRecord record;
  std::map<std::string, std::string> metadata;  // The caller's.
};

struct Catalog {
  std::string dir;
  std::string run_id;
  int world_size = 0;
  std::vector<RankFile> files;
  std::map<std::string, TensorEntry> tensors;
  std::vector<int64_t> pieces_per_rank;  // The non-empty ones in each file.
  uint64_t header_bytes = 0;             // Read to build it.

  // A CheckpointError naming the folder, and the file of rank `rank`.
  [[noreturn]] void Fail(const std::string& defect) const;
  [[noreturn]] void FailFile(int rank, const std::string& defect) const;
  std::string FileOf(int rank) const;  // Its name, quoted.
};

// A catalog of no files and no tensors yet.
Catalog EmptyCatalog(const std::string& dir, int world_size,
                     const std::string& run_id);

// Reads every rank file's header and checks them (identity, pieces, tiling).
// `recorded` is what the index says of each file, checked too; nullptr while
// the index is being written.
Catalog ReadCatalog(const std::string& dir, int world_size,
                    const std::string& run_id,
                    const std::vector<FileRecord>* recorded);

// Each tensor's non-empty pieces, sorted, must tile [0, numel) exactly.
void CheckTiling(Catalog* catalog);

// Opens the file of rank `rank`; CheckpointError when it is missing (`hint`
// follows the reason) or cannot be opened.
std::unique_ptr<File> OpenRankFile(const Catalog& catalog, int rank,
                                   const std::string& hint = "");

// Checks an open rank file against a catalog read from the index: of the
// recorded size and header hash, of this run, rank and world size, and its
// header describing exactly the pieces the index lists in it. Returns the
// header bytes it read.
uint64_t CheckRankFile(const Catalog& catalog, int rank, const File& file);

// ---- The index (sharded_state_index.cc) -------------------------------------

// Checks the pieces of rank `rank`'s header (`mine`, a catalog of that file
// alone) against the ones the index lists in that file.
void CompareWithIndex(const Catalog& catalog, int rank, const Catalog& mine);

// Reads and checks dir's index and its piece table, reading no rank file
// (CheckRankFile checks each before it is used); for an index of version 1,
// which has no table, every file's header (ReadCatalog).
Catalog ReadIndex(const std::string& dir);

// The index that records `catalog`'s files and pieces, as WriteShardIndex
// writes it.
std::string IndexText(const Catalog& catalog);

}  // namespace accel::sharded_state_internal
