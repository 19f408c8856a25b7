// Deprecated: accel/libtorch_compat.h moved to accel/core/libtorch_compat.h in
// accel 0.1.1. This forwarding header keeps the old path working until accel
// 0.2.0, which removes it; include the new path (docs/development.md lists
// them).
#ifndef ACCEL_FORWARDING_LIBTORCH_COMPAT_H_
#define ACCEL_FORWARDING_LIBTORCH_COMPAT_H_

#pragma message( \
    "accel/libtorch_compat.h is deprecated: include \"accel/core/libtorch_compat.h\" (the old path goes in accel 0.2.0)")
#include "accel/core/libtorch_compat.h"

#endif  // ACCEL_FORWARDING_LIBTORCH_COMPAT_H_
