// Deprecated: accel/powersgd.h moved to accel/parallel/powersgd.h in accel
// 0.1.1. This forwarding header keeps the old path working until accel 0.2.0,
// which removes it; include the new path (docs/development.md lists them).
#ifndef ACCEL_FORWARDING_POWERSGD_H_
#define ACCEL_FORWARDING_POWERSGD_H_

#pragma message( \
    "accel/powersgd.h is deprecated: include \"accel/parallel/powersgd.h\" (the old path goes in accel 0.2.0)")
#include "accel/parallel/powersgd.h"

#endif  // ACCEL_FORWARDING_POWERSGD_H_
