// The cross-rank collective checks, behind the one check_collectives switch
// (CommunicatorOptions, --collective_checks): whether the ranks called the
// same collective, with the same dtype, count and root, at each sequence
// number. c10d's ProcessGroupWrapper runs such checks as extra collectives
// before every call; accel's ranks publish what they call
// (rank_status.h) and the watchdog compares, off the fast path, once a
// call has waited a while. The tensor layer's shape agreement (gather,
// reduce, broadcast of tensors) asks the same switch (enabled()).
//
//   CollectiveChecks checks(options.check_collectives);
//   if (checks.Differs(theirs, mine)) ... // "ranks called different ..."
#pragma once

#include "accel/runtime/comm/rank_status.h"

namespace accel {

class CollectiveChecks {
 public:
  explicit CollectiveChecks(bool enabled) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }

  // Whether `other` called another collective than `mine` at the same
  // sequence number. A finished call counts too: the other rank may have
  // failed since, and left (the mismatch is still the cause to report).
  // Always false when the checks are off.
  bool Differs(const RankStatus& other, const RankStatus& mine) const {
    return enabled_ && other.known && other.sequence == mine.sequence &&
           other.signature != mine.signature;
  }

 private:
  bool enabled_;
};

}  // namespace accel
