// Deprecated: accel/checkpoint_file.h moved to
// accel/checkpoint/checkpoint_file.h in accel 0.1.1. This forwarding header
// keeps the old path working until accel 0.2.0, which removes it; include the
// new path (docs/development.md lists them).
#ifndef ACCEL_FORWARDING_CHECKPOINT_FILE_H_
#define ACCEL_FORWARDING_CHECKPOINT_FILE_H_

#pragma message( \
    "accel/checkpoint_file.h is deprecated: include \"accel/checkpoint/checkpoint_file.h\" (the old path goes in accel 0.2.0)")
#include "accel/checkpoint/checkpoint_file.h"

#endif  // ACCEL_FORWARDING_CHECKPOINT_FILE_H_
