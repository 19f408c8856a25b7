#include "tests/thread_ranks.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "accel/runtime/comm/registry.h"
#include "accel/runtime/store/store.h"

namespace accel::testing {

void RunRanks(const std::string& backend, int world_size,
              const std::function<void(Communicator&)>& body,
              const RankOptions& options) {
  // As accel programs do (process_setup.h): a rank that writes to the
  // connection of a peer that has left gets EPIPE, not the signal that
  // would end the whole test (Gloo's TCP pairs write without MSG_NOSIGNAL).
  std::signal(SIGPIPE, SIG_IGN);
  // A fresh namespace per call, so that tests never see each other's keys.
  static std::atomic<int> generation{0};
  auto store = std::make_shared<PrefixStore>(
      "run" + std::to_string(generation++), std::make_shared<InMemoryStore>());
  std::vector<std::string> failures(world_size);
  // Every rank's body starts once every communicator is built: a body that
  // fails at once must not tear down its connections while another rank is
  // still making its own.
  std::mutex mutex;
  std::condition_variable all_built;
  int built = 0;
  auto arrive = [&] {
    std::unique_lock<std::mutex> lock(mutex);
    if (++built == world_size) all_built.notify_all();
    all_built.wait(lock, [&] { return built == world_size; });
  };
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      std::unique_ptr<Communicator> comm;
      try {
        BackendContext context;
        context.rank = rank;
        context.size = world_size;
        context.store = store;
        context.options.timeout = options.timeout;
        context.connect_timeout = options.connect_timeout;
        context.options.check_collectives = options.check_collectives;
        comm = CreateCommunicator(backend, context);
      } catch (const std::exception& e) {
        failures[rank] = e.what();
      }
      arrive();
      if (comm == nullptr) return;
      try {
        body(*comm);
      } catch (const std::exception& e) {
        failures[rank] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int rank = 0; rank < world_size; ++rank) {
    EXPECT_EQ(failures[rank], "") << "rank " << rank << " of " << world_size;
  }
}

}  // namespace accel::testing
