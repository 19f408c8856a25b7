// A key-value store that the processes of one job use to find each other and
// to exchange small values out of band (addresses, ids, diagnostics).
//
//   accel::InMemoryStore store;                       // ranks as threads
//   store.set("addr/0", "10.0.0.1:4000");
//   std::string peer = store.get("addr/1", std::chrono::seconds(5));
//
// TcpStore (tcp_store.h) is the implementation across processes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace accel {

class Store : public std::enable_shared_from_this<Store> {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;

  // The value of `key`, or nullopt when it is not set. Never blocks on others.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;

  // Blocks until every key is set; TimeoutError names the missing keys.
  virtual void wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout) = 0;

  // Atomically adds `delta` to the integer at `key` (0 when unset).
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Ranks whose processes left the job, with how they left: "exited" (said
  // goodbye), "crashed" (the connection dropped without one) or
  // "unreachable" (its machine stopped answering on the network). Stores
  // that cannot observe processes return an empty map.
  virtual std::map<int, std::string> departures() { return {}; }

  // The same store, for callers that must not wait long on a host that
  // stopped answering (diagnostics): requests that do not wait for keys give
  // up with a TimeoutError after `timeout`. Stores whose requests cannot
  // block return themselves. The store must be owned by a shared_ptr.
  // Records in departures() how this rank is leaving ("exited with an
  // error", "failed: <message>") before its process ends, so that the
  // others' errors can say it. Stores that cannot observe processes ignore
  // it.
  virtual void leave(const std::string& how) {}

  virtual std::shared_ptr<Store> WithRequestTimeout(
      std::chrono::milliseconds timeout) {
    return shared_from_this();
  }

  // Waits for `key` and returns its value.
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
};

// Thread-safe store in one process, for ranks that run as threads.
class InMemoryStore : public Store {
 public:
  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> try_get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

// Puts every key of `base` under "prefix/", so that several users (several
// communicators, or restarts of one job) share one store without clashing.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> try_get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::map<int, std::string> departures() override;
  void leave(const std::string& how) override;
  std::shared_ptr<Store> WithRequestTimeout(
      std::chrono::milliseconds timeout) override;

 private:
  std::string Key(const std::string& key) const;
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

// "[a, b, c]", for error messages.
std::string JoinKeys(const std::vector<std::string>& keys);

}  // namespace accel
