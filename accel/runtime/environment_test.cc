#include "accel/runtime/environment.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "accel/runtime/errors.h"

namespace accel {
namespace {

using ::testing::HasSubstr;

DistributedEnvironment ParseFrom(
    const std::map<std::string, std::string>& vars) {
  return DistributedEnvironment::Parse([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string ErrorFrom(const std::map<std::string, std::string>& vars) {
  try {
    ParseFrom(vars);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

TEST(EnvironmentTest, NoVariablesMeansOneProcess) {
  const DistributedEnvironment env = ParseFrom({});
  EXPECT_FALSE(env.launched);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
}

TEST(EnvironmentTest, ReadsTorchrunVariables) {
  const DistributedEnvironment env =
      ParseFrom({{"RANK", "3"},
                 {"WORLD_SIZE", "4"},
                 {"LOCAL_RANK", "1"},
                 {"LOCAL_WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "10.1.2.3"},
                 {"MASTER_PORT", "1234"},
                 {"ACCEL_RUN_SECRET", "s3cret"},
                 {"TORCHELASTIC_RESTART_COUNT", "2"}});
  EXPECT_TRUE(env.launched);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.1.2.3");
  EXPECT_EQ(env.master_port, 1234);
  EXPECT_EQ(env.run_secret, "s3cret");
  EXPECT_EQ(env.restart_count, 2);
}

TEST(EnvironmentTest, LocalValuesDefaultToGlobalOnes) {
  const DistributedEnvironment env = ParseFrom({{"RANK", "1"},
                                                {"WORLD_SIZE", "2"},
                                                {"MASTER_ADDR", "h"},
                                                {"MASTER_PORT", "5"}});
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
}

TEST(EnvironmentTest, RankOutOfRangeIsAClearError) {
  EXPECT_EQ(ErrorFrom({{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
            "RANK must be in [0, WORLD_SIZE) = [0, 2), found 2");
  EXPECT_EQ(ErrorFrom({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}),
            "RANK must be in [0, WORLD_SIZE) = [0, 2), found -1");
  EXPECT_EQ(ErrorFrom({{"RANK", "0"}, {"WORLD_SIZE", "0"}}),
            "WORLD_SIZE must be at least 1, found 0");
}

TEST(EnvironmentTest, MissingOrMalformedVariablesAreNamed) {
  EXPECT_THAT(ErrorFrom({{"WORLD_SIZE", "2"}}),
              HasSubstr("RANK is missing while WORLD_SIZE is set"));
  EXPECT_THAT(ErrorFrom({{"RANK", "0"}, {"WORLD_SIZE", "2"}}),
              HasSubstr("MASTER_ADDR is missing"));
  EXPECT_THAT(
      ErrorFrom({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}),
      HasSubstr("MASTER_PORT is missing"));
  EXPECT_EQ(ErrorFrom({{"RANK", "one"}, {"WORLD_SIZE", "2"}}),
            "environment variable RANK must be an integer, found 'one'");
  EXPECT_EQ(ErrorFrom({{"RANK", "0"},
                       {"WORLD_SIZE", "2"},
                       {"MASTER_ADDR", "h"},
                       {"MASTER_PORT", "70000"}}),
            "MASTER_PORT must be in [1, 65535], found 70000");
  EXPECT_THAT(ErrorFrom({{"RANK", "0"},
                         {"WORLD_SIZE", "2"},
                         {"LOCAL_RANK", "2"},
                         {"LOCAL_WORLD_SIZE", "2"}}),
              HasSubstr("LOCAL_RANK must be in [0, LOCAL_WORLD_SIZE)"));
}

}  // namespace
}  // namespace accel
