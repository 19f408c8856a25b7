// Deprecated: accel/lr_schedulers.h moved to accel/optim/lr_schedulers.h in
// accel 0.1.1. This forwarding header keeps the old path working until accel
// 0.2.0, which removes it; include the new path (docs/development.md lists
// them).
#ifndef ACCEL_FORWARDING_LR_SCHEDULERS_H_
#define ACCEL_FORWARDING_LR_SCHEDULERS_H_

#pragma message( \
    "accel/lr_schedulers.h is deprecated: include \"accel/optim/lr_schedulers.h\" (the old path goes in accel 0.2.0)")
#include "accel/optim/lr_schedulers.h"

#endif  // ACCEL_FORWARDING_LR_SCHEDULERS_H_
