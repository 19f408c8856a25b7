// Deprecated: accel/checkpoint_folders.h moved to
// accel/checkpoint/checkpoint_folders.h in accel 0.1.1. This forwarding header
// keeps the old path working until accel 0.2.0, which removes it; include the
// new path (docs/development.md lists them).
#ifndef ACCEL_FORWARDING_CHECKPOINT_FOLDERS_H_
#define ACCEL_FORWARDING_CHECKPOINT_FOLDERS_H_

#pragma message( \
    "accel/checkpoint_folders.h is deprecated: include \"accel/checkpoint/checkpoint_folders.h\" (the old path goes in accel 0.2.0)")
#include "accel/checkpoint/checkpoint_folders.h"

#endif  // ACCEL_FORWARDING_CHECKPOINT_FOLDERS_H_
