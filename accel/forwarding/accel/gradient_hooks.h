// Deprecated: accel/gradient_hooks.h moved to accel/parallel/gradient_hooks.h
// in accel 0.1.1. This forwarding header keeps the old path working until accel
// 0.2.0, which removes it; include the new path (docs/development.md lists
// them).
#ifndef ACCEL_FORWARDING_GRADIENT_HOOKS_H_
#define ACCEL_FORWARDING_GRADIENT_HOOKS_H_

#pragma message( \
    "accel/gradient_hooks.h is deprecated: include \"accel/parallel/gradient_hooks.h\" (the old path goes in accel 0.2.0)")
#include "accel/parallel/gradient_hooks.h"

#endif  // ACCEL_FORWARDING_GRADIENT_HOOKS_H_
