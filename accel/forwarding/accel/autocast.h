// Deprecated: accel/autocast.h moved to accel/optim/autocast.h in accel 0.1.1.
// This forwarding header keeps the old path working until accel 0.2.0, which
// removes it; include the new path (docs/development.md lists them).
#ifndef ACCEL_FORWARDING_AUTOCAST_H_
#define ACCEL_FORWARDING_AUTOCAST_H_

#pragma message( \
    "accel/autocast.h is deprecated: include \"accel/optim/autocast.h\" (the old path goes in accel 0.2.0)")
#include "accel/optim/autocast.h"

#endif  // ACCEL_FORWARDING_AUTOCAST_H_
