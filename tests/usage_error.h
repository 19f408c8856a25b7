// The message of the UsageError a call throws, for tests of error paths:
//
//   EXPECT_THAT(accel::testing::UsageErrorOf([] { ParseTrackerNames(",x"); }),
//               HasSubstr("has an empty name"));
//
// A call that throws none fails the test (and gives "").
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "accel/runtime/base/errors.h"

namespace accel::testing {

template <typename Fn>
std::string UsageErrorOf(Fn&& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return "";
}

}  // namespace accel::testing
