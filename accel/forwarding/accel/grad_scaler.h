// Deprecated: accel/grad_scaler.h moved to accel/optim/grad_scaler.h in accel
// 0.1.1. This forwarding header keeps the old path working until accel 0.2.0,
// which removes it; include the new path (docs/development.md lists them).
#ifndef ACCEL_FORWARDING_GRAD_SCALER_H_
#define ACCEL_FORWARDING_GRAD_SCALER_H_

#pragma message( \
    "accel/grad_scaler.h is deprecated: include \"accel/optim/grad_scaler.h\" (the old path goes in accel 0.2.0)")
#include "accel/optim/grad_scaler.h"

#endif  // ACCEL_FORWARDING_GRAD_SCALER_H_
