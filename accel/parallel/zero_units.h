// ZeRO stage 3's unit schedule: when each unit's flat buffers are gathered
// (with the next unit's prefetched) and freed again, around the model's
// forward and backward. Private to //accel:zero.
//
//   auto units = std::make_shared<UnitSchedule>(comm, groups, 4);
//   units->BeforeForward(0);   // gathers unit 0, starts unit 1's gather
//   units->AfterForward(0);    // frees unit 0
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "accel/core/tensor_ops.h"
#include "accel/parallel/sharded_units.h"
#include "accel/parallel/zero_group.h"

namespace accel {

// Stage 3: when each unit's parameters are gathered and freed (zero.h).
// Every rank runs the same units in the same order, so the all-gathers
// match; the mutex covers autograd's threads.
class UnitSchedule : public UnitRunner {
 public:
  // `cast_forward_inputs`: a unit's floating-point inputs go to the dtype
  // its mixed-precision parameters compute in.
  UnitSchedule(Communicator& comm,
               const std::vector<std::shared_ptr<ZeroGroup>>& groups,
               size_t units, bool cast_forward_inputs)
      : comm_(&comm),
        rank_(comm.rank()),
        units_(units),
        names_(units),
        input_dtypes_(units) {
    for (const auto& group : groups) {
      if (group->unit < 0) continue;
      units_[group->unit].push_back(group);
      if (cast_forward_inputs && group->mixed) {
        input_dtypes_[group->unit] = group->flat.scalar_type();
      }
    }
    // What diagnostics call each gather: these run inside the model's
    // forward and backward, where no line of the program is known, so the
    // unit is named instead ("(unknown)" before).
    const std::string of = " of " + std::to_string(units);
    for (size_t u = 0; u < units; ++u) {
      const std::string unit = "unit " + std::to_string(u) + of;
      names_[u] = {"forward (ZeRO-3 all-gather of " + unit + ")",
                   "forward (ZeRO-3 prefetch of " + unit + ")",
                   "backward (ZeRO-3 all-gather of " + unit + ")",
                   "backward (ZeRO-3 prefetch of " + unit + ")"};
    }
  }

  // A gather still in flight (a prefetched unit that never ran) writes into
  // memory its group owns: it ends before the groups go.
  ~UnitSchedule() override {
    for (auto& unit : units_) {
      for (auto& group : unit) {
        if (group->gathering == nullptr) continue;
        try {
          group->gathering->wait();
        } catch (...) {
          // The job is failing; the memory may go now.
        }
        group->gathering.reset();
      }
    }
  }

  void BeforeForward(size_t unit) override {
    std::lock_guard<std::mutex> lock(mutex_);
    Gather(unit, names_[unit][0].c_str());
    if (unit + 1 < units_.size()) Start(unit + 1, names_[unit + 1][1].c_str());
  }
  void AfterForward(size_t unit) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& group : units_[unit]) Release(*group);
  }
  std::optional<c10::ScalarType> InputDtype(size_t unit) const override {
    return input_dtypes_[unit];
  }
  void BeforeBackward(size_t unit) override {
    std::lock_guard<std::mutex> lock(mutex_);
    Gather(unit, names_[unit][2].c_str());
    if (unit > 0) Start(unit - 1, names_[unit - 1][3].c_str());
  }

  // Frees one group (its gradients are in) or all of them.
  void ReleaseGroup(ZeroGroup& group) {
    std::lock_guard<std::mutex> lock(mutex_);
    Release(group);
  }
  void ReleaseAll() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& unit : units_) {
      for (auto& group : unit) Release(*group);
    }
  }
  // `site`: the program's call that gathers it (none inside a forward).
  void GatherUnit(size_t unit, const char* api, CallSite site = {}) {
    std::lock_guard<std::mutex> lock(mutex_);
    Gather(unit, api, site);
  }
  void ReleaseUnit(size_t unit) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& group : units_[unit]) Release(*group);
  }
  // Each gathered group's share becomes what its flat buffer holds.
  void AdoptAndReleaseAll() {
    std::lock_guard<std::mutex> lock(mutex_);
    torch::NoGradGuard no_grad;
    for (auto& unit : units_) {
      for (auto& group : unit) {
        Finish(*group);
        if (!group->gathered) continue;
        const int64_t share = group->layout.shard_size();
        group->shard.copy_(group->flat.narrow(0, rank_ * share, share));
        Release(*group);
      }
    }
  }
  size_t size() const { return units_.size(); }
  // The process left the job (end_training): a later gather is a
  // UsageError, not a call into the group's freed communicator.
  void LeaveJob() {
    std::lock_guard<std::mutex> lock(mutex_);
    comm_ = nullptr;
  }

 private:
  void Start(size_t unit, const char* api, CallSite site = {}) {
    for (auto& group : units_[unit]) {
      if (group->gathered || group->gathering) continue;
      group->arriving = zero_internal::AllocateDetached(group->flat);
      CollectiveOptions options;
      options.api = api;
      // From inside the model's forward or backward no line of the
      // program's is known (not this one's either): the site is empty.
      options.site = site;
      group->gathering = Comm(api).allgather_async(
          zero_internal::SendBuffer(*group), group->arriving.get(),
          static_cast<size_t>(group->layout.shard_size()),
          ToDType(group->flat.scalar_type()), options);
    }
  }
  void Finish(ZeroGroup& group) {
    if (!group.gathering) return;
    std::shared_ptr<Work> work = std::move(group.gathering);
    group.gathering.reset();
    work->wait();
    group.sending = torch::Tensor();
    zero_internal::InstallStorage(group.flat, std::move(group.arriving));
    group.gathered = true;
  }
  void Gather(size_t unit, const char* api, CallSite site = {}) {
    Start(unit, api, site);
    for (auto& group : units_[unit]) Finish(*group);
  }
  void Release(ZeroGroup& group) {
    if (group.unit < 0) return;
    Finish(group);  // Its all-gather writes into memory that then goes.
    if (!group.gathered) return;
    zero_internal::FreeStorage(group.flat);
    group.gathered = false;
  }

  Communicator& Comm(const char* api) const {
    if (comm_ == nullptr) zero_internal::RefuseAfterLeavingTheJob(api);
    return *comm_;
  }

  Communicator* comm_;  // Null once the process left the job.
  int rank_;
  std::vector<std::vector<std::shared_ptr<ZeroGroup>>> units_;
  // Per unit: forward gather and prefetch, backward gather and prefetch.
  std::vector<std::array<std::string, 4>> names_;
  std::vector<std::optional<c10::ScalarType>> input_dtypes_;
  std::mutex mutex_;
};

}  // namespace accel
