#include "accel/runtime/comm/rank_status.h"

#include <cstdlib>
#include <vector>

namespace accel {
namespace {

std::vector<std::string> SplitTabs(const std::string& text) {
  std::vector<std::string> fields;
  size_t start = 0;
  while (true) {
    const size_t tab = text.find('\t', start);
    fields.push_back(text.substr(start, tab - start));
    if (tab == std::string::npos) break;
    start = tab + 1;
  }
  return fields;
}

}  // namespace

std::string RankStatusKey(int rank) {
  return "accel_status/" + std::to_string(rank);
}

std::string EncodeRankStatus(const RankStatus& status) {
  return std::to_string(kRankStatusVersion) + "\t" +
         std::to_string(status.sequence) + "\t" + (status.running ? "1" : "0") +
         "\t" + status.api + "\t" + status.signature + "\t" + status.site +
         "\t" + std::to_string(status.beat);
}

RankStatus DecodeRankStatus(const std::string& text) {
  RankStatus status;
  const std::vector<std::string> fields = SplitTabs(text);
  // Version 1 has 7 fields; later minor additions come after them.
  if (fields.size() < 7 || fields[0] != std::to_string(kRankStatusVersion)) {
    return status;
  }
  status.published = true;
  status.sequence = std::strtoull(fields[1].c_str(), nullptr, 10);
  status.running = fields[2] == "1";
  status.api = fields[3];
  status.signature = fields[4];
  status.site = fields[5];
  status.beat = std::strtoull(fields[6].c_str(), nullptr, 10);
  // Heartbeats come before the first collective too.
  status.known = status.sequence > 0;
  return status;
}

std::string DescribeCall(const RankStatus& status) {
  // A call with no known line (ZeRO-3's gathers inside forward) is named by
  // its api alone.
  const bool known = !status.site.empty() && status.site != "unknown";
  return status.api + " #" + std::to_string(status.sequence) +
         (known ? " (" + status.site + ")" : "");
}

std::string DescribeDeparture(int rank, const Departure& how) {
  return DescribeDeparture("rank " + std::to_string(rank), how);
}

std::string DescribeDeparture(const std::string& who, const Departure& how) {
  if (how.kind == Departure::Kind::kUnreachable) {
    return who + " is unreachable (its machine" +
           (how.detail.empty() ? "" : " " + how.detail) +
           " stopped answering on the network)";
  }
  return who + " " + how.ToString() + " (its process left the job)";
}

}  // namespace accel
