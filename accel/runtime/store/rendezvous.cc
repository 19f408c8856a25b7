#include "accel/runtime/store/rendezvous.h"

#include <algorithm>
#include <map>
#include <set>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/logging.h"
#include "accel/runtime/store/tcp_store.h"

namespace accel {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How often rank 0 looks at the processes its server turned away.
constexpr auto kRejectionCheck = milliseconds(200);
// How long past the deadline a meeting that every rank has announced itself
// to may take to complete (three requests of the last rank).
constexpr auto kLastCount = milliseconds(2000);

// This attempt's keys: a restarted job meets again under new ones.
std::string JoinPrefix(const DistributedEnvironment& env) {
  return "accel_join/" + std::to_string(env.restart_count) + "/";
}
// Holds the address a rank announced (for the diagnostics).
std::string JoinKey(const DistributedEnvironment& env, int rank) {
  return JoinPrefix(env) + std::to_string(rank);
}

// "ranks 2, 3" or "rank 2".
std::string RankList(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += ", ";
    if (i == 8 && ranks.size() > 10) {
      return text + "... (" + std::to_string(ranks.size()) + " in all)";
    }
    text += std::to_string(ranks[i]);
  }
  return text;
}

// "ranks 2, 3 (machine 1) and 6 (machine 3)", assuming every machine runs
// this machine's number of ranks, as launchers do.
std::string DescribeMissing(const std::vector<int>& missing,
                            const DistributedEnvironment& env) {
  std::set<int> machines;
  for (int rank : missing) machines.insert(rank / env.local_world_size);
  std::string text = RankList(missing);
  if (env.local_world_size < env.world_size) {
    text += machines.size() == 1 ? " (machine " : " (machines ";
    bool first = true;
    for (int machine : machines) {
      text += (first ? "" : ", ") + std::to_string(machine);
      first = false;
    }
    text +=
        ", at " + std::to_string(env.local_world_size) + " ranks per machine)";
  }
  return text;
}

// What rank 0's server refused, by the rank each process claimed.
struct Refusals {
  std::set<std::string> reported;  // Each said once.
  std::map<int, std::string> by_rank;
};

std::string AdviceFor(const std::string& reason) {
  if (reason == "another run secret") {
    return ": export the same ACCEL_RUN_SECRET on every machine";
  }
  if (reason.rfind("another job", 0) == 0) {
    return ": is another job using this port? Give each job its own "
           "--main_process_port (or ACCEL_JOB_ID)";
  }
  return "";
}

// Rank 0 reports each process its server refused that claimed a rank not
// yet joined (a misconfigured rank, or a stranger), once, and goes on
// waiting for the real one: a stranger's one packet must not end the job
// (it did, in 1 of 6 tries). The timeout names the refusals of the ranks
// that never came. A server that could not accept at all (file
// descriptors) fails at once.
void CheckRejections(TcpStoreServer& server, Store& store,
                     const DistributedEnvironment& env, Refusals* refusals) {
  for (const RejectedClient& client : server.rejected()) {
    if (client.address.empty()) {
      // Not a client: the server could not accept (file descriptors).
      throw UsageError(client.reason + ", with " +
                       std::to_string(env.world_size) +
                       " ranks to join; raise the limit (ulimit -n) or run "
                       "fewer processes");
    }
    if (client.rank < 0 || client.rank >= env.world_size ||
        store.try_get(JoinKey(env, client.rank))) {
      continue;  // A stranger, or a second claim to a rank that is here.
    }
    const std::string refusal = "a process from " + client.address +
                                " claiming rank " +
                                std::to_string(client.rank) + " was refused (" +
                                client.reason + ")" + AdviceFor(client.reason);
    refusals->by_rank[client.rank] = refusal;
    if (refusals->reported.insert(refusal).second) {
      ACCEL_LOG(WARNING) << "rendezvous: " << refusal
                         << "; still waiting for rank " << client.rank;
    }
  }
}

// The ranks that have not claimed their place: one request per rank, made only
// when the meeting failed.
std::vector<int> MissingRanks(Store& store, const DistributedEnvironment& env) {
  std::vector<int> missing;
  for (int r = 0; r < env.world_size; ++r) {
    if (!store.try_get(JoinKey(env, r) + "/claimed")) missing.push_back(r);
  }
  return missing;
}

}  // namespace

void MeetAtStore(Store& store, const DistributedEnvironment& env,
                 const std::string& my_address, Clock::time_point deadline,
                 TcpStoreServer* hosted) {
  const auto started = Clock::now();
  // The count and the key that opens the meeting are per world size, so
  // that processes started with different sizes (a misconfigured launch
  // sharing the job id) never complete each other's meeting: each side
  // times out naming the ranks it misses.
  const std::string prefix =
      JoinPrefix(env) + "of_" + std::to_string(env.world_size) + "/";
  // Each rank makes three requests and waits on one key, so the meeting
  // costs the store O(N) (waiting on every rank's key cost O(N) per rank:
  // at 4,096 ranks, 16M keys checked and 300 MB of requests). A rank counts
  // once however often a process claims it (the "claimed" add), and the rank
  // whose arrival completes the count opens the meeting for all.
  store.set(JoinKey(env, env.rank), my_address);
  if (store.add(JoinKey(env, env.rank) + "/claimed", 1) == 1 &&
      store.add(prefix + "arrived", 1) == env.world_size) {
    store.set(prefix + "all", "");
  }
  const std::vector<std::string> all = {prefix + "all"};
  Refusals refusals;
  while (true) {
    const auto now = Clock::now();
    auto slice = std::chrono::duration_cast<milliseconds>(deadline - now);
    if (hosted != nullptr)
      slice = std::min(slice, milliseconds(kRejectionCheck));
    if (slice.count() < 1) slice = milliseconds(1);
    try {
      store.wait(all, slice);
      return;
    } catch (const TimeoutError&) {
      if (hosted != nullptr) CheckRejections(*hosted, store, env, &refusals);
      if (Clock::now() < deadline) continue;
      const std::vector<int> missing = MissingRanks(store, env);
      const auto waited =
          std::chrono::duration_cast<milliseconds>(Clock::now() - started);
      if (missing.empty()) {
        // Every rank announced itself; the last may be counting now.
        try {
          store.wait(all, kLastCount);
          return;
        } catch (const TimeoutError&) {
          throw TimeoutError(
              "every rank announced itself but the meeting did not complete "
              "within " +
              std::to_string(waited.count()) +
              " ms (--rendezvous_timeout_s): a rank stopped between its "
              "announcement and its count");
        }
      }
      std::string refused;
      for (int rank : missing) {
        const auto found = refusals.by_rank.find(rank);
        if (found != refusals.by_rank.end()) refused += "; " + found->second;
      }
      throw TimeoutError(
          DescribeMissing(missing, env) + " did not join within " +
          std::to_string(waited.count()) + " ms (--rendezvous_timeout_s): " +
          (missing.size() == 1 ? "it was" : "they were") +
          " not started, failed before joining, or cannot reach rank 0's "
          "store at " +
          env.master_addr + ":" + std::to_string(env.master_port) + refused);
    }
  }
}

}  // namespace accel
