#include "accel/parallel/zero.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "accel/core/tensor_ops.h"
#include "accel/memory/released_memory.h"
#include "accel/parallel/zero_group.h"
#include "accel/parallel/zero_units.h"
#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

using zero_internal::Flatten;
using zero_internal::FreeStorage;
using zero_internal::Key;
using zero_internal::Shape;

}  // namespace

namespace {

// Stages 2-3 reduce a model's gradients in the optimizer's flat layout:
// the optimizer must hold exactly that model's trainable parameters.
void CheckShardsWholeModel(const std::vector<torch::Tensor>& sharded,
                           const std::vector<torch::Tensor>& model_parameters) {
  std::vector<const void*> mine;
  for (const auto& p : sharded) mine.push_back(Key(p));
  std::sort(mine.begin(), mine.end());
  size_t in_model = 0;
  // A tied weight registered under two names is one parameter.
  std::set<const void*> counted;
  for (size_t i = 0; i < model_parameters.size(); ++i) {
    const torch::Tensor& p = model_parameters[i];
    if (!p.requires_grad() || !counted.insert(Key(p)).second) continue;
    if (!std::binary_search(mine.begin(), mine.end(), Key(p))) {
      throw UsageError(
          "prepare: under ZeRO stages 2-3 the prepared optimizer must hold "
          "every trainable parameter of its model, but parameter " +
          std::to_string(i) + " (shape " + Shape(p) +
          ") is not in it; give the optimizer model->parameters() (frozen "
          "ones may stay out), or use stage 1");
    }
    ++in_model;
  }
  if (in_model != sharded.size()) {
    throw UsageError(
        "prepare: under ZeRO stages 2-3 one optimizer shards the parameters of "
        "one model, but this one holds " +
        std::to_string(sharded.size()) +
        " trainable parameters and its "
        "model " +
        std::to_string(in_model) + "; use one optimizer per model, or stage 1");
  }
}

void CheckPrecision(const ZeroPrecision& precision) {
  const auto check = [](const std::optional<c10::ScalarType>& dtype,
                        const char* what) {
    if (dtype && !c10::isFloatingType(*dtype)) {
      throw UsageError(std::string("prepare: mixed precision's ") + what +
                       " must be a floating-point dtype, found " +
                       c10::toString(*dtype));
    }
  };
  check(precision.param_dtype, "param_dtype");
  check(precision.reduce_dtype, "reduce_dtype");
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(
    Communicator& comm, int stage, torch::optim::Optimizer& optimizer,
    const std::vector<torch::Tensor>& model_parameters,
    const std::vector<std::vector<torch::Tensor>>& units,
    const ZeroPrecision& precision)
    : comm_(&comm), rank_(comm.rank()), stage_(stage), optimizer_(optimizer) {
  CheckPrecision(precision);
  if (stage < 1 || stage > 3) {
    throw UsageError("ZeRO stage " + std::to_string(stage) +
                     " is not one that shards training state (1, 2 or 3)");
  }
  if (stage == 3 && units.empty()) {
    throw UsageError(
        "prepare: ZeRO stage 3 shards parameters unit by unit, but the "
        "model has no units (children of a Sequential with trainable "
        "parameters); see accel/parallel/sharded_units.h");
  }
  std::map<const void*, int> unit_of;
  for (size_t u = 0; u < units.size() && stage == 3; ++u) {
    for (const torch::Tensor& p : units[u]) {
      const auto [at, added] = unit_of.emplace(Key(p), static_cast<int>(u));
      if (!added && at->second != static_cast<int>(u)) {
        throw UsageError(
            "prepare: under ZeRO stage 3 a parameter of shape " + Shape(p) +
            " is in units " + std::to_string(at->second) + " and " +
            std::to_string(u) +
            " (a weight tied between them); a unit gathers only its own "
            "parameters: mark a module holding both with accel::fully_shard, "
            "or keep the tied weight out of the units (as examples/gpt_model.h "
            "does with its embedding and head)");
      }
    }
  }
  if (!optimizer.state().empty()) {
    throw UsageError(
        "prepare: under ZeRO stage " + std::to_string(stage) +
        " the optimizer must be prepared before its first step, but it "
        "already holds state for " +
        std::to_string(optimizer.state().size()) +
        " parameter(s); build it over the model's parameters and prepare "
        "it at once");
  }
  // The trainable parameters, grouped by unit, dtype and device in the
  // order the optimizer holds them (the same on every rank).
  std::map<const void*, std::pair<size_t, size_t>> where;  // group, index
  std::vector<std::tuple<int, c10::ScalarType, c10::Device>> kinds;
  for (auto& param_group : optimizer.param_groups()) {
    for (const torch::Tensor& p : param_group.params()) {
      if (!p.requires_grad()) continue;
      if (where.count(Key(p)) != 0) {
        throw UsageError("prepare: the optimizer holds a parameter of shape " +
                         Shape(p) +
                         " twice; under ZeRO each must be in one "
                         "param group once");
      }
      ToDType(p.scalar_type());  // Rejects unsupported dtypes early.
      const auto unit = unit_of.find(Key(p));
      const int unit_index = unit == unit_of.end() ? -1 : unit->second;
      const auto kind =
          std::make_tuple(unit_index, p.scalar_type(), p.device());
      auto found = std::find(kinds.begin(), kinds.end(), kind);
      const size_t index = found - kinds.begin();
      if (found == kinds.end()) kinds.push_back(kind);
      if (groups_.size() <= index) {
        groups_.push_back(std::make_shared<ZeroGroup>());
        groups_.back()->unit = unit_index;
      }
      where[Key(p)] = {index, groups_[index]->params.size()};
      groups_[index]->params.push_back(p);
      parameters_.push_back(p);
    }
  }
  if (stage >= 2) CheckShardsWholeModel(parameters_, model_parameters);
  const int rank = comm.rank();
  for (auto& group : groups_) {
    std::vector<int64_t> numels;
    for (const auto& p : group->params) numels.push_back(p.numel());
    group->layout = ShardLayout(numels, comm.size());
    Flatten(*group);
    const c10::ScalarType compute =
        precision.param_dtype.value_or(group->flat.scalar_type());
    group->mixed = compute != group->flat.scalar_type();
    group->reduce_dtype = precision.reduce_dtype.value_or(compute);
    // The pieces are views of what this rank keeps: the flat buffer, or
    // under stage 3 or mixed precision its share (starting at element
    // `base` of the flat), in the master dtype.
    torch::Tensor kept = group->flat;
    int64_t base = 0;
    if (group->unit >= 0 || group->mixed) {
      base = rank * group->layout.shard_size();
      group->shard =
          group->flat.narrow(0, base, group->layout.shard_size()).clone();
      kept = group->shard;
    }
    if (group->mixed) Flatten(*group, compute);
    if (group->unit >= 0) {
      // Its storage may sit where a freed buffer's did: not its names.
      ForgetReleasedNames(group->flat.storage().unsafeGetStorageImpl());
      FreeStorage(group->flat);
      group->gathered = false;
    }
    group->pieces = group->layout.Pieces(rank);
    for (const auto& piece : group->pieces) {
      torch::Tensor view =
          kept.narrow(0,
                      group->layout.offset(piece.tensor) + piece.begin - base,
                      piece.length)
              .detach();
      view.requires_grad_(true);
      group->piece_params.push_back(view);
    }
    group->own_begin = group->layout.begin(rank);
    if (stage >= 2) {
      const int64_t own = group->layout.end(rank) - group->own_begin;
      group->shard_grad =
          torch::zeros({own + 1}, kept.options()).narrow(0, 0, own);
    }
  }
  // The optimizer now steps this rank's pieces in place of the parameters.
  for (auto& param_group : optimizer.param_groups()) {
    std::vector<torch::Tensor> stepped;
    for (const torch::Tensor& p : param_group.params()) {
      auto found = where.find(Key(p));
      if (found == where.end()) {
        stepped.push_back(p);  // Frozen: it has no gradient to step.
        continue;
      }
      const ZeroGroup& group = *groups_[found->second.first];
      for (size_t i = 0; i < group.pieces.size(); ++i) {
        if (group.pieces[i].tensor == found->second.second) {
          stepped.push_back(group.piece_params[i]);
        }
      }
    }
    param_group.params() = std::move(stepped);
  }
  if (stage == 3) {
    units_ = std::make_shared<UnitSchedule>(comm, groups_, units.size(),
                                            precision.cast_forward_inputs);
  }
}

ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::AttachGradients() {
  for (auto& group : groups_) {
    for (size_t i = 0; i < group->pieces.size(); ++i) {
      const ShardLayout::Piece& piece = group->pieces[i];
      torch::Tensor grad;
      if (stage_ >= 2) {
        grad = group->shard_grad.narrow(
            0,
            group->layout.offset(piece.tensor) + piece.begin - group->own_begin,
            piece.length);
      } else {
        const torch::Tensor& full = group->params[piece.tensor].grad();
        if (full.defined()) {
          grad = full.reshape({-1}).narrow(0, piece.begin, piece.length);
          // Mixed precision: the master dtype's copy the optimizer steps.
          if (group->mixed) grad = grad.to(group->shard.scalar_type());
        }
      }
      // detach(): a plain tensor to autograd, which zero_grad may detach.
      group->piece_params[i].mutable_grad() =
          grad.defined() ? grad.detach() : grad;
    }
  }
}

void ZeroOptimizer::AllGatherParameters(CallSite site, const char* api) {
  // A unit gathered now would hold its parameters from before the step.
  if (units_ != nullptr) units_->ReleaseAll();
  CollectiveOptions options;
  options.api = api;
  options.site = site;
  torch::NoGradGuard no_grad;
  for (auto& group : groups_) {
    if (group->unit >= 0) continue;
    const int64_t share = group->layout.shard_size();
    torch::Tensor own = group->flat.narrow(0, rank_ * share, share);
    if (group->mixed) own.copy_(group->shard);  // The stepped master, cast.
    Comm(api).allgather(own.data_ptr(), group->flat.data_ptr(),
                        static_cast<size_t>(share),
                        ToDType(group->flat.scalar_type()), options);
  }
}

void ZeroOptimizer::NameReleasedParameters(
    const std::map<const void*, std::string>& names) {
  for (const auto& group : groups_) {
    if (group->unit < 0 || !group->flat.device().is_cpu()) continue;
    const void* owner = group->flat.storage().unsafeGetStorageImpl();
    const size_t element = group->flat.element_size();
    const size_t owner_bytes = group->flat.numel() * element;
    for (const torch::Tensor& p : group->params) {
      const auto name = names.find(zero_internal::Key(p));
      if (name == names.end()) continue;
      NameReleasedBytes(owner, owner_bytes, p.storage_offset() * element,
                        p.numel() * element, name->second);
    }
  }
}

bool ZeroOptimizer::mixed_precision() const {
  for (const auto& group : groups_) {
    if (group->mixed) return true;
  }
  return false;
}

std::vector<ZeroOptimizer::Piece> ZeroOptimizer::Pieces() const {
  std::vector<Piece> pieces;
  for (const auto& group : groups_) {
    for (size_t i = 0; i < group->pieces.size(); ++i) {
      const ShardLayout::Piece& piece = group->pieces[i];
      pieces.push_back(
          {group->params[piece.tensor], piece.begin, group->piece_params[i]});
    }
  }
  return pieces;
}

std::shared_ptr<UnitRunner> ZeroOptimizer::unit_runner() const {
  return units_;
}

void ZeroOptimizer::GatherEveryUnit() {
  if (units_ == nullptr) return;
  for (size_t u = 0; u < units_->size(); ++u) {
    units_->GatherUnit(u, "save_state / load_state (ZeRO-3 all-gather)");
  }
}

void ZeroOptimizer::ReshardEveryUnit(bool adopt) {
  if (units_ == nullptr) return;
  if (adopt) {
    units_->AdoptAndReleaseAll();
  } else {
    units_->ReleaseAll();
  }
}

void ZeroOptimizer::ForEachGathered(
    const std::vector<torch::Tensor>& tensors,
    const std::function<void(size_t, const torch::Tensor&)>& visit,
    const char* api, CallSite site) {
  const std::string master_api =
      std::string(api) + " (ZeRO all-gather of the master)";
  const std::string unit_api = std::string(api) + " (ZeRO-3 all-gather)";
  std::map<const void*, std::pair<ZeroGroup*, size_t>> where;
  for (const auto& group : groups_) {
    for (size_t t = 0; t < group->params.size(); ++t) {
      where[Key(group->params[t])] = {group.get(), t};
    }
  }
  int current = -1;  // The unit gathered.
  const ZeroGroup* master_of = nullptr;
  torch::Tensor master;  // master_of's master values, whole.
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto found = where.find(Key(tensors[i]));
    ZeroGroup* group = found == where.end() ? nullptr : found->second.first;
    if (group != nullptr && group->mixed) {
      if (group != master_of) {
        master = torch::Tensor();  // One group's master whole at a time.
        master = zero_internal::GatherMaster(Comm(api), *group,
                                             master_api.c_str(), site);
        master_of = group;
      }
      const torch::Tensor& p = tensors[i];
      visit(i, master
                   .narrow(0, group->layout.offset(found->second.second),
                           p.numel())
                   .view(p.sizes()));
      continue;
    }
    const int unit = group == nullptr ? -1 : group->unit;
    if (units_ != nullptr && unit >= 0 && unit != current) {
      if (current >= 0) units_->ReleaseUnit(current);
      units_->GatherUnit(unit, unit_api.c_str(), site);
      current = unit;
    }
    visit(i, tensors[i]);
  }
  if (current >= 0) units_->ReleaseUnit(current);
}

void ZeroOptimizer::ReplicateAcross(Communicator& replicas,
                                    Communicator& data_parallel) {
  if (data_parallel.size() != comm_->size() * replicas.size()) {
    throw UsageError(
        "ZeRO: " + std::to_string(comm_->size()) + " shards replicated " +
        std::to_string(replicas.size()) + " times do not tile the " +
        std::to_string(data_parallel.size()) + " data-parallel ranks");
  }
  replicas_ = &replicas;
  data_parallel_ = &data_parallel;
  replica_index_ = replicas.rank();
}

Communicator& ZeroOptimizer::Comm(const char* api) const {
  if (comm_ == nullptr) zero_internal::RefuseAfterLeavingTheJob(api);
  return *comm_;
}

void ZeroOptimizer::LeaveJob() {
  comm_ = nullptr;
  replicas_ = nullptr;
  data_parallel_ = nullptr;
  if (units_ != nullptr) units_->LeaveJob();
}

void ZeroOptimizer::ReturnParameters() {
  if (units_ != nullptr) units_->ReleaseAll();
  torch::NoGradGuard no_grad;
  for (auto& group : groups_) {
    if (!group->shard.defined()) continue;  // Whole already (stages 1-2).
    group->flat = zero_internal::GatherMaster(
        Comm("free_memory"), *group,
        "free_memory (ZeRO all-gather of the parameters)");
    for (size_t t = 0; t < group->params.size(); ++t) {
      torch::Tensor& p = group->params[t];
      p.set_data(group->flat.narrow(0, group->layout.offset(t), p.numel())
                     .view(p.sizes()));
    }
    group->gathered = true;
    group->unit = -1;  // Nothing frees it again.
  }
}

void ZeroOptimizer::ZeroGrad() {
  optimizer_.zero_grad();
  torch::NoGradGuard no_grad;
  for (torch::Tensor& p : parameters_) {
    // In place: under stage 1 the gradients are views of DDP's buckets.
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  for (auto& group : groups_) {
    if (!group->shard_grad.defined()) continue;
    group->shard_grad.zero_();
    group->shard_grad_held = false;
  }
}

std::vector<torch::Tensor> ZeroOptimizer::GradientPieces(
    const std::vector<torch::Tensor>& of,
    std::vector<const void*>* covered) const {
  std::vector<const void*> wanted;
  for (const auto& p : of) wanted.push_back(Key(p));
  std::sort(wanted.begin(), wanted.end());
  std::vector<torch::Tensor> grads;
  for (const auto& group : groups_) {
    for (const auto& p : group->params) {
      if (std::binary_search(wanted.begin(), wanted.end(), Key(p))) {
        covered->push_back(Key(p));
      }
    }
    for (size_t i = 0; i < group->pieces.size(); ++i) {
      const torch::Tensor& p = group->params[group->pieces[i].tensor];
      const torch::Tensor& grad = group->piece_params[i].grad();
      if (grad.defined() &&
          std::binary_search(wanted.begin(), wanted.end(), Key(p))) {
        grads.push_back(grad);
      }
    }
  }
  return grads;
}

namespace {

// The gradients of `parameters`: this rank's pieces of those sharded here,
// and the whole (replicated) gradients of the others.
struct ShardedGradients {
  std::vector<torch::Tensor> pieces;
  std::vector<torch::Tensor> replicated;
};

ShardedGradients CollectGradients(
    const std::vector<ZeroOptimizer*>& sharded,
    const std::vector<torch::Tensor>& parameters) {
  ShardedGradients result;
  std::vector<const void*> covered;
  for (const ZeroOptimizer* zero : sharded) {
    for (auto& grad : zero->GradientPieces(parameters, &covered)) {
      result.pieces.push_back(grad);
    }
  }
  std::sort(covered.begin(), covered.end());
  for (const auto& p : parameters) {
    if (p.grad().defined() &&
        !std::binary_search(covered.begin(), covered.end(), Key(p))) {
      result.replicated.push_back(p.grad());
    }
  }
  return result;
}

}  // namespace

std::vector<torch::Tensor> GradientsToClip(
    const std::vector<ZeroOptimizer*>& sharded,
    const std::vector<torch::Tensor>& parameters) {
  ShardedGradients grads = CollectGradients(sharded, parameters);
  grads.pieces.insert(grads.pieces.end(), grads.replicated.begin(),
                      grads.replicated.end());
  return grads.pieces;
}

namespace {

// The sum of |g|^p (or the largest |g|, NaN winning) over gradients, in
// float64 and in chunks, so that it is the same (up to float64 rounding,
// far below float32's) however the gradients are cut into pieces: DDP's
// whole gradients and ZeRO's shards give the same clipping coefficient.
class NormAccumulator {
 public:
  explicit NormAccumulator(double norm_type)
      : norm_type_(norm_type),
        infinity_(norm_type == std::numeric_limits<double>::infinity()) {
    if (!infinity_ && !(norm_type > 0)) {
      throw UsageError(
          "clip_grad_norm_ takes a positive norm_type or infinity, found " +
          std::to_string(norm_type));
    }
  }

  void Add(const torch::Tensor& grad) {
    if (grad.numel() == 0) return;
    constexpr int64_t kChunk = int64_t{1} << 20;
    const torch::Tensor flat = grad.detach().reshape({-1});
    for (int64_t at = 0; at < flat.numel(); at += kChunk) {
      const torch::Tensor chunk =
          flat.narrow(0, at, std::min(kChunk, flat.numel() - at))
              .to(torch::kFloat64)
              .abs();
      if (infinity_) {
        const double largest = chunk.max().item<double>();
        value_ = std::isnan(largest) || std::isnan(value_)
                     ? std::numeric_limits<double>::quiet_NaN()
                     : std::max(value_, largest);
      } else {
        value_ += (norm_type_ == 2 ? chunk.square() : chunk.pow(norm_type_))
                      .sum()
                      .item<double>();
      }
    }
  }

  bool infinity() const { return infinity_; }
  double value() const { return value_; }
  double Norm(double value) const {
    return infinity_ || std::isnan(value) ? value
                                          : std::pow(value, 1.0 / norm_type_);
  }

 private:
  double norm_type_;
  bool infinity_;
  double value_ = 0;
};

// As torch's clip_grad_norm_: the coefficient in the gradients' dtype,
// clamped to 1, multiplied into every gradient.
void ScaleGradients(const std::vector<torch::Tensor>& grads, double total,
                    double max_norm) {
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& grad : grads) {
    const torch::Tensor norm = torch::full({}, total, grad.options());
    grad.mul_(torch::clamp(max_norm / (norm + 1e-6), c10::nullopt, 1.0));
  }
}

// `parameters` cut into those tensor parallelism splits and the others.
std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>>
SplitByTensorParallel(const std::vector<torch::Tensor>& parameters,
                      const TensorParallelNorm& tensor_parallel) {
  std::vector<const void*> split = tensor_parallel.split;
  std::sort(split.begin(), split.end());
  std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> parts;
  for (const torch::Tensor& p : parameters) {
    (std::binary_search(split.begin(), split.end(), Key(p)) ? parts.first
                                                            : parts.second)
        .push_back(p);
  }
  return parts;
}

// A NaN-safe reduction of `values` (sums or maxima of |g|, with NaN flags
// beside them) over `comm`.
void ReduceNormValues(Communicator& comm, std::vector<double>& values,
                      bool infinity, const char* api, CallSite site) {
  CollectiveOptions options;
  options.api = api;
  options.site = site;
  // With a NaN flag beside each value: a maximum over ranks may drop NaN.
  std::vector<double> flagged;
  for (double value : values) {
    flagged.push_back(std::isnan(value) ? 0.0 : value);
    flagged.push_back(std::isnan(value) ? 1.0 : 0.0);
  }
  AllreduceHostValues(comm, flagged.data(), flagged.size(), torch::kFloat64,
                      infinity ? ReduceOp::kMax : ReduceOp::kSum, options);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = flagged[2 * i + 1] > 0
                    ? std::numeric_limits<double>::quiet_NaN()
                    : flagged[2 * i];
  }
}

// The split parameters' part summed over the tensor-parallel group, and
// the other part once: the whole model's value.
double CombineTensorParallel(const NormAccumulator& norm, double split,
                             double other,
                             const TensorParallelNorm& tensor_parallel,
                             CallSite site) {
  if (tensor_parallel.group != nullptr && tensor_parallel.group->size() > 1) {
    std::vector<double> values = {split};
    ReduceNormValues(*tensor_parallel.group, values, norm.infinity(),
                     "clip_grad_norm_ (across tensor-parallel ranks)", site);
    split = values[0];
  }
  if (std::isnan(split) || std::isnan(other)) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  return norm.infinity() ? std::max(split, other) : split + other;
}

}  // namespace

double ClipGradNorm(const std::vector<torch::Tensor>& parameters,
                    double max_norm, double norm_type,
                    const TensorParallelNorm& tensor_parallel, CallSite site) {
  const auto [split, other] =
      SplitByTensorParallel(parameters, tensor_parallel);
  NormAccumulator split_norm(norm_type), other_norm(norm_type);
  std::vector<torch::Tensor> grads;
  for (const auto& [part, norm] :
       {std::pair<const std::vector<torch::Tensor>&, NormAccumulator&>{
            split, split_norm},
        {other, other_norm}}) {
    for (const torch::Tensor& p : part) {
      if (!p.grad().defined()) continue;
      grads.push_back(p.grad());
      norm.Add(p.grad());
    }
  }
  const double total = other_norm.Norm(
      CombineTensorParallel(other_norm, split_norm.value(), other_norm.value(),
                            tensor_parallel, site));
  ScaleGradients(grads, total, max_norm);
  return total;
}

double ClipGradNormAcrossShards(Communicator& comm,
                                const std::vector<ZeroOptimizer*>& sharded,
                                const std::vector<torch::Tensor>& parameters,
                                double max_norm, double norm_type,
                                CallSite site,
                                const TensorParallelNorm& tensor_parallel) {
  const auto [split, other] =
      SplitByTensorParallel(parameters, tensor_parallel);
  std::vector<double> values;
  std::vector<torch::Tensor> all;
  NormAccumulator norm(norm_type);
  for (const std::vector<torch::Tensor>* part : {&split, &other}) {
    NormAccumulator part_norm(norm_type);
    ShardedGradients grads = CollectGradients(sharded, *part);
    // This rank's part: its pieces, and the replicated gradients on rank 0
    // only.
    for (const auto& grad : grads.pieces) part_norm.Add(grad);
    if (comm.rank() == 0) {
      for (const auto& grad : grads.replicated) part_norm.Add(grad);
    }
    values.push_back(part_norm.value());
    all.insert(all.end(), grads.pieces.begin(), grads.pieces.end());
    all.insert(all.end(), grads.replicated.begin(), grads.replicated.end());
  }
  ReduceNormValues(comm, values, norm.infinity(),
                   "clip_grad_norm_ (across ZeRO shards)", site);
  const double total = norm.Norm(
      CombineTensorParallel(norm, values[0], values[1], tensor_parallel, site));
  ScaleGradients(all, total, max_norm);
  return total;
}

}  // namespace accel
