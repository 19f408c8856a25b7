// Which ranks of a job share a host, that is, can share memory.
//
//   accel::HostLayout layout = accel::HostLayout::Exchange(
//       store, rank, size, accel::HostLayout::ThisHostKey(), timeout);
//   // Ranks 0, 2 on one host and 1, 3 on another:
//   layout.hosts          // {{0, 2}, {1, 3}}
//   layout.host_of[3]     // 1
//   layout.local_rank[2]  // 1
//
// Hosts are numbered by their lowest rank, and each host's ranks ascend, so
// every rank computes the same layout.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "accel/runtime/store/store.h"

namespace accel {

struct HostLayout {
  std::vector<std::vector<int>> hosts;  // The ranks on each host.
  std::vector<int> host_of;             // Per rank: its host's index.
  std::vector<int> local_rank;          // Per rank: its index on its host.

  // Publishes `key` as this rank's and groups the ranks by key.
  static HostLayout Exchange(Store& store, int rank, int size,
                             const std::string& key,
                             std::chrono::milliseconds timeout);

  // Ranks as given: keys[r] is rank r's key.
  static HostLayout FromKeys(const std::vector<std::string>& keys);

  // Processes with equal keys can share memory the way SharedSegment does:
  // the same running kernel (boot id), network namespace (its socket is in
  // the abstract namespace) and user (it hands memory to the same user
  // only).
  static std::string ThisHostKey();
};

}  // namespace accel
