// Deprecated: accel/state_archive.h moved to accel/core/state_archive.h in
// accel 0.1.1. This forwarding header keeps the old path working until accel
// 0.2.0, which removes it; include the new path (docs/development.md lists
// them).
#ifndef ACCEL_FORWARDING_STATE_ARCHIVE_H_
#define ACCEL_FORWARDING_STATE_ARCHIVE_H_

#pragma message( \
    "accel/state_archive.h is deprecated: include \"accel/core/state_archive.h\" (the old path goes in accel 0.2.0)")
#include "accel/core/state_archive.h"

#endif  // ACCEL_FORWARDING_STATE_ARCHIVE_H_
