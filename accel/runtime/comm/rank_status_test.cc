#include "accel/runtime/comm/rank_status.h"

#include <gtest/gtest.h>

namespace accel {
namespace {

TEST(RankStatusTest, RoundTripsAndRefusesAnotherVersion) {
  RankStatus mine;
  mine.sequence = 12;
  mine.running = true;
  mine.api = "gather";
  mine.signature = "allgather uint8 x 1024";
  mine.site = "train.cc:75";
  mine.beat = 7;
  const std::string text = EncodeRankStatus(mine);
  EXPECT_EQ(text.substr(0, 2), "1\t");  // The version comes first.
  const RankStatus back = DecodeRankStatus(text);
  EXPECT_TRUE(back.published);
  EXPECT_TRUE(back.known);
  EXPECT_EQ(back.sequence, 12u);
  EXPECT_TRUE(back.running);
  EXPECT_EQ(back.api, "gather");
  EXPECT_EQ(back.signature, "allgather uint8 x 1024");
  EXPECT_EQ(back.site, "train.cc:75");
  EXPECT_EQ(back.beat, 7u);
  EXPECT_EQ(DescribeCall(back), "gather #12 (train.cc:75)");
  // A later minor version's extra fields are ignored.
  EXPECT_TRUE(DecodeRankStatus(text + "\tmore").published);
  // Another major version, the unversioned record of an older accel, or
  // garbage: unpublished, never misread.
  EXPECT_FALSE(DecodeRankStatus("2" + text.substr(1)).published);
  EXPECT_FALSE(
      DecodeRankStatus("12\t1\tgather\tsig\ttrain.cc:75\t7").published);
  EXPECT_FALSE(DecodeRankStatus("garbage").published);
}

TEST(RankStatusTest, DeparturesAreKindsAndReadBack) {
  using Kind = Departure::Kind;
  for (const Departure& how :
       {Departure{Kind::kExited, ""}, Departure{Kind::kExitedWithError, ""},
        Departure{Kind::kFailed, "ranks called different collectives"},
        Departure{Kind::kCrashed, ""},
        Departure{Kind::kUnreachable, "10.0.0.2:4000"}}) {
    EXPECT_EQ(Departure::FromString(how.ToString()), how) << how.ToString();
  }
  EXPECT_FALSE((Departure{Kind::kExited, ""}.failure()));
  EXPECT_TRUE((Departure{Kind::kCrashed, ""}.failure()));
  EXPECT_EQ(DescribeDeparture(2, {Kind::kCrashed, ""}),
            "rank 2 crashed (its process left the job)");
  EXPECT_EQ(DescribeDeparture(3, {Kind::kUnreachable, "10.0.0.2:4000"}),
            "rank 3 is unreachable (its machine 10.0.0.2:4000 stopped "
            "answering on the network)");
}

}  // namespace
}  // namespace accel
