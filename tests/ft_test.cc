// Fault tolerance without restarts (accel/runtime/ft), ranks as threads over
// a real TCP store and gloo: replicas fail at chosen steps and points (an
// event injector, as torchft's integration tests have), are restarted, and
// every replica must end with exactly the reference's parameters.
//
// The model: parameters are doubles holding integers, and each sample's
// gradient is an integer, so that any order of summing gives the same bits:
// the final parameters equal the reference (every step's whole global
// batch, each sample once) exactly when no sample was lost or counted twice
// and every replica applied the same committed steps.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/ft/replica.h"
#include "accel/runtime/store/tcp_store.h"

namespace accel::ft {
namespace {

using std::chrono::milliseconds;
using testing::HasSubstr;

constexpr int kParams = 16;
constexpr int kGlobalBatch = 12;
constexpr milliseconds kRestartAfter(300);
constexpr milliseconds kStepTime(20);

double Gradient(int64_t step, int sample, int param) {
  return static_cast<double>((step * 31 + sample * 17 + param * 7) % 11) - 5;
}

std::vector<double> Reference(int64_t steps) {
  std::vector<double> params(kParams);
  for (int p = 0; p < kParams; ++p) params[p] = 1000 + p;  // Rank 0's start.
  for (int64_t s = 0; s < steps; ++s) {
    for (int p = 0; p < kParams; ++p) {
      for (int j = 0; j < kGlobalBatch; ++j) params[p] -= Gradient(s, j, p);
    }
  }
  return params;
}

// A failure the injector makes: the replica's thread drops it as a killed
// process would drop everything.
struct Crash {};

struct Fault {
  int rank;
  int64_t step;
  Point point;
  bool restart = true;  // Start a replacement for the rank.
};

struct Outcome {
  std::vector<double> params;
  std::vector<std::vector<int>> history;
  int64_t retried = 0;
  int64_t with_fewer = 0;
  std::vector<Change> changes;
  std::string error;  // Set when the replica ended with an error.
  int incarnations = 0;
};

class Job {
 public:
  Job(int world_size, int64_t steps, std::vector<Fault> faults)
      : world_size_(world_size), steps_(steps), faults_(std::move(faults)) {
    TcpStoreServerOptions options;
    server_ = std::make_unique<TcpStoreServer>(options);
  }

  std::vector<Outcome> Run() {
    std::vector<Outcome> outcomes(world_size_);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world_size_; ++rank) {
      threads.emplace_back([&, rank] { RunRank(rank, &outcomes[rank]); });
    }
    for (auto& thread : threads) thread.join();
    return outcomes;
  }

 private:
  std::shared_ptr<Store> Connect(int rank) {
    TcpStoreOptions options;
    options.rank = rank;
    options.connect_timeout = milliseconds(5000);
    return std::make_shared<TcpStore>("127.0.0.1", server_->port(), options);
  }

  // One process of `rank` after another, as a launcher restarts them.
  void RunRank(int rank, Outcome* outcome) {
    for (;;) {
      ++outcome->incarnations;
      bool crashed = false;
      bool restart = false;
      try {
        RunIncarnation(rank, outcome, &restart);
        return;
      } catch (const Crash&) {
        crashed = true;
      } catch (const Error& e) {
        outcome->error = e.what();
        return;
      }
      if (crashed && !restart) return;
      // As a launcher takes to notice the loss and start a process: the
      // others go on without the rank for a step or more.
      std::this_thread::sleep_for(kRestartAfter);
    }
  }

  void RunIncarnation(int rank, Outcome* outcome, bool* restart) {
    std::vector<double> params(kParams);
    // Each replica starts elsewhere: the first quorum's state is rank 0's.
    for (int p = 0; p < kParams; ++p) params[p] = 1000 * (rank + 1) + p;
    ReplicaOptions options;
    options.rank = rank;
    options.world_size = world_size_;
    options.store = Connect(rank);
    options.communicator.timeout = milliseconds(10000);
    options.quorum_timeout = milliseconds(30000);
    options.save_state = [&] {
      return std::string(reinterpret_cast<const char*>(params.data()),
                         params.size() * sizeof(double));
    };
    options.load_state = [&](const std::string& state) {
      ASSERT_EQ(state.size(), params.size() * sizeof(double));
      std::memcpy(params.data(), state.data(), state.size());
    };
    options.inject = [&](Point point, int64_t step) {
      if (TakeFault(rank, step, point, restart)) throw Crash{};
    };
    if (rank == 0) options.lighthouse = LighthouseOptions{};
    Replica replica(options);
    while (replica.step() < steps_ && replica.StartStep()) {
      const int k = replica.quorum_size();
      const int i = replica.quorum_index();
      std::vector<double> grad(kParams, 0.0);
      for (int j = i * kGlobalBatch / k; j < (i + 1) * kGlobalBatch / k; ++j) {
        for (int p = 0; p < kParams; ++p) {
          grad[p] += Gradient(replica.step(), j, p);
        }
      }
      if (replica.AllreduceAndCommit(
              {{grad.data(), grad.size(), DType::kFloat64}})) {
        for (int p = 0; p < kParams; ++p) params[p] -= grad[p];
      }
      // As computing would: a replacement started later joins mid-run.
      std::this_thread::sleep_for(kStepTime);
    }
    outcome->params = params;
    outcome->history = replica.history();
    outcome->retried = replica.steps_retried();
    outcome->with_fewer = replica.steps_with_fewer();
    outcome->changes = replica.changes();
  }

  // Each fault fires once.
  bool TakeFault(int rank, int64_t step, Point point, bool* restart) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < faults_.size(); ++i) {
      const Fault& fault = faults_[i];
      // During recovery: the first at or after the step (a replacement
      // joins when its start lets it).
      const bool at = point == Point::kDuringRecovery ? step >= fault.step
                                                      : step == fault.step;
      if (fault.rank == rank && at && fault.point == point &&
          fired_.insert(i).second) {
        *restart = fault.restart;
        return true;
      }
    }
    return false;
  }

  const int world_size_;
  const int64_t steps_;
  std::unique_ptr<TcpStoreServer> server_;
  std::mutex mutex_;
  std::vector<Fault> faults_;
  std::set<size_t> fired_;
};

void ExpectExact(const std::vector<Outcome>& outcomes, int64_t steps) {
  const std::vector<double> reference = Reference(steps);
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    EXPECT_EQ(outcomes[rank].error, "") << "rank " << rank;
    EXPECT_EQ(outcomes[rank].params, reference) << "rank " << rank;
  }
  EXPECT_EQ(outcomes[0].history.size(), static_cast<size_t>(steps));
}

TEST(FaultToleranceTest, WithoutFailuresEveryStepHasEveryReplica) {
  Job job(4, 10, {});
  const std::vector<Outcome> outcomes = job.Run();
  ExpectExact(outcomes, 10);
  for (const auto& members : outcomes[0].history) {
    EXPECT_EQ(members, (std::vector<int>{0, 1, 2, 3}));
  }
  EXPECT_EQ(outcomes[0].retried, 0);
  EXPECT_EQ(outcomes[0].with_fewer, 0);
}

class FailureAtPoint : public testing::TestWithParam<Point> {};

TEST_P(FailureAtPoint, TheOthersGoOnAndTheReplacementCatchesUp) {
  const Point point = GetParam();
  Job job(4, 30, {{2, 5, point}});
  const std::vector<Outcome> outcomes = job.Run();
  ExpectExact(outcomes, 30);
  EXPECT_EQ(outcomes[2].incarnations, 2);
  const auto& history = outcomes[0].history;
  ASSERT_EQ(history.size(), 30u);
  for (int s = 0; s < 5; ++s) {
    EXPECT_EQ(history[s], (std::vector<int>{0, 1, 2, 3})) << "step " << s;
  }
  if (point == Point::kAfterAllreduce) {
    // Its sum completed everywhere: the step holds with it.
    EXPECT_EQ(history[5], (std::vector<int>{0, 1, 2, 3}));
  } else if (point == Point::kBeforeAllreduce) {
    EXPECT_EQ(history[5], (std::vector<int>{0, 1, 3}));
    EXPECT_EQ(outcomes[0].retried, 1);
  }
  // The replacement is back within a step or two.
  EXPECT_EQ(history.back(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_GE(outcomes[0].with_fewer, 1);
  EXPECT_LE(outcomes[0].with_fewer, 24);
  // The replacement received the job's history with the state.
  EXPECT_EQ(outcomes[2].history, history);
}

INSTANTIATE_TEST_SUITE_P(Points, FailureAtPoint,
                         testing::Values(Point::kBeforeAllreduce,
                                         Point::kDuringAllreduce,
                                         Point::kAfterAllreduce),
                         [](const testing::TestParamInfo<Point>& info) {
                           switch (info.param) {
                             case Point::kBeforeAllreduce:
                               return std::string("Before");
                             case Point::kDuringAllreduce:
                               return std::string("During");
                             default:
                               return std::string("After");
                           }
                         });

TEST(FaultToleranceTest, TwoFailuresInOneStep) {
  Job job(4, 30,
          {{1, 4, Point::kBeforeAllreduce}, {3, 4, Point::kBeforeAllreduce}});
  const std::vector<Outcome> outcomes = job.Run();
  ExpectExact(outcomes, 30);
  EXPECT_EQ(outcomes[0].history[4], (std::vector<int>{0, 2}));
  EXPECT_EQ(outcomes[0].history.back(), (std::vector<int>{0, 1, 2, 3}));
}

TEST(FaultToleranceTest, AFailureDuringRecoveryIsRecoveredFrom) {
  // Rank 2 fails at step 3; its replacement fails while the state is sent
  // (at whichever step it joins); the next one joins.
  Job job(4, 50,
          {{2, 3, Point::kBeforeAllreduce}, {2, 4, Point::kDuringRecovery}});
  const std::vector<Outcome> outcomes = job.Run();
  ExpectExact(outcomes, 50);
  EXPECT_EQ(outcomes[2].incarnations, 3);
  EXPECT_EQ(outcomes[0].history.back(), (std::vector<int>{0, 1, 2, 3}));
}

TEST(FaultToleranceTest, FewerThanHalfLeftStopsTheJob) {
  Job job(4, 30,
          {{1, 3, Point::kBeforeAllreduce, false},
           {2, 3, Point::kBeforeAllreduce, false},
           {3, 3, Point::kBeforeAllreduce, false}});
  const std::vector<Outcome> outcomes = job.Run();
  EXPECT_THAT(outcomes[0].error, HasSubstr("stopped the job at step 3"));
  EXPECT_THAT(outcomes[0].error,
              HasSubstr("only 1 of 4 replicas are left ([0]), fewer than 2"));
}

TEST(FaultToleranceTest, ChangesAreReportedWithTheirRanks) {
  Job job(3, 30, {{1, 3, Point::kBeforeAllreduce}});
  const std::vector<Outcome> outcomes = job.Run();
  ExpectExact(outcomes, 30);
  const auto& changes = outcomes[0].changes;
  ASSERT_GE(changes.size(), 3u);  // The first quorum, the loss, the join.
  EXPECT_EQ(changes[1].lost, (std::vector<int>{1}));
  EXPECT_EQ(changes[1].step, 3);
  EXPECT_EQ(changes[1].members, (std::vector<int>{0, 2}));
  EXPECT_EQ(changes.back().joined, (std::vector<int>{1}));
  EXPECT_LT(changes[1].seconds, 5.0);
}

}  // namespace
}  // namespace accel::ft
