// The Accelerator's sharded checkpoints (accel/checkpoint/checkpoint.h,
// ShardedTensors): which pieces of every model's weights and every
// optimizer's state this rank saves, and what it reads back, whatever the
// process count and ZeRO stage that saved them. Under ZeRO a rank saves
// the pieces it steps; what every rank holds whole (buffers, frozen
// parameters, everything at stage 0) is cut evenly, each rank saving its
// share. A load reads into ZeRO's pieces only their ranges (stage 3's units
// are never gathered), and whole tensors whole. A parameter that tensor
// parallelism split is saved share by share, each share as a tensor of its
// own (accel/checkpoint/tensor_shares.h), and read back at any tp size.
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "accel/accelerator.h"
#include "accel/checkpoint/sharded_state.h"
#include "accel/checkpoint/state_dict.h"
#include "accel/checkpoint/tensor_shares.h"
#include "accel/core/libtorch_compat.h"
#include "accel/core/tensor_split.h"
#include "accel/optim/param_state_codec.h"
#include "accel/parallel/parallel_linear.h"
#include "accel/parallel/zero.h"
#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

const void* Key(const torch::Tensor& t) { return t.unsafeGetTensorImpl(); }

// Elements [first, second) of n that `rank` of `world` saves of a tensor
// every rank holds whole.
std::pair<int64_t, int64_t> EvenShare(int64_t n, int rank, int world) {
  const int64_t chunk = (n + world - 1) / world;
  const int64_t begin = std::min(n, chunk * rank);
  return {begin, std::min(n, begin + chunk)};
}

// Where a rank stands in the job, for what it saves: on a mesh, the ranks
// of replica 0 write ZeRO's pieces (the other replicas hold the same), and
// of a parameter that tensor parallelism did not split, tp rank 0 alone.
struct Writer {
  int rank = 0;
  int world = 1;
  bool replica_writes = true;
  int tp_rank = 0;
  int tp_size = 1;
};

// A part of a parameter (or buffer) this rank holds: elements [begin, begin
// + values.numel()) of `parameter` (of `shape`), or all of it when `whole`;
// with `split`, of share `share` of it (accel/checkpoint/tensor_shares.h).
struct Slot {
  std::string parameter;       // "model_0/blocks.0.fc.weight"
  std::vector<int64_t> shape;  // Of what this rank holds (its share).
  int64_t begin = 0;
  torch::Tensor values;
  bool whole = false;
  bool saved = true;  // Whether this rank writes it.
  TensorSplit split;  // size 1: not split.
  int share = 0;

  // The name its pieces have in the checkpoint.
  std::string Held() const {
    return split.size > 1 ? ShareName(parameter, share, split.size) : parameter;
  }
  std::vector<int64_t> WholeShape() const {
    return split.size > 1 ? accel::WholeShape(shape, split) : shape;
  }
};

class ShardPlan {
 public:
  ShardPlan(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
            const std::vector<std::shared_ptr<PreparedOptimizer>>& optimizers,
            const Writer& writer)
      : writer_(writer) {
    std::map<const void*, Slot> named;  // Each tensor's slot, whole.
    for (size_t m = 0; m < models.size(); ++m) {
      std::map<const void*, SplitParameter> splits;
      for (SplitParameter& split : TensorParallelSplits(*models[m])) {
        splits.emplace(Key(split.tensor), std::move(split));
      }
      std::vector<std::string> model_names;
      for (const StateEntry& entry : StateDict(*models[m])) {
        Slot slot{"model_" + std::to_string(m) + "/" + entry.name,
                  entry.tensor.sizes().vec(), 0, entry.tensor, true};
        const auto split = splits.find(Key(entry.tensor));
        if (split != splits.end()) {
          slot.split = split->second.split;
          slot.share = split->second.rank;
          splits_[slot.parameter] = slot.split;
        }
        named.emplace(Key(entry.tensor), slot);
        model_names.push_back(entry.name);
        entries_.push_back(slot);
      }
      model_names_.push_back(std::move(model_names));
    }
    std::map<const void*, bool> covered;
    for (size_t o = 0; o < optimizers.size(); ++o) {
      const PreparedOptimizer& prepared = *optimizers[o];
      Optimizer part{prepared.optimizer, "optimizer_" + std::to_string(o), {}};
      if (prepared.zero != nullptr) {
        zeros_.push_back(prepared.zero.get());
        // Every sharded parameter, also those of which this rank holds
        // nothing (under stage 3 they hold no values here).
        for (const torch::Tensor& p : prepared.zero->parameters()) {
          covered[Key(p)] = true;
        }
        for (const ZeroOptimizer::Piece& piece : prepared.zero->Pieces()) {
          Slot slot = SlotOf(named, piece.parameter);
          slot.shape = piece.parameter.sizes().vec();
          slot.begin = piece.begin;
          slot.values = piece.values;
          slot.whole = false;
          slot.saved = writer_.replica_writes &&
                       (slot.split.size > 1 || writer_.tp_rank == 0);
          pieces_.push_back(slot);
          part.slots.push_back(slot);
        }
      } else {
        for (const auto& group : prepared.optimizer->param_groups()) {
          for (const torch::Tensor& p : group.params()) {
            part.slots.push_back(SlotOf(named, p));
          }
        }
      }
      optimizers_.push_back(std::move(part));
    }
    for (const Slot& slot : entries_) {
      if (covered.count(Key(slot.values)) == 0) whole_.push_back(slot);
    }
  }

  const std::vector<std::vector<std::string>>& model_names() const {
    return model_names_;
  }

  std::map<std::string, std::string> Metadata() const {
    if (splits_.empty()) return {};
    return {{kTensorSplitsKey, EncodeTensorSplits(splits_)}};
  }

  std::vector<ShardPiece> Pieces() const {
    std::vector<ShardPiece> pieces;
    for (const Slot& slot : pieces_) {
      if (!slot.saved) continue;
      pieces.push_back({slot.Held(), slot.shape, slot.begin, slot.values});
    }
    for (const Slot& slot : whole_) {
      AddShare(slot, slot.Held(), slot.values, &pieces);
    }
    for (const Optimizer& part : optimizers_) {
      for (const Slot& slot : part.slots) AddState(part, slot, &pieces);
    }
    return pieces;
  }

  void Check(const ShardedStateReader& reader) const {
    const SharesReader shares(reader);
    std::map<std::string, bool> wanted;
    for (const Slot& slot : entries_) {
      wanted[slot.parameter] = true;
      CheckShape(shares, {"", slot.parameter, ""}, slot.WholeShape());
      CheckLayout(shares, slot);
    }
    for (const std::string& name : shares.Names()) {
      if (name.rfind("model_", 0) == 0 && wanted.count(name) == 0) {
        throw CheckpointError(
            std::string("the checkpoint's shards (") + kShardIndexName +
            ") hold " + name +
            ", which this program's models do not have: the model changed "
            "since the save");
      }
    }
    for (const Optimizer& part : optimizers_) {
      for (const Slot& slot : part.slots) {
        for (const std::string& suffix :
             shares.Suffixes(part.prefix + "/", slot.parameter)) {
          const StateName name{part.prefix + "/", slot.parameter, suffix};
          if (!shares.Shape(name).empty()) {
            CheckShape(shares, name, slot.WholeShape());
          }
        }
      }
    }
  }

  void Load(const ShardedStateReader& reader, CallSite site) const {
    const SharesReader shares(reader);
    torch::NoGradGuard no_grad;
    for (const Slot& slot : pieces_) {
      slot.values.copy_(ReadRange(shares, {"", slot.parameter, ""}, slot)
                            .view_as(slot.values));
    }
    for (const Slot& slot : whole_) {
      slot.values.copy_(ReadRange(shares, {"", slot.parameter, ""}, slot)
                            .view_as(slot.values));
    }
    for (const Optimizer& part : optimizers_) {
      for (const Slot& slot : part.slots) LoadState(shares, part, slot);
    }
    for (ZeroOptimizer* zero : zeros_) zero->ShareLoadedPieces(site);
  }

 private:
  struct Optimizer {
    torch::optim::Optimizer* optimizer;
    std::string prefix;  // "optimizer_0"
    std::vector<Slot> slots;
  };

  static Slot SlotOf(const std::map<const void*, Slot>& named,
                     const torch::Tensor& p) {
    const auto found = named.find(Key(p));
    if (found == named.end()) {
      throw UsageError(
          "save_state: an optimizer's parameter is in no prepared model; "
          "sharded checkpoints name each parameter by its model's state_dict");
    }
    return found->second;
  }

  // What the checkpoint holds beside a tensor it lacks (a layer renamed:
  // its old names), or "".
  static std::string Neighbours(const SharesReader& shares,
                                const std::string& name) {
    // The module holding the layer ("model_0/blocks.0." of
    // "model_0/blocks.0.fc1.weight"), or the model's top ("model_0/").
    const size_t last = name.rfind('.');
    const size_t layer = last == 0 || last == std::string::npos
                             ? std::string::npos
                             : name.rfind('.', last - 1);
    const std::string parent = name.substr(
        0, (layer != std::string::npos ? layer : name.find('/')) + 1);
    std::vector<std::string> beside;
    for (const std::string& held : shares.Names()) {
      if (held.rfind(parent, 0) == 0) beside.push_back(held);
    }
    if (parent.empty() || beside.empty()) return "";
    std::string text = " (the checkpoint holds beside it: ";
    for (size_t i = 0; i < beside.size() && i < 4; ++i) {
      text += (i > 0 ? ", " : "") + beside[i];
    }
    return text + (beside.size() > 4 ? ", ...)" : ")");
  }

  static void CheckShape(const SharesReader& shares, const StateName& name,
                         const std::vector<int64_t>& shape) {
    if (!shares.Contains(name)) {
      throw CheckpointError(std::string("the checkpoint's shards (") +
                            kShardIndexName + ") hold no " + name.Whole() +
                            ": the model changed since the save" +
                            Neighbours(shares, name.Whole()));
    }
    const std::vector<int64_t> held = shares.Shape(name);
    if (held != shape) {
      throw CheckpointError(std::string("the checkpoint's shards (") +
                            kShardIndexName + ") hold " + name.Whole() +
                            " of shape " + c10::str(c10::IntArrayRef(held)) +
                            ", but this program's is " +
                            c10::str(c10::IntArrayRef(shape)));
    }
  }

  // A parameter split here and in the checkpoint is cut along the same
  // dimension into the same blocks (the sizes may differ): otherwise the
  // plan changed since the save, or the checkpoint's table did, and joining
  // would mix rows.
  static void CheckLayout(const SharesReader& shares, const Slot& slot) {
    const TensorSplit* saved = shares.SplitOf(slot.parameter);
    if (saved == nullptr || slot.split.size == 1) return;
    if (saved->dim != slot.split.dim || saved->fused != slot.split.fused) {
      throw CheckpointError(
          std::string("the checkpoint's shards (") + kShardIndexName +
          ") hold " + slot.parameter + " split as " + saved->ToString() +
          ", but this program splits it as " + slot.split.ToString() +
          ": the tensor-parallel plan changed since the save");
    }
  }

  // This rank's even share of a tensor that ranks hold whole: every rank,
  // or for a tensor-parallel share, the ranks of its tp coordinate (the tp
  // dimension is the mesh's last: rank % tp_size).
  void AddShare(const Slot& slot, const std::string& name,
                const torch::Tensor& tensor,
                std::vector<ShardPiece>* pieces) const {
    const bool split = slot.split.size > 1;
    const int holder = split ? writer_.rank / writer_.tp_size : writer_.rank;
    const int holders = split ? writer_.world / writer_.tp_size : writer_.world;
    const auto [begin, end] = EvenShare(tensor.numel(), holder, holders);
    const torch::Tensor flat = tensor.detach().reshape({-1});
    pieces->push_back({name, tensor.sizes().vec(), begin,
                       flat.narrow(0, begin, end - begin)});
  }

  void AddState(const Optimizer& part, const Slot& slot,
                std::vector<ShardPiece>* pieces) const {
    if (!slot.saved) return;
    const auto found =
        part.optimizer->state().find(compat::StateKey(slot.values));
    if (found == part.optimizer->state().end()) return;
    const std::optional<ParamStateValues> values =
        ReadParamState(*found->second);
    if (!values) return;  // Sharded tensors are used only when known.
    const std::string prefix = part.prefix + "/" + slot.Held() + "/";
    for (const auto& [key, tensor] : values->tensors) {
      if (slot.whole) {
        AddShare(slot, prefix + key, tensor, pieces);
      } else {
        pieces->push_back(
            {prefix + key, slot.shape, slot.begin, tensor.reshape({-1})});
      }
    }
    // A count once (per share), with the parameter's first element.
    const bool first = slot.whole
                           ? writer_.rank < writer_.tp_size &&
                                 (slot.split.size > 1 || writer_.rank == 0)
                           : slot.begin == 0;
    if (first) {
      for (const auto& [key, count] : values->counts) {
        pieces->push_back(
            {prefix + key, {}, 0, torch::tensor({count}, torch::kInt64)});
      }
    }
  }

  // Elements of `name` for slot's range (of its share), on the slot's
  // device.
  static torch::Tensor ReadRange(const SharesReader& shares,
                                 const StateName& name, const Slot& slot) {
    torch::Tensor out =
        torch::empty({slot.values.numel()},
                     torch::TensorOptions().dtype(shares.Dtype(name)));
    shares.Read(name, slot.split, slot.share, slot.whole ? 0 : slot.begin, out);
    return out.to(slot.values.device());
  }

  void LoadState(const SharesReader& shares, const Optimizer& part,
                 const Slot& slot) const {
    auto& state = part.optimizer->state();
    std::vector<std::string> suffixes =
        shares.Suffixes(part.prefix + "/", slot.parameter);
    suffixes.erase(std::remove(suffixes.begin(), suffixes.end(), ""),
                   suffixes.end());
    if (suffixes.empty()) {
      state.erase(compat::StateKey(slot.values));
      return;
    }
    ParamStateValues values;
    for (const std::string& suffix : suffixes) {
      const StateName name{part.prefix + "/", slot.parameter, suffix};
      const std::string key = suffix.substr(1);
      if (shares.Shape(name).empty()) {
        values.counts[key] = shares.ReadWhole(name).item<int64_t>();
      } else {
        values.tensors[key] = ReadRange(shares, name, slot)
                                  .view_as(slot.values)
                                  .to(slot.values.dtype())
                                  .contiguous();
      }
    }
    state[compat::StateKey(slot.values)] =
        MakeParamState(*part.optimizer, values, slot.parameter);
  }

  Writer writer_;
  std::vector<std::vector<std::string>> model_names_;
  std::vector<Slot> entries_;  // Every model tensor, whole.
  std::map<std::string, TensorSplit> splits_;
  std::vector<Slot> pieces_;  // ZeRO's, this rank's.
  std::vector<Slot> whole_;
  std::vector<Optimizer> optimizers_;
  std::vector<ZeroOptimizer*> zeros_;
};

}  // namespace

std::optional<ShardedTensors> Accelerator::ShardedTensorsOfPrepared() {
  for (const auto& prepared : state_->prepared.optimizers()) {
    if (KnowsParamState(*prepared->optimizer)) continue;
    if (prepared->zero != nullptr && prepared->zero->mixed_precision()) {
      // The whole-weights format would save the parameters as computed
      // (bf16), not the master shards the optimizer steps.
      throw UsageError(
          "save_state / load_state: mixed-precision parameters keep their "
          "master copy in shards, which only accel's sharded format holds, "
          "and it needs to know the optimizer's state: this optimizer is "
          "not one of Adam, AdamW, SGD, Adagrad, RMSprop or "
          "AdamWScheduleFree (accel/optim/param_state_codec.h); set "
          "mixed_precision_policy.param_dtype to the parameters' dtype to "
          "train without master shards");
    }
    return std::nullopt;
  }
  Writer writer{process_index(), num_processes()};
  if (const DeviceMesh* mesh = state_->mesh.get()) {
    writer.replica_writes = mesh->coordinate("dp_replicate") == 0;
    writer.tp_rank = mesh->coordinate("tp");
    writer.tp_size = mesh->size("tp");
  }
  auto plan = std::make_shared<ShardPlan>(
      state_->prepared.models(), state_->prepared.optimizers(), writer);
  ShardedTensors tensors;
  tensors.pieces = [plan] { return plan->Pieces(); };
  tensors.check = [plan](const ShardedStateReader& reader) {
    plan->Check(reader);
  };
  tensors.load = [plan](const ShardedStateReader& reader) {
    plan->Load(reader, CallSite::Here());
  };
  tensors.model_names = plan->model_names();
  tensors.metadata = plan->Metadata();
  return tensors;
}

}  // namespace accel
