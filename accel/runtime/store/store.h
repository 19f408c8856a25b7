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

// How a rank's process left the job, as a store observed or was told.
struct Departure {
  enum class Kind {
    kExited,           // Said goodbye: its program ended.
    kExitedWithError,  // An exception ended its program.
    kFailed,           // std::terminate ended it; `detail` is the message.
    kCrashed,          // Its connection dropped without a goodbye.
    kUnreachable,      // Its machine stopped answering; `detail`: where.
  };
  Kind kind = Kind::kExited;
  std::string detail;

  // "exited", "exited with an error", "failed: <message>", "crashed",
  // "unreachable at 10.0.0.2:4000": what follows "rank 1 " in a message.
  std::string ToString() const;
  // Reads ToString()'s text back (the TCP store sends it); unknown text is
  // kFailed with the text as detail.
  static Departure FromString(const std::string& text);
  // Whether the rank left because something went wrong (anything but a
  // plain exit): the rank to blame when several left.
  bool failure() const { return kind != Kind::kExited; }
  bool operator==(const Departure& other) const {
    return kind == other.kind && detail == other.detail;
  }
};

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

  // Ranks whose processes left the job, with how they left. Stores that
  // cannot observe processes return an empty map.
  virtual std::map<int, Departure> departures() { return {}; }

  // The same store, for callers that must not wait long on a host that
  // stopped answering (diagnostics): requests that do not wait for keys give
  // up with a TimeoutError after `timeout`. Stores whose requests cannot
  // block return themselves. The store must be owned by a shared_ptr.
  // Records in departures() how this rank is leaving (kExitedWithError,
  // kFailed) before its process ends, so that the others' errors can say
  // it. Stores that cannot observe processes ignore it.
  virtual void leave(const Departure& /*how*/) {}

  virtual std::shared_ptr<Store> WithRequestTimeout(
      std::chrono::milliseconds /*timeout*/) {
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
  std::map<int, Departure> departures() override;
  void leave(const Departure& how) override;
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
