// Deprecated: accel/tensor_census.h moved to accel/memory/tensor_census.h in
// accel 0.1.1. This forwarding header keeps the old path working until accel
// 0.2.0, which removes it; include the new path (docs/development.md lists
// them).
#ifndef ACCEL_FORWARDING_TENSOR_CENSUS_H_
#define ACCEL_FORWARDING_TENSOR_CENSUS_H_

#pragma message( \
    "accel/tensor_census.h is deprecated: include \"accel/memory/tensor_census.h\" (the old path goes in accel 0.2.0)")
#include "accel/memory/tensor_census.h"

#endif  // ACCEL_FORWARDING_TENSOR_CENSUS_H_
