#include "accel/runtime/ft/quorum.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "accel/runtime/base/errors.h"

namespace accel::ft {
namespace {

TEST(QuorumTest, RequestsAndAnswersReadBack) {
  const QuorumRequest request{"ab12", 7, 41, Vote::kFailed, true};
  const QuorumRequest back = QuorumRequest::Decode(request.Encode());
  EXPECT_EQ(back.incarnation, "ab12");
  EXPECT_EQ(back.serial, 7);
  EXPECT_EQ(back.step, 41);
  EXPECT_EQ(back.vote, Vote::kFailed);
  EXPECT_TRUE(back.in_sync);

  Quorum quorum;
  quorum.id = 3;
  quorum.step = 42;
  quorum.members = {{0, "aa"}, {2, "cc"}, {3, "dd"}};
  quorum.recovering = {3};
  quorum.source = 0;
  const Quorum read = Quorum::Decode(quorum.Encode());
  EXPECT_EQ(read.id, 3);
  EXPECT_EQ(read.step, 42);
  EXPECT_EQ(read.Ranks(), (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(read.members[2].incarnation, "dd");
  EXPECT_EQ(read.IndexOf(2), 1);
  EXPECT_EQ(read.IndexOf(1), -1);
  EXPECT_TRUE(read.Recovering(3));
  EXPECT_FALSE(read.Recovering(2));
  EXPECT_EQ(read.source, 0);
  EXPECT_EQ(read.stop, "");
}

TEST(QuorumTest, AStopKeepsItsWholeReason) {
  Quorum quorum;
  quorum.stop = "only 1 of 4 replicas are left (x=1 y=2)";
  EXPECT_EQ(Quorum::Decode(quorum.Encode()).stop, quorum.stop);
}

TEST(QuorumTest, GarbageIsRefusedWithTheText) {
  EXPECT_THROW(QuorumRequest::Decode("hello"), UsageError);
  try {
    QuorumRequest::Decode("inc=a serial=x step=1 vote=ok sync=0");
    FAIL() << "a bad serial was read";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), testing::HasSubstr("serial is not a number"));
  }
  EXPECT_THROW(QuorumRequest::Decode("inc=a serial=1 step=1 vote=maybe sync=0"),
               UsageError);
  EXPECT_THROW(Quorum::Decode("id=1 step=2"), UsageError);
}

}  // namespace
}  // namespace accel::ft
