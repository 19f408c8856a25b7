// The Accelerator's sharded checkpoints (accel/checkpoint/checkpoint.h,
// ShardedTensors): which pieces of every model's weights and every
// optimizer's state this rank saves, and what it reads back, whatever the
// process count and ZeRO stage that saved them. Under ZeRO a rank saves
// the pieces it steps; what every rank holds whole (buffers, frozen
// parameters, everything at stage 0) is cut evenly, each rank saving its
// share. A load reads into ZeRO's pieces only their ranges (stage 3's units
// are never gathered), and whole tensors whole.
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
#include "accel/core/libtorch_compat.h"
#include "accel/optim/param_state_codec.h"
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

// A part of a named tensor this rank holds: elements [begin, begin +
// values.numel()) of `name` (of `shape`), or all of it when `whole`.
struct Slot {
  std::string name;
  std::vector<int64_t> shape;
  int64_t begin = 0;
  torch::Tensor values;
  bool whole = false;
  // Whether this rank writes it: on a mesh, the ranks of replica 0 and tp
  // coordinate 0 write ZeRO's pieces; the others hold the same values.
  bool saved = true;
};

class ShardPlan {
 public:
  ShardPlan(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
            const std::vector<std::shared_ptr<PreparedOptimizer>>& optimizers,
            int rank, int world, bool writes_zero_pieces)
      : rank_(rank), world_(world) {
    std::map<const void*, std::string> names;
    for (size_t m = 0; m < models.size(); ++m) {
      std::vector<std::string> model_names;
      for (const StateEntry& entry : StateDict(*models[m])) {
        const std::string name =
            "model_" + std::to_string(m) + "/" + entry.name;
        names.emplace(Key(entry.tensor), name);
        model_names.push_back(entry.name);
        entries_.push_back({name, entry.tensor});
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
          Slot slot{NameOf(names, piece.parameter),
                    piece.parameter.sizes().vec(),
                    piece.begin,
                    piece.values,
                    false,
                    writes_zero_pieces};
          pieces_.push_back(slot);
          part.slots.push_back(slot);
        }
      } else {
        for (const auto& group : prepared.optimizer->param_groups()) {
          for (const torch::Tensor& p : group.params()) {
            part.slots.push_back(
                {NameOf(names, p), p.sizes().vec(), 0, p, true});
          }
        }
      }
      optimizers_.push_back(std::move(part));
    }
    for (const auto& [name, tensor] : entries_) {
      if (covered.count(Key(tensor)) == 0) whole_.push_back({name, tensor});
    }
  }

  const std::vector<std::vector<std::string>>& model_names() const {
    return model_names_;
  }

  std::vector<ShardPiece> Pieces() const {
    std::vector<ShardPiece> pieces;
    for (const Slot& slot : pieces_) {
      if (!slot.saved) continue;
      pieces.push_back({slot.name, slot.shape, slot.begin, slot.values});
    }
    for (const auto& [name, tensor] : whole_) {
      AddShare(name, tensor, &pieces);
    }
    for (const Optimizer& part : optimizers_) {
      for (const Slot& slot : part.slots) AddState(part, slot, &pieces);
    }
    return pieces;
  }

  void Check(const ShardedStateReader& reader) const {
    std::map<std::string, bool> wanted;
    for (const auto& [name, tensor] : entries_) {
      wanted[name] = true;
      CheckShape(reader, name, tensor.sizes().vec());
    }
    for (const std::string& name : reader.names()) {
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
        for (const std::string& name : StateNames(reader, part, slot)) {
          const auto& shape = reader.info(name).shape;
          if (!shape.empty()) CheckShape(reader, name, slot.shape);
        }
      }
    }
  }

  void Load(const ShardedStateReader& reader, CallSite site) const {
    torch::NoGradGuard no_grad;
    for (const Slot& slot : pieces_) ReadInto(reader, slot.name, slot);
    for (const auto& [name, tensor] : whole_) {
      tensor.copy_(reader.ReadWhole(name).to(tensor.device()));
    }
    for (const Optimizer& part : optimizers_) {
      for (const Slot& slot : part.slots) LoadState(reader, part, slot);
    }
    for (ZeroOptimizer* zero : zeros_) zero->ShareLoadedPieces(site);
  }

 private:
  struct Optimizer {
    torch::optim::Optimizer* optimizer;
    std::string prefix;  // "optimizer_0"
    std::vector<Slot> slots;
  };

  static std::string NameOf(const std::map<const void*, std::string>& names,
                            const torch::Tensor& p) {
    const auto found = names.find(Key(p));
    if (found == names.end()) {
      throw UsageError(
          "save_state: an optimizer's parameter is in no prepared model; "
          "sharded checkpoints name each parameter by its model's state_dict");
    }
    return found->second;
  }

  // What the checkpoint holds beside a tensor it lacks (a layer renamed:
  // its old names), or "".
  static std::string Neighbours(const ShardedStateReader& reader,
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
    for (const std::string& held : reader.names()) {
      if (held.rfind(parent, 0) == 0) beside.push_back(held);
    }
    if (parent.empty() || beside.empty()) return "";
    std::string text = " (the checkpoint holds beside it: ";
    for (size_t i = 0; i < beside.size() && i < 4; ++i) {
      text += (i > 0 ? ", " : "") + beside[i];
    }
    return text + (beside.size() > 4 ? ", ...)" : ")");
  }

  static void CheckShape(const ShardedStateReader& reader,
                         const std::string& name,
                         const std::vector<int64_t>& shape) {
    if (!reader.contains(name)) {
      throw CheckpointError(std::string("the checkpoint's shards (") +
                            kShardIndexName + ") hold no " + name +
                            ": the model changed since the save" +
                            Neighbours(reader, name));
    }
    if (reader.info(name).shape != shape) {
      throw CheckpointError(
          std::string("the checkpoint's shards (") + kShardIndexName +
          ") hold " + name + " of shape " +
          c10::str(c10::IntArrayRef(reader.info(name).shape)) +
          ", but this program's is " + c10::str(c10::IntArrayRef(shape)));
    }
  }

  // This rank's even share of a tensor every rank holds whole.
  void AddShare(const std::string& name, const torch::Tensor& tensor,
                std::vector<ShardPiece>* pieces) const {
    const auto [begin, end] = EvenShare(tensor.numel(), rank_, world_);
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
    const std::string prefix = part.prefix + "/" + slot.name + "/";
    for (const auto& [key, tensor] : values->tensors) {
      if (slot.whole) {
        AddShare(prefix + key, tensor, pieces);
      } else {
        pieces->push_back(
            {prefix + key, slot.shape, slot.begin, tensor.reshape({-1})});
      }
    }
    // A count once, with the parameter's first element.
    if ((slot.whole && rank_ == 0) || (!slot.whole && slot.begin == 0)) {
      for (const auto& [key, count] : values->counts) {
        pieces->push_back(
            {prefix + key, {}, 0, torch::tensor({count}, torch::kInt64)});
      }
    }
  }

  static std::vector<std::string> StateNames(const ShardedStateReader& reader,
                                             const Optimizer& part,
                                             const Slot& slot) {
    const std::string prefix = part.prefix + "/" + slot.name + "/";
    std::vector<std::string> names;
    for (const std::string& name : reader.names()) {
      if (name.compare(0, prefix.size(), prefix) == 0) names.push_back(name);
    }
    return names;
  }

  // Elements of `name` for slot's range, on the slot's device.
  static torch::Tensor ReadRange(const ShardedStateReader& reader,
                                 const std::string& name, const Slot& slot) {
    if (slot.whole) return reader.ReadWhole(name).to(slot.values.device());
    torch::Tensor out =
        torch::empty({slot.values.numel()},
                     torch::TensorOptions().dtype(reader.info(name).dtype));
    reader.Read(name, slot.begin, out);
    return out.to(slot.values.device());
  }

  static void ReadInto(const ShardedStateReader& reader,
                       const std::string& name, const Slot& slot) {
    slot.values.copy_(ReadRange(reader, name, slot).view_as(slot.values));
  }

  void LoadState(const ShardedStateReader& reader, const Optimizer& part,
                 const Slot& slot) const {
    auto& state = part.optimizer->state();
    const std::vector<std::string> names = StateNames(reader, part, slot);
    if (names.empty()) {
      state.erase(compat::StateKey(slot.values));
      return;
    }
    ParamStateValues values;
    const size_t cut = part.prefix.size() + slot.name.size() + 2;
    for (const std::string& name : names) {
      const std::string key = name.substr(cut);
      if (reader.info(name).shape.empty()) {
        values.counts[key] = reader.ReadWhole(name).item<int64_t>();
      } else {
        values.tensors[key] = ReadRange(reader, name, slot)
                                  .view_as(slot.values)
                                  .to(slot.values.dtype())
                                  .contiguous();
      }
    }
    state[compat::StateKey(slot.values)] =
        MakeParamState(*part.optimizer, values, slot.name);
  }

  int rank_;
  int world_;
  std::vector<std::vector<std::string>> model_names_;
  std::vector<std::pair<std::string, torch::Tensor>> entries_;
  std::vector<Slot> pieces_;  // ZeRO's, this rank's.
  std::vector<std::pair<std::string, torch::Tensor>> whole_;
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
  // ZeRO's pieces are the same on every replica and, the model having no
  // split layers (RefuseSplitLayers), on every tp rank: one copy writes.
  const DeviceMesh* mesh = state_->mesh.get();
  const bool writes_zero_pieces =
      mesh == nullptr ||
      (mesh->coordinate("dp_replicate") == 0 && mesh->coordinate("tp") == 0);
  auto plan = std::make_shared<ShardPlan>(
      state_->prepared.models(), state_->prepared.optimizers(), process_index(),
      num_processes(), writes_zero_pieces);
  ShardedTensors tensors;
  tensors.pieces = [plan] { return plan->Pieces(); };
  tensors.check = [plan](const ShardedStateReader& reader) {
    plan->Check(reader);
  };
  tensors.load = [plan](const ShardedStateReader& reader) {
    plan->Load(reader, CallSite::Here());
  };
  tensors.model_names = plan->model_names();
  return tensors;
}

}  // namespace accel
