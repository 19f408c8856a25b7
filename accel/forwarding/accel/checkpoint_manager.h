// Deprecated: accel/checkpoint_manager.h moved to
// accel/checkpoint/checkpoint_manager.h in accel 0.1.1. This forwarding header
// keeps the old path working until accel 0.2.0, which removes it; include the
// new path (docs/development.md lists them).
#ifndef ACCEL_FORWARDING_CHECKPOINT_MANAGER_H_
#define ACCEL_FORWARDING_CHECKPOINT_MANAGER_H_

#pragma message( \
    "accel/checkpoint_manager.h is deprecated: include \"accel/checkpoint/checkpoint_manager.h\" (the old path goes in accel 0.2.0)")
#include "accel/checkpoint/checkpoint_manager.h"

#endif  // ACCEL_FORWARDING_CHECKPOINT_MANAGER_H_
