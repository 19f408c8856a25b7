// Deprecated: accel/gradient_state.h moved to accel/data/gradient_state.h in
// accel 0.1.1. This forwarding header keeps the old path working until accel
// 0.2.0, which removes it; include the new path (docs/development.md lists
// them).
#ifndef ACCEL_FORWARDING_GRADIENT_STATE_H_
#define ACCEL_FORWARDING_GRADIENT_STATE_H_

#pragma message( \
    "accel/gradient_state.h is deprecated: include \"accel/data/gradient_state.h\" (the old path goes in accel 0.2.0)")
#include "accel/data/gradient_state.h"

#endif  // ACCEL_FORWARDING_GRADIENT_STATE_H_
