// The behaviour required of every Store implementation, for their tests.
//
//   accel::InMemoryStore store;
//   accel::testing::ExpectStoreSemantics(store, store);
#pragma once

#include "accel/runtime/store/store.h"

namespace accel::testing {

// `a` and `b` are two handles on one store (two clients, or the same).
void ExpectStoreSemantics(Store& a, Store& b);

}  // namespace accel::testing
