// Deprecated: accel/state_dict.h moved to accel/checkpoint/state_dict.h in
// accel 0.1.1. This forwarding header keeps the old path working until accel
// 0.2.0, which removes it; include the new path (docs/development.md lists
// them).
#ifndef ACCEL_FORWARDING_STATE_DICT_H_
#define ACCEL_FORWARDING_STATE_DICT_H_

#pragma message( \
    "accel/state_dict.h is deprecated: include \"accel/checkpoint/state_dict.h\" (the old path goes in accel 0.2.0)")
#include "accel/checkpoint/state_dict.h"

#endif  // ACCEL_FORWARDING_STATE_DICT_H_
