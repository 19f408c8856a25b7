// Deprecated: accel/checkpoint.h moved to accel/checkpoint/checkpoint.h in
// accel 0.1.1. This forwarding header keeps the old path working until accel
// 0.2.0, which removes it; include the new path (docs/development.md lists
// them).
#ifndef ACCEL_FORWARDING_CHECKPOINT_H_
#define ACCEL_FORWARDING_CHECKPOINT_H_

#pragma message( \
    "accel/checkpoint.h is deprecated: include \"accel/checkpoint/checkpoint.h\" (the old path goes in accel 0.2.0)")
#include "accel/checkpoint/checkpoint.h"

#endif  // ACCEL_FORWARDING_CHECKPOINT_H_
