#include "tests/store_semantics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "accel/runtime/base/errors.h"

namespace accel::testing {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

void ExpectStoreSemantics(Store& a, Store& b) {
  a.set("k", "v1");
  EXPECT_EQ(b.get("k", milliseconds(1000)), "v1");
  EXPECT_EQ(b.try_get("absent"), std::nullopt);
  EXPECT_EQ(a.add("counter", 5), 5);
  EXPECT_EQ(b.add("counter", -2), 3);
  std::string binary("\0\1\2\xff", 4);
  a.set("binary", binary);
  EXPECT_EQ(b.get("binary", milliseconds(1000)), binary);

  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    a.set("late", "here");
  });
  EXPECT_EQ(b.get("late", milliseconds(5000)), "here");
  setter.join();

  try {
    b.wait({"k", "never1", "never2"}, milliseconds(200));
    ADD_FAILURE() << "wait on absent keys did not time out";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("never1, "));
    EXPECT_THAT(e.what(), HasSubstr("never2]"));
    EXPECT_THAT(e.what(), ::testing::Not(HasSubstr("k,")));
    EXPECT_THAT(e.what(), HasSubstr("200 ms"));
  }
}

}  // namespace accel::testing
