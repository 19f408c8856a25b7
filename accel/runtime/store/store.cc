#include "accel/runtime/store/store.h"

#include "accel/runtime/base/errors.h"

namespace accel {

std::string JoinKeys(const std::vector<std::string>& keys) {
  std::string joined = "[";
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i > 0) joined += ", ";
    joined += keys[i];
  }
  return joined + "]";
}

std::string Store::get(const std::string& key,
                       std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  std::optional<std::string> value = try_get(key);
  if (!value) throw Error("store: key '" + key + "' vanished after wait");
  return *value;
}

void InMemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = value;
  }
  changed_.notify_all();
}

std::optional<std::string> InMemoryStore::try_get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

void InMemoryStore::wait(const std::vector<std::string>& keys,
                         std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto all_present = [&] {
    for (const auto& key : keys) {
      if (values_.count(key) == 0) return false;
    }
    return true;
  };
  if (changed_.wait_for(lock, timeout, all_present)) return;
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (values_.count(key) == 0) missing.push_back(key);
  }
  throw TimeoutError("store: timed out after " +
                     std::to_string(timeout.count()) + " ms waiting for keys " +
                     JoinKeys(missing));
}

int64_t InMemoryStore::add(const std::string& key, int64_t delta) {
  int64_t result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = values_.find(key);
    const int64_t current = it == values_.end() ? 0 : std::stoll(it->second);
    result = current + delta;
    values_[key] = std::to_string(result);
  }
  changed_.notify_all();
  return result;
}

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {}

std::string PrefixStore::Key(const std::string& key) const {
  return prefix_ + "/" + key;
}

void PrefixStore::set(const std::string& key, const std::string& value) {
  base_->set(Key(key), value);
}

std::optional<std::string> PrefixStore::try_get(const std::string& key) {
  return base_->try_get(Key(key));
}

void PrefixStore::wait(const std::vector<std::string>& keys,
                       std::chrono::milliseconds timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const auto& key : keys) prefixed.push_back(Key(key));
  base_->wait(prefixed, timeout);
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return base_->add(Key(key), delta);
}

std::map<int, Departure> PrefixStore::departures() {
  return base_->departures();
}

void PrefixStore::leave(const Departure& how) { base_->leave(how); }

std::string Departure::ToString() const {
  switch (kind) {
    case Kind::kExited:
      return "exited";
    case Kind::kExitedWithError:
      return "exited with an error";
    case Kind::kFailed:
      return "failed: " + detail;
    case Kind::kCrashed:
      return "crashed";
    case Kind::kUnreachable:
      return "unreachable" + (detail.empty() ? "" : " at " + detail);
  }
  return "left";
}

Departure Departure::FromString(const std::string& text) {
  const std::string failed = "failed: ";
  const std::string unreachable = "unreachable";
  if (text == "exited") return {Kind::kExited, ""};
  if (text == "exited with an error") return {Kind::kExitedWithError, ""};
  if (text == "crashed") return {Kind::kCrashed, ""};
  if (text.rfind(failed, 0) == 0) {
    return {Kind::kFailed, text.substr(failed.size())};
  }
  if (text.rfind(unreachable, 0) == 0) {
    std::string where = text.substr(unreachable.size());
    if (where.rfind(" at ", 0) == 0) where = where.substr(4);
    return {Kind::kUnreachable, where};
  }
  return {Kind::kFailed, text};
}

std::shared_ptr<Store> PrefixStore::WithRequestTimeout(
    std::chrono::milliseconds timeout) {
  return std::make_shared<PrefixStore>(prefix_,
                                       base_->WithRequestTimeout(timeout));
}

}  // namespace accel
