// Deprecated: accel/released_memory.h moved to accel/memory/released_memory.h
// in accel 0.1.1. This forwarding header keeps the old path working until accel
// 0.2.0, which removes it; include the new path (docs/development.md lists
// them).
#ifndef ACCEL_FORWARDING_RELEASED_MEMORY_H_
#define ACCEL_FORWARDING_RELEASED_MEMORY_H_

#pragma message( \
    "accel/released_memory.h is deprecated: include \"accel/memory/released_memory.h\" (the old path goes in accel 0.2.0)")
#include "accel/memory/released_memory.h"

#endif  // ACCEL_FORWARDING_RELEASED_MEMORY_H_
