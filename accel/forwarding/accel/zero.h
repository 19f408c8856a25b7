// Deprecated: accel/zero.h moved to accel/parallel/zero.h in accel 0.1.1.
// This forwarding header keeps the old path working until accel 0.2.0, which
// removes it; include the new path (docs/development.md lists them).
#ifndef ACCEL_FORWARDING_ZERO_H_
#define ACCEL_FORWARDING_ZERO_H_

#pragma message( \
    "accel/zero.h is deprecated: include \"accel/parallel/zero.h\" (the old path goes in accel 0.2.0)")
#include "accel/parallel/zero.h"

#endif  // ACCEL_FORWARDING_ZERO_H_
