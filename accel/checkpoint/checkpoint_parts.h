// Private to accel/checkpoint: what checkpoint.cc (the save) and
// checkpoint_load.cc (the checks and the load) share: the parts of the
// training state with a save/load pair, and the names of their entries.
//
//   for (const StatefulKind& kind : StatefulKinds(contents)) {
//     for (const Stateful& part : kind.parts) part.save(archive);
//   }
#pragma once

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <functional>
#include <string>
#include <vector>

#include "accel/checkpoint/checkpoint.h"

namespace accel::checkpoint_internal {

// The shared file's entry of the data loaders' positions.
extern const char* const kLoaderSamplesKey;

// "random_states_3": the role of rank 3's file.
std::string RandomStatesRole(int rank);

// A part of the training state with a save/load pair.
struct Stateful {
  std::string name;
  std::function<void(torch::serialize::OutputArchive&)> save;
  std::function<void(torch::serialize::InputArchive&)> load;
};

struct StatefulKind {
  std::string singular;  // "optimizer": entries optimizer_0, optimizer_1...
  std::string plural;    // "optimizers": the count is num_optimizers.
  std::vector<Stateful> parts;
};

// The optimizers, schedulers, scaler and registered objects, by kind.
std::vector<StatefulKind> StatefulKinds(const CheckpointContents& contents);

// Whether each rank's optimizer state is its own (ZeRO at several
// processes).
bool IsSharded(const CheckpointContents& contents, int world_size);

}  // namespace accel::checkpoint_internal
