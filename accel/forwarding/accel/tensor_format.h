// Deprecated: accel/tensor_format.h moved to accel/core/tensor_format.h in
// accel 0.1.1. This forwarding header keeps the old path working until accel
// 0.2.0, which removes it; include the new path (docs/development.md lists
// them).
#ifndef ACCEL_FORWARDING_TENSOR_FORMAT_H_
#define ACCEL_FORWARDING_TENSOR_FORMAT_H_

#pragma message( \
    "accel/tensor_format.h is deprecated: include \"accel/core/tensor_format.h\" (the old path goes in accel 0.2.0)")
#include "accel/core/tensor_format.h"

#endif  // ACCEL_FORWARDING_TENSOR_FORMAT_H_
