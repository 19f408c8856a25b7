// Deprecated: accel/scheduler.h moved to accel/optim/scheduler.h in accel
// 0.1.1. This forwarding header keeps the old path working until accel 0.2.0,
// which removes it; include the new path (docs/development.md lists them).
#ifndef ACCEL_FORWARDING_SCHEDULER_H_
#define ACCEL_FORWARDING_SCHEDULER_H_

#pragma message( \
    "accel/scheduler.h is deprecated: include \"accel/optim/scheduler.h\" (the old path goes in accel 0.2.0)")
#include "accel/optim/scheduler.h"

#endif  // ACCEL_FORWARDING_SCHEDULER_H_
