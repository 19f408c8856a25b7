#include "accel/c10d_store.h"

#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "accel/core/libtorch_compat.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/process_group.h"

namespace accel {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const char* const kDepartedCount = "accel_departed_count";

std::string DepartedKey(int rank) {
  return "accel_departed/" + std::to_string(rank);
}

// Runs a c10d call, turning its exceptions into accel's.
template <typename Fn>
auto Translate(const std::string& where, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw PeerError("the c10d store of torchrun's agent at " + where +
                    " failed: " + e.what());
  }
}

// torchrun in its default mode: join the agent's store.
const bool kRegistered = [] {
  SetAgentStoreConnector([](const DistributedEnvironment& env,
                            milliseconds timeout) {
    return std::make_shared<C10dStore>(
        env.master_addr, env.master_port, env.rank, env.world_size,
        "accel/attempt_" + std::to_string(env.restart_count) + "/", timeout);
  });
  return true;
}();

}  // namespace

C10dStore::C10dStore(const std::string& host, int port, int rank,
                     int world_size, std::string prefix, milliseconds timeout)
    : rank_(rank),
      world_size_(world_size),
      prefix_(std::move(prefix)),
      where_(host + ":" + std::to_string(port)) {
  (void)kRegistered;
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = timeout;
  compat::UseTcpStoreWithoutLibuv(options);
  try {
    store_ = std::make_unique<c10d::TCPStore>(host, options);
  } catch (const std::exception& e) {
    throw TimeoutError("could not join the c10d store of torchrun's agent at " +
                       where_ + " within " + std::to_string(timeout.count()) +
                       " ms: " + e.what());
  }
}

C10dStore::~C10dStore() {
  // The only departure the others can learn of: this rank leaving cleanly.
  try {
    store_->set(Key(DepartedKey(rank_)), {'e', 'x', 'i', 't', 'e', 'd'});
    store_->add(Key(kDepartedCount), 1);
  } catch (const std::exception&) {
    // The agent may be gone already.
  }
}

void C10dStore::set(const std::string& key, const std::string& value) {
  Translate(where_, [&] {
    store_->set(Key(key), std::vector<uint8_t>(value.begin(), value.end()));
  });
}

std::optional<std::string> C10dStore::try_get(const std::string& key) {
  return Translate(where_, [&]() -> std::optional<std::string> {
    if (!store_->check({Key(key)})) return std::nullopt;
    const std::vector<uint8_t> value = store_->get(Key(key));
    return std::string(value.begin(), value.end());
  });
}

void C10dStore::wait(const std::vector<std::string>& keys,
                     milliseconds timeout) {
  std::vector<std::string> prefixed;
  for (const auto& key : keys) prefixed.push_back(Key(key));
  const auto deadline = Clock::now() + timeout;
  auto pause = milliseconds(1);
  while (!Translate(where_, [&] { return store_->check(prefixed); })) {
    if (Clock::now() >= deadline) {
      std::vector<std::string> missing;
      for (const auto& key : keys) {
        if (!Translate(where_, [&] { return store_->check({Key(key)}); })) {
          missing.push_back(key);
        }
      }
      throw TimeoutError("store: timed out after " +
                         std::to_string(timeout.count()) +
                         " ms waiting for keys " + JoinKeys(missing));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, milliseconds(50));
  }
}

int64_t C10dStore::add(const std::string& key, int64_t delta) {
  return Translate(where_, [&] { return store_->add(Key(key), delta); });
}

std::map<int, Departure> C10dStore::departures() {
  std::map<int, Departure> departed;
  if (add(kDepartedCount, 0) == 0) return departed;
  for (int r = 0; r < world_size_; ++r) {
    if (auto how = try_get(DepartedKey(r))) {
      departed[r] = Departure::FromString(*how);
    }
  }
  return departed;
}

}  // namespace accel
