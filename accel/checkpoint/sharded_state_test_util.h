// Private to //accel/checkpoint:sharded_state_test and
// :sharded_state_defect_test: the tensors both tests save and how ZeRO would
// split them over W ranks, so that the round trips and the defect tests cut
// the same files the same way.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "accel/checkpoint/sharded_state.h"

namespace accel::sharded_state_testing {

struct Named {
  std::string name;
  torch::Tensor tensor;
};

// The shapes and dtypes that are easy to get wrong, in the order ZeRO
// flattens them.
std::vector<Named> Originals();

int64_t TotalElements(const std::vector<Named>& tensors);

// Calls visit(tensor index, offset in the tensor, length) for each tensor
// that rank `rank` of `world_size` holds part of (length 0 included), as ZeRO
// cuts the flat concatenation: shares of ceil(total / world_size) elements,
// the last ones shorter or empty.
void ForEachPart(const std::vector<Named>& tensors, int world_size, int rank,
                 const std::function<void(size_t, int64_t, int64_t)>& visit);

// Rank `rank`'s pieces. Some ranks list the tensors they hold nothing of
// (empty pieces), some leave them out: both are allowed.
std::vector<ShardPiece> PiecesOf(const std::vector<Named>& tensors,
                                 int world_size, int rank);

// dir/ShardFileName(rank, world_size).
std::string FileIn(const std::string& dir, int rank, int world_size);

// Every rank's file, each with metadata {"rank_note": "written by R"}, then
// the index: a complete checkpoint.
void WriteAll(const std::string& dir, const std::vector<Named>& tensors,
              int world_size, const std::string& run_id);

}  // namespace accel::sharded_state_testing
