// Deprecated: accel/schedule_free.h moved to accel/optim/schedule_free.h in
// accel 0.1.1. This forwarding header keeps the old path working until accel
// 0.2.0, which removes it; include the new path (docs/development.md lists
// them).
#ifndef ACCEL_FORWARDING_SCHEDULE_FREE_H_
#define ACCEL_FORWARDING_SCHEDULE_FREE_H_

#pragma message( \
    "accel/schedule_free.h is deprecated: include \"accel/optim/schedule_free.h\" (the old path goes in accel 0.2.0)")
#include "accel/optim/schedule_free.h"

#endif  // ACCEL_FORWARDING_SCHEDULE_FREE_H_
