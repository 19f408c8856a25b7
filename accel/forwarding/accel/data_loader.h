// Deprecated: accel/data_loader.h moved to accel/data/data_loader.h in accel
// 0.1.1. This forwarding header keeps the old path working until accel 0.2.0,
// which removes it; include the new path (docs/development.md lists them).
#ifndef ACCEL_FORWARDING_DATA_LOADER_H_
#define ACCEL_FORWARDING_DATA_LOADER_H_

#pragma message( \
    "accel/data_loader.h is deprecated: include \"accel/data/data_loader.h\" (the old path goes in accel 0.2.0)")
#include "accel/data/data_loader.h"

#endif  // ACCEL_FORWARDING_DATA_LOADER_H_
