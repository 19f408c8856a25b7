// Deprecated: accel/model_weights.h moved to accel/checkpoint/model_weights.h
// in accel 0.1.1. This forwarding header keeps the old path working until accel
// 0.2.0, which removes it; include the new path (docs/development.md lists
// them).
#ifndef ACCEL_FORWARDING_MODEL_WEIGHTS_H_
#define ACCEL_FORWARDING_MODEL_WEIGHTS_H_

#pragma message( \
    "accel/model_weights.h is deprecated: include \"accel/checkpoint/model_weights.h\" (the old path goes in accel 0.2.0)")
#include "accel/checkpoint/model_weights.h"

#endif  // ACCEL_FORWARDING_MODEL_WEIGHTS_H_
