// Deprecated: accel/reduce_lr_on_plateau.h moved to
// accel/optim/reduce_lr_on_plateau.h in accel 0.1.1. This forwarding header
// keeps the old path working until accel 0.2.0, which removes it; include the
// new path (docs/development.md lists them).
#ifndef ACCEL_FORWARDING_REDUCE_LR_ON_PLATEAU_H_
#define ACCEL_FORWARDING_REDUCE_LR_ON_PLATEAU_H_

#pragma message( \
    "accel/reduce_lr_on_plateau.h is deprecated: include \"accel/optim/reduce_lr_on_plateau.h\" (the old path goes in accel 0.2.0)")
#include "accel/optim/reduce_lr_on_plateau.h"

#endif  // ACCEL_FORWARDING_REDUCE_LR_ON_PLATEAU_H_
