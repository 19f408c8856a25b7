// The sharded-state tests' shared tensors and splits
// (sharded_state_test_util.h).
#include "accel/checkpoint/sharded_state_test_util.h"

#include <algorithm>
#include <utility>

namespace accel::sharded_state_testing {
namespace {

// Rank `rank`'s range of the flat concatenation, as ZeRO cuts it: shares of
// ceil(total / world_size) elements, the last ones shorter or empty.
std::pair<int64_t, int64_t> ShareOf(int64_t total, int world_size, int rank) {
  const int64_t share = (total + world_size - 1) / world_size;
  return {std::min(total, rank * share), std::min(total, (rank + 1) * share)};
}

}  // namespace

std::vector<Named> Originals() {
  torch::manual_seed(7);
  return {
      {"layers.0.weight", torch::randn({7, 5})},
      {"layers.0.bias", torch::randn({13})},
      {"block", torch::randn({3, 4, 5}, torch::kDouble)},
      {"scale", torch::randn({})},
      {"embedding", torch::randn({6, 7}).to(torch::kBFloat16)},
      {"half", torch::randn({11}).to(torch::kHalf)},
      {"steps", torch::randint(-(int64_t{1} << 40), int64_t{1} << 40, {9},
                               torch::kLong)},
      {"mask", torch::rand({10}).gt(0.5)},
      {"empty", torch::zeros({0, 4})},
  };
}

int64_t TotalElements(const std::vector<Named>& tensors) {
  int64_t total = 0;
  for (const Named& t : tensors) total += t.tensor.numel();
  return total;
}

void ForEachPart(const std::vector<Named>& tensors, int world_size, int rank,
                 const std::function<void(size_t, int64_t, int64_t)>& visit) {
  const auto [begin, end] = ShareOf(TotalElements(tensors), world_size, rank);
  int64_t start = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const int64_t numel = tensors[t].tensor.numel();
    const int64_t lo = std::max(begin, start);
    const int64_t hi = std::min(end, start + numel);
    visit(t, hi > lo ? lo - start : 0, std::max<int64_t>(0, hi - lo));
    start += numel;
  }
}

std::vector<ShardPiece> PiecesOf(const std::vector<Named>& tensors,
                                 int world_size, int rank) {
  std::vector<ShardPiece> pieces;
  ForEachPart(tensors, world_size, rank,
              [&](size_t t, int64_t offset, int64_t length) {
                const Named& named = tensors[t];
                const bool listed = length > 0 || (rank + t) % 2 == 0 ||
                                    (named.tensor.numel() == 0 && rank == 0);
                if (!listed) return;
                pieces.push_back(
                    {named.name, named.tensor.sizes().vec(), offset,
                     named.tensor.reshape({-1}).narrow(0, offset, length)});
              });
  return pieces;
}

std::string FileIn(const std::string& dir, int rank, int world_size) {
  return dir + "/" + ShardFileName(rank, world_size);
}

void WriteAll(const std::string& dir, const std::vector<Named>& tensors,
              int world_size, const std::string& run_id) {
  for (int rank = 0; rank < world_size; ++rank) {
    WriteShardFile(dir, rank, world_size, run_id,
                   PiecesOf(tensors, world_size, rank),
                   {{"rank_note", "written by " + std::to_string(rank)}});
  }
  WriteShardIndex(dir, world_size, run_id);
}

}  // namespace accel::sharded_state_testing
