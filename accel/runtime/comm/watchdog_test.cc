// The watchdog on its own, over an in-memory store and a fake transport:
// what it publishes, and what it aborts for.
#include "accel/runtime/comm/watchdog.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/store/store.h"

namespace accel {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

// Records departures as a TCP store would, in memory.
class DeparturesStore : public InMemoryStore {
 public:
  std::map<int, Departure> departures() override { return departed; }
  std::map<int, Departure> departed;
};

BackendContext Context(int rank, int size, bool checks = true) {
  BackendContext context;
  context.rank = rank;
  context.size = size;
  context.options.check_collectives = checks;
  context.options.status_interval = milliseconds(10);
  context.options.heartbeat_interval = milliseconds(20);
  context.options.check_after = milliseconds(50);
  return context;
}

Transport::Op MakeOp(uint64_t sequence, const char* api,
                     const std::string& signature) {
  Transport::Op op{};
  op.name = "allreduce";
  op.sequence = sequence;
  op.timeout = milliseconds(2000);
  op.api = api;
  op.site = CallSite{"train.cc", 75};
  op.signature = signature;
  return op;
}

// The fake transport: waits until the watchdog aborts it, at most 5 s.
struct FakeTransport {
  std::atomic<bool> aborted{false};
  bool WaitForAbort() {
    for (int i = 0; i < 500 && !aborted; ++i) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    return aborted;
  }
};

TEST(WatchdogTest, AnotherCollectiveOnAnotherRankAbortsWithBothNamed) {
  auto store = std::make_shared<DeparturesStore>();
  FakeTransport fake0, fake1;
  Watchdog rank0(Context(0, 2), store, [&] { fake0.aborted = true; });
  Watchdog rank1(Context(1, 2), store, [&] { fake1.aborted = true; });
  const Transport::Op barrier = MakeOp(3, "wait_for_everyone", "barrier");
  const Transport::Op gather = MakeOp(3, "gather", "allgather uint8 x 1024");
  rank0.Running(barrier);
  rank1.Running(gather);
  ASSERT_TRUE(fake0.WaitForAbort());
  ASSERT_TRUE(fake1.WaitForAbort());
  const auto verdict = rank0.TakeVerdict();
  ASSERT_TRUE(verdict.has_value());
  EXPECT_EQ(verdict->kind, Watchdog::Verdict::Kind::kMismatch);
  EXPECT_EQ(verdict->reason,
            "ranks called different collectives: rank 1 is in gather #3 "
            "(train.cc:75) [allgather uint8 x 1024] while rank 0 waits in "
            "wait_for_everyone #3 (train.cc:75) [barrier]");
  EXPECT_FALSE(rank0.TakeVerdict().has_value());  // Taken once.
}

TEST(WatchdogTest, WithChecksOffAMismatchIsNotTheWatchdogsBusiness) {
  auto store = std::make_shared<DeparturesStore>();
  FakeTransport fake;
  Watchdog rank0(Context(0, 2, /*checks=*/false), store,
                 [&] { fake.aborted = true; });
  Watchdog rank1(Context(1, 2, /*checks=*/false), store, [] {});
  rank0.Running(MakeOp(1, "wait_for_everyone", "barrier"));
  rank1.Running(MakeOp(1, "gather", "allgather uint8 x 1024"));
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_FALSE(fake.aborted);
}

TEST(WatchdogTest, ARankThatLeftAbortsNamingHowItLeft) {
  auto store = std::make_shared<DeparturesStore>();
  store->departed[1] = {Departure::Kind::kCrashed, ""};
  FakeTransport fake;
  Watchdog rank0(Context(0, 2), store, [&] { fake.aborted = true; });
  rank0.Running(MakeOp(5, "backward", "allreduce sum float32 x 418"));
  ASSERT_TRUE(fake.WaitForAbort());
  const auto verdict = rank0.TakeVerdict();
  ASSERT_TRUE(verdict.has_value());
  EXPECT_EQ(verdict->kind, Watchdog::Verdict::Kind::kDeparted);
  EXPECT_EQ(verdict->rank, 1);
  EXPECT_THAT(verdict->reason,
              HasSubstr("rank 1 crashed (its process left the job)"));
}

TEST(WatchdogTest, ATimeoutIsDiagnosedWithWhatEachRankDoes) {
  auto store = std::make_shared<DeparturesStore>();
  Watchdog rank0(Context(0, 2), store, [] {});
  Watchdog rank1(Context(1, 2), store, [] {});
  const Transport::Op gather = MakeOp(4, "gather", "allgather uint8 x 8");
  rank1.Running(MakeOp(3, "gather", "allgather uint8 x 8"));
  rank1.Finished(MakeOp(3, "gather", "allgather uint8 x 8"), true);
  rank0.Running(gather);
  std::this_thread::sleep_for(milliseconds(100));  // Both have published.
  rank0.Finished(gather, false);
  const std::exception_ptr error =
      rank0.Diagnose("[fake] rank 0/2: gather #4 (train.cc:75): ", gather,
                     TimeoutError("no data"));
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("timed out after 2000 ms: rank 1 is not "
                                    "in a collective (its last was gather "
                                    "#3 (train.cc:75))"));
  }
}

}  // namespace
}  // namespace accel
