#include "backends/shm/host_layout.h"

#include <unistd.h>

#include <fstream>
#include <map>

namespace accel {
namespace {

std::string FirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string LinkTarget(const char* path) {
  char target[256];
  const ssize_t n = readlink(path, target, sizeof(target) - 1);
  return n > 0 ? std::string(target, static_cast<size_t>(n)) : "";
}

}  // namespace

HostLayout HostLayout::FromKeys(const std::vector<std::string>& keys) {
  HostLayout layout;
  std::map<std::string, int> host_by_key;
  for (size_t rank = 0; rank < keys.size(); ++rank) {
    auto [it, added] =
        host_by_key.emplace(keys[rank], static_cast<int>(layout.hosts.size()));
    if (added) layout.hosts.emplace_back();
    layout.host_of.push_back(it->second);
    layout.local_rank.push_back(
        static_cast<int>(layout.hosts[it->second].size()));
    layout.hosts[it->second].push_back(static_cast<int>(rank));
  }
  return layout;
}

HostLayout HostLayout::Exchange(Store& store, int rank, int size,
                                const std::string& key,
                                std::chrono::milliseconds timeout) {
  store.set("host/" + std::to_string(rank), key);
  std::vector<std::string> names;
  for (int r = 0; r < size; ++r) names.push_back("host/" + std::to_string(r));
  store.wait(names, timeout);
  std::vector<std::string> keys;
  for (const auto& name : names) keys.push_back(store.get(name, timeout));
  return FromKeys(keys);
}

std::string HostLayout::ThisHostKey() {
  std::string boot = FirstLine("/proc/sys/kernel/random/boot_id");
  if (boot.empty()) {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    boot = name;
  }
  return boot + "|" + LinkTarget("/proc/self/ns/net") + "|uid " +
         std::to_string(getuid());
}

}  // namespace accel
