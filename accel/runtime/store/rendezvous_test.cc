#include "accel/runtime/store/rendezvous.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/store/tcp_store.h"

namespace accel {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using ::testing::HasSubstr;

DistributedEnvironment Env(int rank, int world_size, int port) {
  DistributedEnvironment env;
  env.rank = rank;
  env.world_size = world_size;
  env.local_world_size = world_size;
  env.master_port = port;
  return env;
}

// Runs MeetAtStore for `ranks` of a job of `world_size` over one TCP store,
// each a thread with its own connection; returns each one's error ("" when
// it met the others).
std::vector<std::string> Meet(int world_size, const std::vector<int>& ranks,
                              milliseconds timeout) {
  TcpStoreServerOptions options;
  options.max_unauthenticated = world_size + 16;
  TcpStoreServer server(options);
  std::vector<std::string> errors(ranks.size());
  std::vector<std::thread> threads;
  const auto deadline = Clock::now() + timeout;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        TcpStoreOptions client;
        client.rank = ranks[i];
        TcpStore store("127.0.0.1", server.port(), client);
        MeetAtStore(store, Env(ranks[i], world_size, server.port()),
                    "127.0.0.1", deadline, nullptr);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

TEST(RendezvousTest, HundredsOfRanksMeet) {
  std::vector<int> ranks;
  for (int r = 0; r < 256; ++r) ranks.push_back(r);
  for (const std::string& error : Meet(256, ranks, milliseconds(60000))) {
    EXPECT_EQ(error, "");
  }
}

TEST(RendezvousTest, EveryRankNamesTheOneThatNeverCame) {
  const std::vector<std::string> errors =
      Meet(6, {0, 1, 2, 3, 5}, milliseconds(800));
  for (const std::string& error : errors) {
    EXPECT_THAT(error, HasSubstr("rank 4 did not join within"));
  }
}

// A rank's count is its own, whoever claims it twice: two processes saying
// they are rank 1 do not stand in for the missing rank 2.
TEST(RendezvousTest, ARankClaimedTwiceCountsOnce) {
  InMemoryStore store;
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  const auto deadline = Clock::now() + milliseconds(800);
  const std::vector<int> ranks = {0, 1, 1};
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        MeetAtStore(store, Env(ranks[i], 3, 29500), "127.0.0.1", deadline,
                    nullptr);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& error : errors) {
    EXPECT_THAT(error, HasSubstr("rank 2 did not join within"));
  }
}

// Processes started with different world sizes (a misconfigured launch that
// shares the job id) do not complete each other's meeting: ranks 8-11 of a
// job of 12 arrive first, then ranks 0-3 of a job of 8 make eight claims.
TEST(RendezvousTest, RanksOfAnotherWorldSizeDoNotCompleteTheMeeting) {
  InMemoryStore store;
  const auto deadline = Clock::now() + milliseconds(1500);
  std::vector<std::string> errors(8);
  std::vector<std::thread> threads;
  auto meet = [&](int index, int rank, int world_size) {
    threads.emplace_back([&, index, rank, world_size] {
      try {
        MeetAtStore(store, Env(rank, world_size, 29500), "127.0.0.1", deadline,
                    nullptr);
      } catch (const std::exception& e) {
        errors[index] = e.what();
      }
    });
  };
  for (int i = 0; i < 4; ++i) meet(4 + i, 8 + i, 12);
  for (int i = 0; i < 4; ++i) {
    store.wait({"accel_join/0/" + std::to_string(8 + i) + "/claimed"},
               milliseconds(1000));
  }
  for (int i = 0; i < 4; ++i) meet(i, i, 8);
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_THAT(errors[i], HasSubstr("ranks 4, 5, 6, 7 did not join within"));
  }
  for (int i = 4; i < 8; ++i) EXPECT_THAT(errors[i], HasSubstr("did not join"));
}

// A rank that announced itself and stopped before counting itself: the
// others do not wait past their deadline (and a bounded moment) for it.
TEST(RendezvousTest, ARankThatStoppedBeforeCountingEndsTheWaitAtTheDeadline) {
  InMemoryStore store;
  // Rank 1 got as far as its claim.
  store.set("accel_join/0/1", "127.0.0.1");
  store.add("accel_join/0/1/claimed", 1);
  const auto start = Clock::now();
  try {
    MeetAtStore(store, Env(0, 2, 29500), "127.0.0.1",
                Clock::now() + milliseconds(300), nullptr);
    FAIL() << "the meeting completed without rank 1's count";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("every rank announced itself"));
  }
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
}

}  // namespace
}  // namespace accel
