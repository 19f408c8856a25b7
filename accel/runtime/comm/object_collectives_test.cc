// GatherObject / BroadcastObjectList with ranks as threads over Gloo, and
// the codecs on their own, including every way their input can be broken.
#include "accel/runtime/comm/object_collectives.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "tests/thread_ranks.h"

namespace accel {

// A user type with its own codec, as the header shows.
struct Score {
  std::string name;
  double value = 0;
  bool operator==(const Score& other) const {
    return name == other.name && value == other.value;
  }
};

template <>
struct ObjectCodec<Score> {
  static void Encode(const Score& score, std::string* out) {
    EncodeObject(score.name, out);
    EncodeObject(score.value, out);
  }
  static Score Decode(ByteReader& in) {
    Score score;
    score.name = DecodeObject<std::string>(in);
    score.value = DecodeObject<double>(in);
    return score;
  }
};

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int kMaxRanks = 4;

enum class Color : uint8_t { kRed = 1, kBlue = 7 };

using Nested = std::vector<std::map<
    std::string, std::vector<std::optional<std::pair<int16_t, double>>>>>;

Nested MakeNested(int seed) {
  Nested nested(seed % 3);
  for (size_t i = 0; i < nested.size(); ++i) {
    auto& entry = nested[i]["key" + std::to_string(seed)];
    entry.push_back(std::nullopt);
    entry.push_back(std::make_pair(static_cast<int16_t>(-seed), seed * 0.5));
    nested[i][""];  // An empty inner vector under an empty key.
  }
  return nested;
}

template <typename T>
void ExpectRoundTrip(const T& value) {
  const std::string bytes = SerializeObject(value);
  EXPECT_EQ(DeserializeObject<T>(bytes), value);
}

TEST(ObjectCodecTest, RoundTripsEveryProvidedCodec) {
  ExpectRoundTrip(true);
  ExpectRoundTrip(false);
  ExpectRoundTrip(std::numeric_limits<int8_t>::min());
  ExpectRoundTrip(std::numeric_limits<uint16_t>::max());
  ExpectRoundTrip(std::numeric_limits<int32_t>::min());
  ExpectRoundTrip(std::numeric_limits<uint64_t>::max());
  ExpectRoundTrip('x');
  ExpectRoundTrip(-0.0f);
  ExpectRoundTrip(std::numeric_limits<double>::infinity());
  ExpectRoundTrip(std::numeric_limits<double>::denorm_min());
  ExpectRoundTrip(Color::kBlue);
  ExpectRoundTrip(std::string("with\0nul", 8));
  ExpectRoundTrip(std::string());
  ExpectRoundTrip(std::vector<bool>{true, false, true});
  ExpectRoundTrip(std::vector<std::vector<std::string>>{{}, {"a", ""}, {}});
  ExpectRoundTrip(
      std::map<std::string, std::vector<int>>{{"a", {1, 2}}, {"b", {}}});
  ExpectRoundTrip(std::make_pair(std::string("p"), std::optional<int>()));
  ExpectRoundTrip(std::optional<std::string>("present"));
  ExpectRoundTrip(MakeNested(5));
  ExpectRoundTrip(Score{"loss", 0.25});

  const double nan = std::nan("");
  EXPECT_TRUE(std::isnan(DeserializeObject<double>(SerializeObject(nan))));
}

TEST(ObjectCodecTest, EveryTruncationIsAnErrorNotACrash) {
  const std::string bytes = SerializeObject(MakeNested(7));
  for (size_t length = 0; length < bytes.size(); ++length) {
    EXPECT_THROW(DeserializeObject<Nested>(bytes.substr(0, length)), UsageError)
        << "truncated to " << length << " of " << bytes.size() << " bytes";
  }
  EXPECT_THAT(
      [&] { DeserializeObject<Nested>(bytes + "x"); },
      ::testing::ThrowsMessage<UsageError>(HasSubstr("1 bytes left after")));
}

TEST(ObjectCodecTest, RejectsImpossibleValues) {
  EXPECT_THAT([] { DeserializeObject<bool>(std::string(1, '\2')); },
              ::testing::ThrowsMessage<UsageError>(
                  HasSubstr("a bool must be byte 0 or 1, found 2")));

  // A count far beyond the buffer fails before allocating anything.
  std::string huge;
  WriteLength(std::numeric_limits<uint64_t>::max() / 2, &huge);
  EXPECT_THAT(
      [&] { DeserializeObject<std::vector<std::string>>(huge); },
      ::testing::ThrowsMessage<UsageError>(HasSubstr("exceeds the 0 bytes")));

  std::string duplicate;
  WriteLength(2, &duplicate);
  for (int i = 0; i < 2; ++i) {
    EncodeObject(std::string("k"), &duplicate);
    EncodeObject(1, &duplicate);
  }
  using StringToInt = std::map<std::string, int>;
  EXPECT_THAT([&] { DeserializeObject<StringToInt>(duplicate); },
              ::testing::ThrowsMessage<UsageError>(
                  HasSubstr("duplicate key in a map")));
}

TEST(ObjectCodecTest, RandomCorruptionDecodesOrThrowsUsageError) {
  const std::string original = SerializeObject(MakeNested(8));
  std::mt19937 random(1234);
  int rejected = 0;
  constexpr int kTrials = 2000;
  for (int trial = 0; trial < kTrials; ++trial) {
    std::string bytes = original;
    const int flips = 1 + trial % 3;
    for (int i = 0; i < flips; ++i) {
      bytes[random() % bytes.size()] ^= static_cast<char>(1 + random() % 255);
    }
    try {
      DeserializeObject<Nested>(bytes);
    } catch (const UsageError&) {
      ++rejected;
    }
  }
  // Most flips land in lengths, counts or bools and must be caught; flips in
  // payload bytes (numbers, characters) decode to other valid values.
  EXPECT_GT(rejected, kTrials / 4);
}

// Rank r passes r + 1 strings whose lengths differ by rank, some empty.
std::vector<std::string> StringsOf(int rank) {
  std::vector<std::string> strings;
  for (int i = 0; i <= rank; ++i) {
    strings.push_back(std::string(rank * 3 + i, static_cast<char>('a' + i)));
  }
  return strings;
}

Score ScoreOf(int rank) {
  return Score{"rank" + std::to_string(rank), rank / 4.0};
}

class ObjectCollectivesTest : public ::testing::TestWithParam<int> {
 protected:
  int world_size() const { return GetParam(); }
};

TEST_P(ObjectCollectivesTest, GatherConcatenatesListsInRankOrder) {
  std::vector<std::string> expected;
  for (int rank = 0; rank < world_size(); ++rank) {
    for (std::string& s : StringsOf(rank)) expected.push_back(s);
  }
  testing::RunRanks("gloo", world_size(), [&](Communicator& comm) {
    EXPECT_EQ(GatherObject(comm, StringsOf(comm.rank())), expected);
  });
}

TEST_P(ObjectCollectivesTest, GatherOfEmptyLists) {
  testing::RunRanks("gloo", world_size(), [&](Communicator& comm) {
    EXPECT_THAT(GatherObject(comm, std::vector<int>()), IsEmpty());
    // Only the last rank contributes.
    std::vector<int> mine;
    if (comm.rank() == comm.size() - 1) mine = {42, 43};
    EXPECT_THAT(GatherObject(comm, mine), ElementsAre(42, 43));
  });
}

TEST_P(ObjectCollectivesTest, GatherOfNestedContainersAndUserTypes) {
  Nested expected_nested;
  std::vector<Score> expected_scores;
  for (int rank = 0; rank < world_size(); ++rank) {
    for (auto& entry : MakeNested(rank + 4)) expected_nested.push_back(entry);
    expected_scores.push_back(ScoreOf(rank));
  }
  testing::RunRanks("gloo", world_size(), [&](Communicator& comm) {
    EXPECT_EQ(GatherObject(comm, MakeNested(comm.rank() + 4)), expected_nested);
    EXPECT_EQ(GatherObject(comm, std::vector<Score>{ScoreOf(comm.rank())}),
              expected_scores);
  });
}

TEST_P(ObjectCollectivesTest, BroadcastReplacesEveryRanksList) {
  testing::RunRanks("gloo", world_size(), [&](Communicator& comm) {
    for (int from = 0; from < comm.size(); ++from) {
      // Lists of different lengths before the call.
      std::vector<std::string> list = StringsOf(comm.rank());
      std::vector<std::string>& result = BroadcastObjectList(comm, list, from);
      EXPECT_EQ(&result, &list);
      EXPECT_EQ(list, StringsOf(from)) << "from " << from;
    }
    std::vector<std::map<std::string, double>> config;
    if (comm.rank() == 0) config = {{{"lr", 3e-4}, {"warmup", 100}}};
    BroadcastObjectList(comm, config);
    ASSERT_EQ(config.size(), 1u);
    EXPECT_EQ(config[0].at("lr"), 3e-4);

    std::vector<Score> empty = {Score{"stale", 1}};
    if (comm.rank() == 0) empty.clear();
    EXPECT_THAT(BroadcastObjectList(comm, empty), IsEmpty());
  });
}

TEST_P(ObjectCollectivesTest, RanksPassingDifferentTypesAllFail) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks";
  testing::RunRanks("gloo", world_size(), [&](Communicator& comm) {
    const auto gather = [&] {
      if (comm.rank() == 1) {
        GatherObject(comm, std::vector<int>{1});
      } else {
        GatherObject(comm, std::vector<std::string>{"x"});
      }
    };
    EXPECT_THAT(gather, ::testing::ThrowsMessage<UsageError>(::testing::AllOf(
                            HasSubstr("gather_object on rank"),
                            HasSubstr("rank 1: std::vector<int"),
                            HasSubstr("ranks passed different types"))));
    const auto broadcast = [&] {
      if (comm.rank() == 0) {
        std::vector<int> list = {1};
        BroadcastObjectList(comm, list);
      } else {
        std::vector<double> list;
        BroadcastObjectList(comm, list);
      }
    };
    if (comm.rank() == 0) {
      EXPECT_NO_THROW(broadcast());
    } else {
      EXPECT_THAT(broadcast, ::testing::ThrowsMessage<UsageError>(
                                 HasSubstr("rank 0 sent std::vector<int")));
    }
    // The communicator is still usable afterwards.
    EXPECT_EQ(GatherObject(comm, std::vector<int>{comm.rank()}).size(),
              static_cast<size_t>(comm.size()));
  });
}

TEST_P(ObjectCollectivesTest, BroadcastFromAMissingRankIsAUsageError) {
  testing::RunRanks("gloo", world_size(), [&](Communicator& comm) {
    std::vector<int> list;
    EXPECT_THAT(
        [&] { BroadcastObjectList(comm, list, comm.size()); },
        ::testing::ThrowsMessage<UsageError>(HasSubstr(
            "broadcast_object_list on rank " + std::to_string(comm.rank()) +
            "/" + std::to_string(comm.size()) +
            ": from_process must be a rank in [0, " +
            std::to_string(comm.size()) + ")")));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, ObjectCollectivesTest,
                         ::testing::Range(1, kMaxRanks + 1),
                         [](const auto& info) {
                           return std::to_string(info.param) + "ranks";
                         });

}  // namespace
}  // namespace accel
