// What one rank is doing, as every rank publishes it in the store for the
// others' diagnostics ("rank 1 is in gather #12 (train.cc:75)"), and the
// record's format.
//
//   RankStatus mine;
//   mine.sequence = 12; mine.running = true; mine.api = "gather"; ...
//   store.set(RankStatusKey(rank), EncodeRankStatus(mine));
//   RankStatus theirs = DecodeRankStatus(*store.try_get(RankStatusKey(1)));
//
// The record is versioned (kRankStatusVersion, its first field), as c10d's
// flight recorder dump: a minor change adds fields at the end, which older
// readers ignore; a change of meaning bumps the version, and a reader of
// another version treats the record as unpublished rather than misreading
// it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "accel/runtime/store/store.h"

namespace accel {

inline constexpr int kRankStatusVersion = 1;

struct RankStatus {
  bool known = false;  // It has called a collective.
  uint64_t sequence = 0;
  bool running = false;
  std::string api;
  std::string signature;
  std::string site;
  bool published = false;  // The rank has published a status.
  uint64_t beat = 0;       // Bumped at every publication.
  // Not in the record: what this rank learned of that one.
  std::optional<Departure> departed;  // How it left (Store::departures()).
  bool silent = false;  // Its status stopped changing (see heartbeats).
  std::chrono::steady_clock::duration silent_for{0};
};

// The store key rank `rank` publishes under.
std::string RankStatusKey(int rank);
std::string EncodeRankStatus(const RankStatus& status);
// A record of another version, or not a record, reads as unpublished.
RankStatus DecodeRankStatus(const std::string& text);

// "gather #12 (train.cc:75)".
std::string DescribeCall(const RankStatus& status);
// "rank 2 crashed (its process left the job)", "rank 3 is unreachable (its
// machine 10.0.0.2:4000 stopped answering on the network)".
std::string DescribeDeparture(int rank, const Departure& how);
// The same for `who` ("rank 4 (1 of group tp)").
std::string DescribeDeparture(const std::string& who, const Departure& how);

}  // namespace accel
