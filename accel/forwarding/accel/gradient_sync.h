// Deprecated: accel/gradient_sync.h moved to accel/parallel/gradient_sync.h in
// accel 0.1.1. This forwarding header keeps the old path working until accel
// 0.2.0, which removes it; include the new path (docs/development.md lists
// them).
#ifndef ACCEL_FORWARDING_GRADIENT_SYNC_H_
#define ACCEL_FORWARDING_GRADIENT_SYNC_H_

#pragma message( \
    "accel/gradient_sync.h is deprecated: include \"accel/parallel/gradient_sync.h\" (the old path goes in accel 0.2.0)")
#include "accel/parallel/gradient_sync.h"

#endif  // ACCEL_FORWARDING_GRADIENT_SYNC_H_
