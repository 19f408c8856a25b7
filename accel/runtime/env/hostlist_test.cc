#include "accel/runtime/env/hostlist.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "accel/runtime/base/errors.h"

namespace accel::launch_env {
namespace {

using ::testing::ElementsAre;

TEST(HostListTest, ExpandsRangesListsAndPlainNames) {
  EXPECT_THAT(ExpandHostList("vm"), ElementsAre("vm"));
  EXPECT_THAT(ExpandHostList("node[01-03,07],login"),
              ElementsAre("node01", "node02", "node03", "node07", "login"));
  EXPECT_THAT(ExpandHostList("n[8-10]"), ElementsAre("n8", "n9", "n10"));
  EXPECT_THAT(ExpandHostList("n[08-10]"), ElementsAre("n08", "n09", "n10"));
  EXPECT_THAT(
      ExpandHostList("rack[1-2]-gpu[1-2]"),
      ElementsAre("rack1-gpu1", "rack1-gpu2", "rack2-gpu1", "rack2-gpu2"));
  EXPECT_THAT(ExpandHostList("a[1],b-[3-4].x"),
              ElementsAre("a1", "b-3.x", "b-4.x"));
}

TEST(HostListTest, MalformedListsAreNamed) {
  for (const char* bad : {"node[1-", "node]", "n[a-b]", "n[3-1]", "a,,b", ""}) {
    try {
      ExpandHostList(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(std::string("'") + bad + "'"));
    }
  }
}

TEST(HostListTest, ExpandsTasksPerNode) {
  EXPECT_THAT(ExpandTasksPerNode("2"), ElementsAre(2));
  EXPECT_THAT(ExpandTasksPerNode("2(x3),1"), ElementsAre(2, 2, 2, 1));
  EXPECT_THROW(ExpandTasksPerNode("2(x"), UsageError);
  EXPECT_THROW(ExpandTasksPerNode("two"), UsageError);
}

}  // namespace
}  // namespace accel::launch_env
