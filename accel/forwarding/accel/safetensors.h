// Deprecated: accel/safetensors.h moved to accel/checkpoint/safetensors.h in
// accel 0.1.1. This forwarding header keeps the old path working until accel
// 0.2.0, which removes it; include the new path (docs/development.md lists
// them).
#ifndef ACCEL_FORWARDING_SAFETENSORS_H_
#define ACCEL_FORWARDING_SAFETENSORS_H_

#pragma message( \
    "accel/safetensors.h is deprecated: include \"accel/checkpoint/safetensors.h\" (the old path goes in accel 0.2.0)")
#include "accel/checkpoint/safetensors.h"

#endif  // ACCEL_FORWARDING_SAFETENSORS_H_
