// accel's Store on top of a c10d::TCPStore client, so that ranks started by
// torchrun in its default mode join the store its agent already serves on
// MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True) instead of failing to
// listen there. Programs that link //accel get it automatically: this file
// registers it as the runtime's AgentStoreConnector (process_group.h).
//
//   auto store = std::make_shared<accel::C10dStore>(
//       "127.0.0.1", 29500, /*rank=*/1, /*world_size=*/2, "accel/attempt_0/",
//       std::chrono::seconds(60));
//   store->set("k", "v");
//
// What differs from accel's own store (tcp_store.h), because c10d's cannot
// see processes or check who connects:
// - departures() knows only ranks that exited cleanly (each leaves a key
//   on its way out). A rank that crashes is not named by the others;
//   torchrun's agent notices it within its --monitor_interval (5 s) and
//   stops the job, naming the rank. A stopped or unreachable rank is still
//   reported by the watchdog's heartbeats when a collective times out.
// - There is no run secret: anyone who can reach MASTER_PORT can use the
//   agent's store, as with torch.distributed itself.
// Waits poll with short requests, so that no request holds c10d's
// one-at-a-time client lock for long: the watchdog's requests never queue
// behind a long wait.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "accel/runtime/store/store.h"

namespace c10d {
class TCPStore;
}

namespace accel {

class C10dStore : public Store {
 public:
  // Keys live under `prefix`; `timeout` bounds connecting.
  C10dStore(const std::string& host, int port, int rank, int world_size,
            std::string prefix, std::chrono::milliseconds timeout);
  ~C10dStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> try_get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::map<int, Departure> departures() override;

 private:
  std::string Key(const std::string& key) const { return prefix_ + key; }

  std::unique_ptr<c10d::TCPStore> store_;
  const int rank_;
  const int world_size_;
  const std::string prefix_;
  const std::string where_;
};

}  // namespace accel
