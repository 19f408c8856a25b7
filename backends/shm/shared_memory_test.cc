// The shared memory transport's own behaviour: segment hand-over, strangers,
// waking and aborting waiters, deadlines, mismatched calls, and a rank that
// is killed. Its collectives' results are checked by the conformance suite
// through the gloo backend (backends/gloo/gloo_conformance_test.cc).
#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/store/store.h"
#include "accel/runtime/store/tcp_store.h"
#include "backends/shm/host_layout.h"
#include "backends/shm/shared_memory_group.h"
#include "backends/shm/shared_segment.h"

namespace accel {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr auto kTimeout = std::chrono::seconds(20);

// Runs fn(local_rank) on `size` threads and joins them.
template <typename Fn>
void OnThreads(int size, Fn&& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { fn(r); });
  for (auto& t : threads) t.join();
}

std::vector<int> Ranks(int size) {
  std::vector<int> ranks(size);
  for (int r = 0; r < size; ++r) ranks[r] = r;
  return ranks;
}

// One group per local rank over `store`, made concurrently (each waits for
// the others to join).
std::vector<std::unique_ptr<SharedMemoryGroup>> MakeGroups(
    Store& store, const std::vector<int>& global_ranks) {
  const int size = static_cast<int>(global_ranks.size());
  std::vector<std::unique_ptr<SharedMemoryGroup>> groups(size);
  OnThreads(size, [&](int r) {
    groups[r] =
        std::make_unique<SharedMemoryGroup>(r, global_ranks, store, kTimeout);
  });
  return groups;
}

SharedMemoryGroup::Call CallNumber(uint64_t sequence,
                                   milliseconds timeout = kTimeout) {
  return {sequence, Clock::now() + timeout};
}

TEST(HostLayoutTest, GroupsRanksByKeyInRankOrder) {
  const HostLayout layout = HostLayout::FromKeys({"a", "b", "a", "c", "b"});
  ASSERT_EQ(layout.hosts.size(), 3u);
  EXPECT_EQ(layout.hosts[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(layout.hosts[1], (std::vector<int>{1, 4}));
  EXPECT_EQ(layout.hosts[2], (std::vector<int>{3}));
  EXPECT_EQ(layout.host_of, (std::vector<int>{0, 1, 0, 2, 1}));
  EXPECT_EQ(layout.local_rank, (std::vector<int>{0, 0, 1, 0, 1}));
}

TEST(HostLayoutTest, ExchangeAgreesOnEveryRank) {
  InMemoryStore store;
  std::vector<HostLayout> layouts(4);
  OnThreads(4, [&](int r) {
    layouts[r] =
        HostLayout::Exchange(store, r, 4, r == 2 ? "other" : "same", kTimeout);
  });
  for (const auto& layout : layouts) {
    EXPECT_EQ(layout.hosts, (std::vector<std::vector<int>>{{0, 1, 3}, {2}}));
  }
  EXPECT_FALSE(HostLayout::ThisHostKey().empty());
}

TEST(SharedSegmentTest, EveryLocalRankMapsTheSameZeroedMemory) {
  InMemoryStore store;
  constexpr int kRanks = 3;
  std::vector<std::unique_ptr<SharedSegment>> segments(kRanks);
  OnThreads(kRanks, [&](int r) {
    segments[r] =
        std::make_unique<SharedSegment>(r, kRanks, 8192, store, kTimeout);
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(segments[r]->size(), 8192u);
    EXPECT_EQ(segments[r]->data()[100], 0);
  }
  segments[1]->data()[100] = 42;
  EXPECT_EQ(segments[0]->data()[100], 42);
  EXPECT_EQ(segments[2]->data()[100], 42);
}

TEST(SharedSegmentTest, AStrangerGetsNothingAndTheRanksStillJoin) {
  InMemoryStore store;
  std::unique_ptr<SharedSegment> leader;
  std::thread serving([&] {
    leader = std::make_unique<SharedSegment>(0, 2, 4096, store, kTimeout);
  });
  // Knows the socket's name (anyone can list abstract sockets) but not the
  // nonce that only the store holds.
  const std::string published = store.get("segment", kTimeout);
  const std::string name = published.substr(0, published.find(' '));
  const int stranger = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  ASSERT_EQ(connect(stranger, reinterpret_cast<sockaddr*>(&addr),
                    offsetof(sockaddr_un, sun_path) + 1 + name.size()),
            0);
  const std::string guess = "0123456789abcdef0123456789abcdef 1\n";
  ASSERT_EQ(send(stranger, guess.data(), guess.size(), 0),
            static_cast<ssize_t>(guess.size()));
  char reply;
  EXPECT_EQ(recv(stranger, &reply, 1, 0), 0) << "the stranger got data";
  close(stranger);

  SharedSegment member(1, 2, 4096, store, kTimeout);
  serving.join();
  member.data()[7] = 9;
  EXPECT_EQ(leader->data()[7], 9);
}

TEST(SharedSegmentTest, MissingLocalRanksTimeOutByName) {
  InMemoryStore store;
  try {
    SharedSegment leader(0, 3, 4096, store, milliseconds(200));
    ADD_FAILURE() << "a segment without its other ranks did not fail";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("local rank(s) 1, 2 did not fetch"));
  }
}

TEST(SharedMemoryGroupTest, ASleepingWaiterWakesWhenTheLastRankArrives) {
  InMemoryStore store;
  auto groups = MakeGroups(store, Ranks(2));
  Clock::time_point passed;
  std::thread early([&] {
    groups[0]->Barrier(CallNumber(4));
    passed = Clock::now();
  });
  // Long past the spin: rank 0 sleeps on the futex by now.
  std::this_thread::sleep_for(milliseconds(300));
  const auto arrived = Clock::now();
  groups[1]->Barrier(CallNumber(4));
  early.join();
  EXPECT_GE(passed, arrived);
  // Woken by the arrival, not by its longest sleep or the deadline.
  EXPECT_LT(passed - arrived, std::chrono::seconds(5));
}

TEST(SharedMemoryGroupTest, AbortWakesEveryWaiterWithTheReason) {
  InMemoryStore store;
  constexpr int kRanks = 3;
  auto groups = MakeGroups(store, Ranks(kRanks));
  std::vector<std::string> errors(2);
  std::vector<std::thread> waiters;
  const auto start = Clock::now();
  for (int r = 0; r < 2; ++r) {
    waiters.emplace_back([&, r] {
      try {
        groups[r]->Barrier(CallNumber(4));
      } catch (const PeerError& e) {
        errors[r] = e.what();
      }
    });
  }
  std::this_thread::sleep_for(milliseconds(200));
  groups[2]->Abort("rank 1 crashed");
  for (auto& t : waiters) t.join();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  for (const auto& error : errors) {
    EXPECT_THAT(error, HasSubstr("rank 2 stopped the shared memory "
                                 "collectives: rank 1 crashed"));
  }
  // Later calls fail at once too.
  EXPECT_THROW(groups[2]->Barrier(CallNumber(5)), PeerError);
}

TEST(SharedMemoryGroupTest, DeadlineNamesTheMissingRankAndPoisonsTheGroup) {
  InMemoryStore store;
  auto groups = MakeGroups(store, {4, 7});
  const auto start = Clock::now();
  try {
    groups[0]->Barrier(CallNumber(4, milliseconds(300)));
    ADD_FAILURE() << "a barrier without rank 7 did not time out";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("waited for rank 7 in shared memory"));
  }
  EXPECT_GE(Clock::now() - start, milliseconds(290));
  // The late rank fails at once instead of waiting for its own deadline.
  try {
    groups[1]->Barrier(CallNumber(4));
    ADD_FAILURE() << "the late rank's barrier did not fail";
  } catch (const PeerError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 4 stopped the shared memory "
                                    "collectives: waited for rank 7"));
  }
}

TEST(SharedMemoryGroupTest, DifferentCallsNeverExchangeData) {
  InMemoryStore store;
  auto groups = MakeGroups(store, Ranks(2));
  std::vector<std::string> errors(2);
  float value = 1;
  OnThreads(2, [&](int r) {
    try {
      if (r == 0) {
        groups[0]->Barrier(CallNumber(4, milliseconds(300)));
      } else {
        groups[1]->Allreduce(CallNumber(4, milliseconds(300)), &value, 1,
                             DType::kFloat32, ReduceOp::kSum);
      }
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  // One times out seeing the other in a different call; the other fails
  // with it.
  const std::string all = errors[0] + " | " + errors[1];
  EXPECT_THAT(all, HasSubstr("(which is in a different collective)"));
  EXPECT_FALSE(errors[0].empty());
  EXPECT_FALSE(errors[1].empty());
  EXPECT_EQ(value, 1);
}

// Chunks of up to 48 bytes per rank travel in the ranks' mailbox lines,
// larger ones in the slots, and a rank reuses either once every rank has
// posted the next chunk. Sizes on both sides of the line, uneven per rank,
// with ranks racing ahead of one another, must give exact results.
TEST(SharedMemoryGroupTest, SmallAndLargeChunksInterleaveExactly) {
  InMemoryStore store;
  constexpr int kRanks = 3;
  auto groups = MakeGroups(store, Ranks(kRanks));
  std::vector<std::string> failures(kRanks);
  OnThreads(kRanks, [&](int r) {
    SharedMemoryGroup& group = *groups[r];
    uint64_t sequence = 1;
    auto fail = [&](const std::string& what, int round) {
      if (failures[r].empty()) {
        failures[r] = what + " in round " + std::to_string(round);
      }
    };
    for (int round = 0; round < 300; ++round) {
      // One rank at a time lags, so the others start the next chunks early.
      if (round % kRanks == r && round % 7 == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      // Allgatherv: per-rank sizes around 48 bytes, different each round.
      const size_t base = 46 + static_cast<size_t>(round % 5);  // 46..50
      std::vector<size_t> bytes(kRanks), offsets(kRanks);
      size_t total = 0;
      for (int q = 0; q < kRanks; ++q) {
        bytes[q] = base + static_cast<size_t>(q) - 1;
        offsets[q] = total;
        total += bytes[q];
      }
      std::vector<char> in(bytes[r]);
      for (size_t i = 0; i < in.size(); ++i) {
        in[i] = static_cast<char>(r * 31 + round + i);
      }
      std::vector<char> out(total);
      group.Allgatherv(CallNumber(sequence++), in.data(), out.data(), bytes,
                       offsets);
      for (int q = 0; q < kRanks; ++q) {
        for (size_t i = 0; i < bytes[q]; ++i) {
          if (out[offsets[q] + i] != static_cast<char>(q * 31 + round + i)) {
            fail("allgatherv of " + std::to_string(bytes[q]) +
                     " bytes from local rank " + std::to_string(q),
                 round);
          }
        }
      }
      // Allreduce of 12 (48 bytes) or 13 floats.
      const size_t count = 12 + static_cast<size_t>(round % 2);
      std::vector<float> values(count);
      for (size_t i = 0; i < count; ++i) values[i] = float(r + 1) * (i + 1);
      group.Allreduce(CallNumber(sequence++), values.data(), count,
                      DType::kFloat32, ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) {
        if (values[i] != 6.0f * (i + 1)) {
          fail("allreduce of " + std::to_string(count) + " floats", round);
        }
      }
      // Broadcast of 48 or 49 bytes from a rotating root.
      const int root = round % kRanks;
      std::vector<char> message(48 + round % 2,
                                static_cast<char>(r == root ? round : -1));
      group.Broadcast(CallNumber(sequence++), message.data(), message.size(),
                      root);
      for (char c : message) {
        if (c != static_cast<char>(round)) fail("broadcast", round);
      }
      group.Barrier(CallNumber(sequence++));
    }
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
}

TEST(SharedMemoryGroupTest, SleepingRanksLeaveTheCpusIdle) {
  InMemoryStore store;
  auto groups = MakeGroups(store, Ranks(2));
  timespec cpu_before{}, cpu_after{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu_before);
  std::thread waiter([&] { groups[0]->Barrier(CallNumber(4)); });
  std::this_thread::sleep_for(milliseconds(500));
  groups[1]->Barrier(CallNumber(4));
  waiter.join();
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu_after);
  const double cpu = (cpu_after.tv_sec - cpu_before.tv_sec) +
                     (cpu_after.tv_nsec - cpu_before.tv_nsec) / 1e9;
  // Spinning through the wait would cost 0.5 s of CPU; generous margin.
  EXPECT_LT(cpu, 0.25);
}

std::vector<std::string> DevShmEntries() {
  std::vector<std::string> names;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir)) names.push_back(entry->d_name);
    closedir(dir);
  }
  return names;
}

TEST(SharedMemoryGroupTest, AKilledRankLeavesNothingBehind) {
  const auto before = DevShmEntries();
  int port_pipe[2];
  ASSERT_EQ(pipe(port_pipe), 0);
  // Forked before this test starts any thread.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(port_pipe[1]);
    int port = 0;
    if (read(port_pipe[0], &port, sizeof(port)) != sizeof(port)) _exit(3);
    TcpStoreOptions options;
    options.rank = 1;
    TcpStore store("127.0.0.1", port, options);
    SharedMemoryGroup group(1, Ranks(2), store, kTimeout);
    group.Barrier(CallNumber(4));
    raise(SIGKILL);
    _exit(4);
  }
  close(port_pipe[0]);
  TcpStoreServer server(TcpStoreServerOptions{});
  const int port = server.port();
  ASSERT_EQ(write(port_pipe[1], &port, sizeof(port)),
            static_cast<ssize_t>(sizeof(port)));
  close(port_pipe[1]);
  TcpStoreOptions options;
  options.rank = 0;
  TcpStore store("127.0.0.1", port, options);
  SharedMemoryGroup group(0, Ranks(2), store, kTimeout);
  group.Barrier(CallNumber(4));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  try {
    group.Barrier(CallNumber(5, milliseconds(300)));
    ADD_FAILURE() << "a barrier with a dead rank did not fail";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("waited for rank 1"));
  }
  // The memory has no name to leak: nothing new in /dev/shm, and the
  // mapping is of a file already gone from every directory.
  EXPECT_EQ(DevShmEntries(), before);
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("/memfd:accel-shm (deleted)"));
}

}  // namespace
}  // namespace accel
