// Sharded checkpoints that reshard: under ZeRO every rank writes only the
// pieces of the tensors it holds, and a job at any other number of processes
// (or one that holds whole tensors) reads back any element range of any
// tensor, touching only the bytes it needs.
//
//   // Saving, on every rank r of N (the same run_id on all of them):
//   accel::WriteShardFile(dir, r, N, run_id,
//                         {{"layers.0.weight", {7, 5}, 12, my_flat_slice}});
//   barrier();
//   if (r == 0) accel::WriteShardIndex(dir, N, run_id);
//
//   // Loading, on any rank of any world size:
//   auto reader = accel::ShardedStateReader::Open(dir);  // Checks it all.
//   // Or the index alone; each file checked as a Read first touches it:
//   auto lazy = accel::ShardedStateReader::OpenIndex(dir);
//   torch::Tensor mine = torch::empty({length}, torch::kFloat);
//   reader.Read("layers.0.weight", offset, mine);   // My range, nothing else.
//   torch::Tensor whole = reader.ReadWhole("layers.0.bias");
//
// A piece is one contiguous range [offset, offset + length) of a tensor's
// elements, flattened row-major, as ZeRO stages 1-3 shard them; a rank may
// hold an empty piece, or none, of a tensor.
//
// The folder holds one safetensors file per rank and an index:
//   rank-00000-of-00004.safetensors ... rank-00003-of-00004.safetensors
//   sharded_state.index.json
// Each rank file is an ordinary safetensors file (Python's safetensors
// package, or json and struct, reads it): every piece is a 1-D tensor of
// `length` elements under the tensor's name, and "__metadata__" holds the
// caller's strings plus "accel_sharded_state", a JSON text:
//   {"version": 1, "run_id": "...", "rank": 1, "world_size": 4,
//    "pieces": {"layers.0.weight": {"global_shape": [7, 5], "offset": 9,
//                                   "checksum": "1f0c..."}, ...}}
// The checksum (16 hex digits) covers the piece's bytes: h starts at FNV's
// offset basis 0xcbf29ce484222325; for each little-endian 8-byte word w
// (the last one zero-padded) h = (h ^ w) * 0x9e3779b97f4a7c15, h ^= h >> 32;
// then h ^= the byte count, and murmur3's fmix64. It catches accidental
// damage, not tampering.
// The index, written by one rank once every rank file is complete, is what
// makes the checkpoint complete; one line per file and per tensor:
//   {"format": "accel.sharded_state", "version": 2, "run_id": "...",
//    "world_size": 4,
//   "files": [
//    {"rank": 0, "name": "rank-00000-of-00004.safetensors", "bytes": 4242,
//     "header_fnv1a64": "89ab...", "metadata": {...the caller's...}}, ...],
//   "tensors": {
//    "layers.0.weight": {"dtype": "F32", "shape": [7, 5],
//                        "pieces": [[0, 0, 9, 1208, "1f0c..."], ...]}, ...}}
// Each piece is [rank, offset, length, byte of its data in that file,
// checksum], every non-empty piece of every file: a reader learns where each
// element lies from the index alone, and opens only the files it reads.
// An index of version 1 (no "tensors", no "metadata") still loads: the
// pieces are then learnt from every file's header.
// Data is little-endian (like safetensors; accel builds only on
// little-endian hosts).
//
// What is checked, and when: WriteShardIndex checks every header before it
// writes the index: each file present, of this run, rank and world size;
// each tensor of one dtype and global shape in every file; its pieces tiling
// [0, numel) exactly (no gap, no overlap). OpenIndex checks the index and
// the tiling of its table. Before a reader uses a file's data, the first
// time it opens it, it checks the file against the index: present, of the
// recorded size and header hash, of this run, rank and world size, its
// header describing exactly the pieces the index lists in it (so an index
// changed after the save is caught too). Open does that for every file at
// once, before returning; OpenIndex as Read and VerifyFile reach each file,
// so that a rank of a large job parses the headers of the files it reads
// and no others. Read checks the checksum
// of every piece it reads any of: the rest of a piece partly in the range
// is read too (through a buffer), so a reshard meets damage as a whole read
// would; it reads at most the pieces that overlap the range.
// Every defect is a CheckpointError naming the file and, where one is
// concerned, the tensor; a wrong argument is a UsageError.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "accel/checkpoint/safetensors.h"

namespace accel {

// One rank's part of one tensor.
struct ShardPiece {
  // "layers.0.weight", "optimizer.0.exp_avg.layers.0.weight", ...
  std::string name;
  std::vector<int64_t> global_shape;  // {} for a scalar.
  int64_t offset = 0;  // Its first element, in the flattened global tensor.
  torch::Tensor data;  // 1-D, its `length` elements; any device.
};

// The name of rank `rank`'s file in a folder of `world_size` ranks.
std::string ShardFileName(int rank, int world_size);
// The index's name in the folder.
inline constexpr char kShardIndexName[] = "sharded_state.index.json";

// Writes dir/ShardFileName(rank, world_size) (beside it first, flushed, then
// renamed into place); every rank calls it with its pieces (at most one
// piece per tensor). `metadata` comes back from ShardedStateReader::
// metadata(rank). Creates `dir` when missing.
void WriteShardFile(const std::string& dir, int rank, int world_size,
                    const std::string& run_id,
                    const std::vector<ShardPiece>& pieces,
                    const std::map<std::string, std::string>& metadata = {});

// Once every rank's WriteShardFile returned (the caller puts a barrier in
// between), one rank checks the files' headers as Open does and writes the
// index, which marks the checkpoint complete.
void WriteShardIndex(const std::string& dir, int world_size,
                     const std::string& run_id);

class ShardedStateReader {
 public:
  // Bytes read since Open, for logs and tests.
  struct IoCounts {
    uint64_t index_and_header_bytes =
        0;                    // By Open, and by checks of files since.
    uint64_t data_bytes = 0;  // By Read.
    uint64_t reads = 0;       // pread calls by Read.
  };

  // Reads the index and each file's header (no tensor data) and checks
  // everything listed above; keeps no file open.
  static ShardedStateReader Open(const std::string& dir);
  // Reads and checks only the index: each rank file is checked as Open
  // would the first time a Read or VerifyFile opens it, and a defect it has
  // surfaces there, as a CheckpointError naming it. What a loading job uses:
  // its ranks share out VerifyFile (every file's header and data checked by
  // one rank) and then parse the headers of the files they read, so a
  // rank's time follows the bytes it reads rather than the file count.
  static ShardedStateReader OpenIndex(const std::string& dir);

  ShardedStateReader(ShardedStateReader&&) noexcept;
  ShardedStateReader& operator=(ShardedStateReader&&) noexcept;
  ~ShardedStateReader();

  std::vector<std::string> names() const;  // Sorted.
  bool contains(const std::string& name) const;
  // The tensor's dtype and global shape; CheckpointError for a name the
  // checkpoint lacks.
  const safetensors::TensorInfo& info(const std::string& name) const;

  // Fills `out` (CPU, contiguous, any shape: its numel() elements in
  // row-major order) with elements [offset, offset + out.numel()) of the
  // flattened tensor `name`, converting to out's dtype when it differs. Reads
  // only the bytes of those elements, with pread, through at most 4 MiB of
  // buffer (none when the dtypes agree). CheckpointError for an unknown name,
  // a range beyond the tensor, or a file that changed since Open; UsageError
  // for a negative offset or an unusable `out`. Safe to call from several
  // threads at once.
  void Read(const std::string& name, int64_t offset, torch::Tensor out) const;
  // The whole tensor, in its global shape and dtype.
  torch::Tensor ReadWhole(const std::string& name) const;
  // Reads every piece the file of rank `rank` holds and checks its
  // checksum, through at most 4 MiB of buffer, keeping nothing: what a
  // job's ranks share out before a load (each a few of the files), so that
  // damaged data stops every rank before anything changes. CheckpointError
  // naming the file and the tensor; UsageError for a rank not in 0 to
  // world_size() - 1.
  void VerifyFile(int rank) const;

  int world_size() const;
  const std::string& run_id() const;
  // The metadata rank `rank` passed to WriteShardFile.
  const std::map<std::string, std::string>& metadata(int rank) const;
  IoCounts io_counts() const;

 private:
  struct State;
  explicit ShardedStateReader(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace accel
