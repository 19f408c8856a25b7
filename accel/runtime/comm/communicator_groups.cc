// Communicator::Split and NewGroup (communicator.h): process subgroups.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/communicator.h"

namespace accel {
namespace {

// A group's keys in the job's store, under a prefix of its own, with the
// store's departures (kept by rank in the parent) told by rank in the
// group, so that the group's watchdog sees its own ranks leave.
class GroupStore : public PrefixStore {
 public:
  // members[g]: the parent's rank of the group's rank g.
  GroupStore(std::string prefix, std::shared_ptr<Store> parent,
             std::vector<int> members)
      : PrefixStore(prefix, parent),
        prefix_(std::move(prefix)),
        parent_(std::move(parent)),
        members_(std::move(members)) {}

  std::map<int, Departure> departures() override {
    const std::map<int, Departure> all = parent_->departures();
    std::map<int, Departure> ours;
    for (size_t g = 0; g < members_.size(); ++g) {
      auto it = all.find(members_[g]);
      if (it != all.end()) ours.emplace(static_cast<int>(g), it->second);
    }
    return ours;
  }

  std::shared_ptr<Store> WithRequestTimeout(
      std::chrono::milliseconds timeout) override {
    return std::make_shared<GroupStore>(
        prefix_, parent_->WithRequestTimeout(timeout), members_);
  }

 private:
  const std::string prefix_;
  const std::shared_ptr<Store> parent_;
  const std::vector<int> members_;
};

// The ranks here with `color`, ordered by key, then rank, as MPI_Comm_split
// orders them.
std::vector<int> Members(const std::vector<int64_t>& colors_and_keys,
                         int64_t color) {
  std::vector<int> members;
  const int size = static_cast<int>(colors_and_keys.size() / 2);
  for (int r = 0; r < size; ++r) {
    if (colors_and_keys[2 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return colors_and_keys[2 * a + 1] < colors_and_keys[2 * b + 1];
  });
  return members;
}

}  // namespace

int Communicator::job_rank(int rank) const {
  if (rank < 0 || rank >= size_) {
    FailUsage("job_rank", "rank " + std::to_string(rank) +
                              " is not in this communicator of " +
                              std::to_string(size_) + " ranks");
  }
  return context_.job_ranks.empty() ? rank : context_.job_ranks[rank];
}

std::unique_ptr<Communicator> Communicator::Split(
    int color, int key, const std::string& name,
    const CollectiveOptions& options) {
  if (name.empty()) FailUsage("split", "the group needs a name");
  if (factory_ == nullptr) {
    FailUsage("split",
              "this communicator was made without its backend's factory "
              "(make it with CreateCommunicator or ProcessGroup::Join)");
  }
  const int split = ++splits_;
  CollectiveOptions call = options;
  if (call.api == nullptr) call.api = "split";
  std::unique_ptr<Transport> transport;
  BackendContext group = context_;
  bool member = false;
  // One operation in this communicator's order: the ranks learn each
  // other's color and key, then make the group's transport (MPI's split is
  // a collective on this communicator too). Its signature leaves the name
  // out: each group may have its own.
  Finish(Start(
      "split", call, "split", Task([&](const Op& op) {
        std::vector<int64_t> mine = {color < 0 ? -1 : color, key};
        std::vector<int64_t> all(2 * static_cast<size_t>(size_));
        transport_->RunAllgather(op, mine.data(), all.data(), 2, DType::kInt64);
        member = color >= 0;
        if (member) {
          const std::vector<int> members = Members(all, color);
          group.rank = static_cast<int>(
              std::find(members.begin(), members.end(), rank_) -
              members.begin());
          group.size = static_cast<int>(members.size());
          group.group =
              context_.group.empty() ? name : context_.group + "/" + name;
          group.job_ranks.clear();
          for (int r : members) group.job_ranks.push_back(job_rank(r));
          if (context_.store != nullptr) {
            group.store = std::make_shared<GroupStore>(
                "group/" + std::to_string(split) + "/" + std::to_string(color) +
                    "/",
                context_.store, members);
          }
        }
        transport = transport_->MakeGroup(op, member ? &group : nullptr, color,
                                          key, factory_);
      }),
      Mode::kBlocking));
  if (!member) return nullptr;
  if (transport == nullptr) {
    throw Error(Where() + "split: the " + backend_name() +
                " backend made no transport for group " + group.group);
  }
  return std::make_unique<Communicator>(std::move(transport), group, factory_);
}

std::unique_ptr<Communicator> Communicator::NewGroup(
    const std::vector<int>& ranks, const std::string& name,
    const CollectiveOptions& options) {
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= size_) {
      FailUsage("new_group", "rank " + std::to_string(r) +
                                 " is not in this communicator of " +
                                 std::to_string(size_) + " ranks");
    }
    if (!seen.insert(r).second) {
      FailUsage("new_group", "rank " + std::to_string(r) +
                                 " is listed twice in group '" + name + "'");
    }
  }
  const auto at = std::find(ranks.begin(), ranks.end(), rank_);
  const bool member = at != ranks.end();
  return Split(member ? 0 : -1,
               member ? static_cast<int>(at - ranks.begin()) : 0, name,
               options);
}

}  // namespace accel
