// Deprecated: accel/host_memory_tracker.h moved to
// accel/memory/host_memory_tracker.h in accel 0.1.1. This forwarding header
// keeps the old path working until accel 0.2.0, which removes it; include the
// new path (docs/development.md lists them).
#ifndef ACCEL_FORWARDING_HOST_MEMORY_TRACKER_H_
#define ACCEL_FORWARDING_HOST_MEMORY_TRACKER_H_

#pragma message( \
    "accel/host_memory_tracker.h is deprecated: include \"accel/memory/host_memory_tracker.h\" (the old path goes in accel 0.2.0)")
#include "accel/memory/host_memory_tracker.h"

#endif  // ACCEL_FORWARDING_HOST_MEMORY_TRACKER_H_
