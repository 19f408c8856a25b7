// Deprecated: accel/invariant_reduction.h moved to
// accel/parallel/invariant_reduction.h in accel 0.1.1. This forwarding header
// keeps the old path working until accel 0.2.0, which removes it; include the
// new path (docs/development.md lists them).
#ifndef ACCEL_FORWARDING_INVARIANT_REDUCTION_H_
#define ACCEL_FORWARDING_INVARIANT_REDUCTION_H_

#pragma message( \
    "accel/invariant_reduction.h is deprecated: include \"accel/parallel/invariant_reduction.h\" (the old path goes in accel 0.2.0)")
#include "accel/parallel/invariant_reduction.h"

#endif  // ACCEL_FORWARDING_INVARIANT_REDUCTION_H_
