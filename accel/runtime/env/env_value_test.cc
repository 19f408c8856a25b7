#include "accel/runtime/env/env_value.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(EnvValueTest, IntegersParseStrictlyAndNameTheVariable) {
  unsetenv("ACCEL_TEST_VALUE");
  EXPECT_EQ(EnvInt64("ACCEL_TEST_VALUE"), std::nullopt);
  setenv("ACCEL_TEST_VALUE", "1234567890123", 1);
  EXPECT_EQ(EnvInt64("ACCEL_TEST_VALUE"), 1234567890123);
  for (const char* bad : {"garbage", "", "12x", " 7", "99999999999999999999"}) {
    setenv("ACCEL_TEST_VALUE", bad, 1);
    EXPECT_THAT([] { EnvInt64("ACCEL_TEST_VALUE"); },
                ThrowsMessage<UsageError>(
                    HasSubstr("environment variable ACCEL_TEST_VALUE must be "
                              "an integer, found \"" +
                              std::string(bad) + "\"")))
        << bad;
  }
  setenv("ACCEL_TEST_VALUE", "-1", 1);
  EXPECT_THAT([] { EnvInt64("ACCEL_TEST_VALUE", 0, 10); },
              ThrowsMessage<UsageError>(
                  HasSubstr("must be an integer in [0, 10], found \"-1\"")));
  setenv("ACCEL_TEST_VALUE", "\x01\x7f", 1);
  EXPECT_THAT([] { EnvInt64("ACCEL_TEST_VALUE"); },
              ThrowsMessage<UsageError>(HasSubstr("found \"\\x01\\x7f\"")));
}

TEST(EnvValueTest, SwitchesTakeTheUsualSpellingsOnly) {
  for (const char* yes : {"1", "true", "ON", "Yes"}) {
    setenv("ACCEL_TEST_SWITCH", yes, 1);
    EXPECT_EQ(EnvSwitch("ACCEL_TEST_SWITCH"), true) << yes;
  }
  for (const char* no : {"0", "false", "off", "NO"}) {
    setenv("ACCEL_TEST_SWITCH", no, 1);
    EXPECT_EQ(EnvSwitch("ACCEL_TEST_SWITCH"), false) << no;
  }
  setenv("ACCEL_TEST_SWITCH", "", 1);
  EXPECT_EQ(EnvSwitch("ACCEL_TEST_SWITCH"), std::nullopt);
  setenv("ACCEL_TEST_SWITCH", "maybe", 1);
  EXPECT_THAT([] { EnvSwitch("ACCEL_TEST_SWITCH"); },
              ThrowsMessage<UsageError>(HasSubstr(
                  "ACCEL_TEST_SWITCH must be 1 or 0 (true/false, on/off, "
                  "yes/no), found \"maybe\"")));
}

}  // namespace
}  // namespace accel
