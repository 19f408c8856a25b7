// Deprecated: accel/sharded_units.h moved to accel/parallel/sharded_units.h in
// accel 0.1.1. This forwarding header keeps the old path working until accel
// 0.2.0, which removes it; include the new path (docs/development.md lists
// them).
#ifndef ACCEL_FORWARDING_SHARDED_UNITS_H_
#define ACCEL_FORWARDING_SHARDED_UNITS_H_

#pragma message( \
    "accel/sharded_units.h is deprecated: include \"accel/parallel/sharded_units.h\" (the old path goes in accel 0.2.0)")
#include "accel/parallel/sharded_units.h"

#endif  // ACCEL_FORWARDING_SHARDED_UNITS_H_
