// The data loader on its own: sample types and collate functions, sharding
// with even_batches, worker threads, and where a pass stands (the position
// that checkpoints record and skip_first_batches sets).
#include "accel/data/data_loader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace accel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Sample i is the tensor [i]; no torch Dataset base class, size() as size_t.
class Numbers {
 public:
  explicit Numbers(size_t n, std::chrono::milliseconds delay = {})
      : n_(n), delay_(delay) {}
  torch::Tensor get(size_t i) {
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    if (i == fail_at_)
      throw UsageError("sample " + std::to_string(i) + " is bad");
    ++calls_;
    return torch::tensor({static_cast<int64_t>(i)});
  }
  size_t size() const { return n_; }

  Numbers(const Numbers& other)
      : n_(other.n_), delay_(other.delay_), fail_at_(other.fail_at_) {}

 private:
  size_t n_;
  std::chrono::milliseconds delay_;

 public:
  size_t fail_at_ = static_cast<size_t>(-1);
  std::atomic<int> calls_{0};
};

class Pairs : public torch::data::datasets::Dataset<Pairs> {
 public:
  torch::data::Example<> get(size_t i) override {
    return {torch::full({2}, static_cast<float>(i)),
            torch::tensor(static_cast<int64_t>(i % 3))};
  }
  torch::optional<size_t> size() const override { return 5; }
};

class Named {
 public:
  std::map<std::string, torch::Tensor> get(size_t i) {
    return {{"ids", torch::full({3}, static_cast<int64_t>(i))},
            {"mask", torch::ones({3}, torch::kBool)}};
  }
  size_t size() const { return 4; }
};

class Words {
 public:
  std::string get(size_t i) { return "word" + std::to_string(i); }
  size_t size() const { return 5; }
};

DataLoaderOptions Batch(size_t size) {
  DataLoaderOptions options;
  options.batch_size = size;
  return options;
}

// The first element of each sample of each batch of one pass.
template <typename Loader>
std::vector<std::vector<int64_t>> Drain(Loader& loader) {
  std::vector<std::vector<int64_t>> seen;
  for (auto& batch : loader) {
    torch::Tensor flat = batch.reshape({-1});
    seen.emplace_back(flat.template data_ptr<int64_t>(),
                      flat.template data_ptr<int64_t>() + flat.numel());
  }
  return seen;
}

TEST(DataLoaderTest, StacksExamplesTensorsAndMapsByDefault) {
  DataLoader<Pairs> pairs(Pairs(), Batch(2));
  std::vector<int64_t> sizes;
  for (auto& batch : pairs) {
    EXPECT_EQ(batch.data.size(1), 2);
    sizes.push_back(batch.target.size(0));
  }
  EXPECT_THAT(sizes, ElementsAre(2, 2, 1));

  DataLoader<Named> named(Named(), Batch(3));
  for (auto& batch : named) {
    EXPECT_EQ(batch.at("ids").dim(), 2);
    EXPECT_EQ(batch.at("mask").scalar_type(), torch::kBool);
  }
  DataLoader<Numbers> numbers(Numbers(5), Batch(2));
  EXPECT_THAT(Drain(numbers), ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3),
                                          ElementsAre(4)));
}

TEST(DataLoaderTest, CollateFunctionMakesAnyBatchType) {
  DataLoader<Words, std::string> words(
      Words(), Batch(2), [](std::vector<std::string> samples) {
        std::string joined;
        for (auto& s : samples) joined += (joined.empty() ? "" : " ") + s;
        return joined;
      });
  std::vector<std::string> batches;
  for (auto& batch : words) batches.push_back(batch);
  EXPECT_THAT(batches, ElementsAre("word0 word1", "word2 word3", "word4"));
}

TEST(DataLoaderTest, ShardsWithEvenBatchesAsAccelerate) {
  // 22 samples, batch 4: 2 ranks pad to 24 (samples 0, 1 again), 3 ranks too.
  DataLoader<Numbers> loader(Numbers(22), Batch(4));
  auto rank1 = loader.Shard(1, 2, torch::kCPU);
  EXPECT_EQ(rank1.size(), 3u);
  EXPECT_THAT(Drain(rank1),
              ElementsAre(ElementsAre(4, 5, 6, 7), ElementsAre(12, 13, 14, 15),
                          ElementsAre(20, 21, 0, 1)));
  auto rank2 = loader.Shard(2, 3, torch::kCPU);
  EXPECT_THAT(Drain(rank2), ElementsAre(ElementsAre(8, 9, 10, 11),
                                        ElementsAre(20, 21, 0, 1)));
  // One process is never padded; its last batch is short.
  auto alone = loader.Shard(0, 1, torch::kCPU);
  EXPECT_EQ(Drain(alone).back(), (std::vector<int64_t>{20, 21}));
  // split_batches: the global batch of 4 becomes 2 per rank.
  DataLoaderOptions split = Batch(4);
  split.split_batches = true;
  DataLoader<Numbers> global(Numbers(8), split);
  EXPECT_THAT(Drain(*std::make_unique<DataLoader<Numbers>>(
                  global.Shard(1, 2, torch::kCPU))),
              ElementsAre(ElementsAre(2, 3), ElementsAre(6, 7)));
  EXPECT_THROW(global.Shard(0, 3, torch::kCPU), UsageError);
}

TEST(DataLoaderTest, WorkersGiveTheSameBatchesInOrder) {
  DataLoaderOptions options = Batch(3);
  options.shuffle = true;
  options.seed = 9;
  DataLoader<Numbers> serial(Numbers(40), options);
  options.num_workers = 3;
  DataLoader<Numbers> parallel(Numbers(40, std::chrono::milliseconds(1)),
                               options);
  for (int epoch = 0; epoch < 2; ++epoch) {
    EXPECT_EQ(Drain(parallel), Drain(serial)) << "epoch " << epoch;
  }
}

TEST(DataLoaderTest, WorkersReportAFailingSampleAtItsBatch) {
  Numbers broken(10);
  broken.fail_at_ = 7;
  DataLoaderOptions options = Batch(2);
  options.num_workers = 2;
  DataLoader<Numbers> loader(broken, options);
  int good = 0;
  try {
    for (auto& batch : loader) {
      (void)batch;
      ++good;
    }
    ADD_FAILURE() << "no error";
  } catch (const DataError& e) {
    // Where it happened, and the data set's own exception inside.
    EXPECT_STREQ(e.what(),
                 "DataLoader: the data set's get(7) in epoch 0: sample 7 is "
                 "bad");
    EXPECT_THROW(std::rethrow_if_nested(e), UsageError);
  }
  EXPECT_EQ(good, 3);  // Batches [0,1] [2,3] [4,5]; [6,7] fails.
  // A collate function's failure names the batch's samples.
  DataLoader<Numbers, torch::Tensor> ragged(
      Numbers(4), Batch(2), [](std::vector<torch::Tensor> samples) {
        samples.back() = torch::zeros({3});
        return torch::stack(samples);
      });
  EXPECT_THAT([&] { Drain(ragged); },
              ::testing::ThrowsMessage<DataError>(::testing::AllOf(
                  HasSubstr("DataLoader: collating the batch of samples 0, 1 "
                            "in epoch 0: stack expects each tensor to be "
                            "equal size"),
                  ::testing::Not(HasSubstr("Exception raised from")))));
}

TEST(DataLoaderTest, LeavingALoopEarlyStopsTheWorkers) {
  DataLoaderOptions options = Batch(1);
  options.num_workers = 2;
  options.prefetch_factor = 1;
  DataLoader<Numbers> loader(Numbers(1000), options);
  for (auto& batch : loader) {
    (void)batch;
    break;
  }
  // At most a few batches were made ahead, not the whole epoch.
  EXPECT_LE(loader.dataset().calls_.load(), 4);
  // And the next loop starts the next epoch cleanly.
  int count = 0;
  for (auto& batch : loader) {
    (void)batch;
    if (++count == 3) break;
  }
  EXPECT_EQ(count, 3);
}

TEST(DataLoaderTest, PositionInsideAnEpochIsRecordedAndResumed) {
  DataLoaderOptions options = Batch(2);
  options.shuffle = true;
  options.seed = 4;
  DataLoader<Numbers> reference(Numbers(12), options);
  const auto epoch0 = Drain(reference);
  const auto epoch1 = Drain(reference);

  DataLoader<Numbers> loader(Numbers(12), options);
  std::vector<std::vector<int64_t>> seen;
  for (auto& batch : loader) {
    seen.push_back({batch[0].item<int64_t>(), batch[1].item<int64_t>()});
    if (seen.size() == 4) break;
  }
  const auto [epoch, done] = loader.state()->Checkpoint();
  EXPECT_EQ(epoch, 0);
  EXPECT_EQ(done, 8);  // Samples: 4 batches of 2.

  DataLoader<Numbers> resumed(Numbers(12), options);
  resumed.state()->Restore(epoch, done);
  // Python's len(): the whole epoch, also when resuming inside one.
  EXPECT_EQ(resumed.size(), 6u);
  EXPECT_EQ(resumed.batches_remaining(), 2u);  // What is left of it.
  EXPECT_EQ(resumed.batches_per_epoch(), 6u);
  std::vector<size_t> remaining;
  std::vector<std::vector<int64_t>> rest;
  for (auto& batch : resumed) {
    rest.push_back({batch[0].item<int64_t>(), batch[1].item<int64_t>()});
    remaining.push_back(resumed.batches_remaining());
    EXPECT_EQ(resumed.size(), 6u);
  }
  EXPECT_THAT(remaining, ElementsAre(1u, 0u));
  EXPECT_EQ(resumed.size(), 6u);
  EXPECT_EQ(resumed.batches_remaining(), 6u);  // The next epoch, whole.
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0], epoch0[4]);
  EXPECT_EQ(rest[1], epoch0[5]);
  EXPECT_EQ(Drain(resumed), epoch1);
  // A finished epoch records the next one from its start.
  EXPECT_EQ(resumed.state()->Checkpoint(),
            std::make_pair(int64_t{2}, int64_t{0}));
}

TEST(DataLoaderTest, SkipFirstBatchesSkipsOnlyTheNextPass) {
  DataLoader<Numbers> loader(Numbers(8), Batch(2));
  auto skipping = loader.SkipFirstBatches(3);
  // As Accelerate's skipped loader: len() is what the pass gives.
  EXPECT_EQ(skipping.size(), 1u);
  EXPECT_EQ(skipping.batches_remaining(), 1u);
  EXPECT_THAT(Drain(skipping), ElementsAre(ElementsAre(6, 7)));
  EXPECT_EQ(skipping.size(), 4u);
  EXPECT_EQ(Drain(skipping).size(), 4u);
  EXPECT_EQ(loader.size(), 4u);
  EXPECT_THROW(loader.SkipFirstBatches(-1), UsageError);
  auto past_the_end = loader.SkipFirstBatches(10);
  EXPECT_TRUE(Drain(past_the_end).empty());
}

TEST(DataLoaderTest, TellsTheGradientStateAboutItsLastBatch) {
  auto state = std::make_shared<GradientState>();
  DataLoader<Numbers> data(Numbers(22), Batch(4));
  auto loader = data.Shard(0, 2, torch::kCPU, state);
  auto inner_data = DataLoader<Numbers>(Numbers(3), Batch(2));
  auto inner = inner_data.Shard(0, 1, torch::kCPU, state);
  std::vector<bool> at_end;
  for (auto& batch : loader) {
    (void)batch;
    at_end.push_back(state->end_of_dataloader());
    EXPECT_EQ(state->remainder(), 22 % 8);
    // A nested loop (evaluation) counts while it runs, then the outer again.
    for (auto& inner_batch : inner) {
      (void)inner_batch;
    }
    EXPECT_EQ(state->end_of_dataloader(), at_end.back());
  }
  EXPECT_THAT(at_end, ElementsAre(false, false, true));
  EXPECT_FALSE(state->in_dataloader());
}

// Every sample a run of `processes` ranks takes in one epoch, resumed from
// `done` samples of it: each rank's batches, flattened, in step order.
std::vector<int64_t> RestOfEpoch(const DataLoaderOptions& options,
                                 size_t dataset, int processes, int64_t done,
                                 int64_t* remainder) {
  std::vector<std::vector<std::vector<int64_t>>> per_rank;
  auto gradients = std::make_shared<GradientState>();
  for (int rank = 0; rank < processes; ++rank) {
    DataLoader<Numbers> data(Numbers(dataset), options);
    auto loader = data.Shard(rank, processes, torch::kCPU, gradients);
    loader.state()->Restore(0, done);
    per_rank.emplace_back();
    for (auto& batch : loader) {
      per_rank.back().emplace_back();
      for (int64_t i = 0; i < batch.size(0); ++i) {
        per_rank.back().back().push_back(batch[i][0].item<int64_t>());
      }
      // What gather_for_metrics keeps of the last batch.
      if (gradients->end_of_dataloader()) *remainder = gradients->remainder();
    }
  }
  std::vector<int64_t> samples;
  for (size_t step = 0; step < per_rank[0].size(); ++step) {
    for (int rank = 0; rank < processes; ++rank) {
      EXPECT_EQ(per_rank[rank].size(), per_rank[0].size()) << "rank " << rank;
      if (step < per_rank[rank].size()) {
        for (int64_t i : per_rank[rank][step]) samples.push_back(i);
      }
    }
  }
  return samples;
}

TEST(DataLoaderTest, AnEpochResumesAtAnyNumberOfProcessesSampleForSample) {
  for (const bool split : {false, true}) {
    for (const size_t dataset : {64u, 30u}) {
      for (int saved_at = 1; saved_at <= 3; ++saved_at) {
        for (int resumed_at = 1; resumed_at <= 4; ++resumed_at) {
          DataLoaderOptions options = Batch(split ? 12 : 4);
          options.shuffle = true;
          options.seed = 3;
          options.split_batches = split;
          // One step at `saved_at` processes, then a checkpoint.
          DataLoader<Numbers> data(Numbers(dataset), options);
          std::vector<int64_t> before;
          int64_t done = 0;
          for (int rank = 0; rank < saved_at; ++rank) {
            auto loader = data.Shard(rank, saved_at, torch::kCPU);
            for (auto& batch : loader) {
              for (int64_t i = 0; i < batch.size(0); ++i) {
                before.push_back(batch[i][0].item<int64_t>());
              }
              break;
            }
            if (rank == 0) done = loader.state()->Checkpoint().second;
          }
          const std::string where =
              (split ? "split, " : "") + std::to_string(dataset) +
              " samples, saved at " + std::to_string(saved_at) +
              " resumed at " + std::to_string(resumed_at);
          EXPECT_EQ(done, static_cast<int64_t>(before.size())) << where;
          int64_t remainder = -1;
          const std::vector<int64_t> after =
              RestOfEpoch(options, dataset, resumed_at, done, &remainder);
          // The uninterrupted epoch's order, at one process.
          DataLoader<Numbers> whole(Numbers(dataset), options);
          std::vector<int64_t> order;
          for (const auto& batch : Drain(whole)) {
            order.insert(order.end(), batch.begin(), batch.end());
          }
          std::vector<int64_t> trained = before;
          trained.insert(trained.end(), after.begin(), after.end());
          // Every sample once in the epoch's order, then even_batches'
          // padding: samples from the start of the order again.
          ASSERT_GE(trained.size(), dataset) << where;
          EXPECT_EQ(
              std::vector<int64_t>(trained.begin(), trained.begin() + dataset),
              order)
              << where;
          const size_t padding = trained.size() - dataset;
          EXPECT_EQ(
              std::vector<int64_t>(trained.begin() + dataset, trained.end()),
              std::vector<int64_t>(order.begin(), order.begin() + padding))
              << where;
          // What gather_for_metrics keeps of the last batch drops exactly
          // the padding.
          const int64_t last_batch = static_cast<int64_t>(
              split ? 12 : 4 * static_cast<size_t>(resumed_at));
          if (padding > 0) {
            EXPECT_EQ(remainder, last_batch - static_cast<int64_t>(padding))
                << where;
          }
        }
      }
    }
  }
}

// Sample i is a random number from the generator the loader gives it.
class Noisy {
 public:
  torch::Tensor get(size_t i, at::Generator& generator) {
    return torch::rand({2}, generator) + static_cast<double>(i);
  }
  size_t size() const { return 20; }
};

// The same, drawing from data::SampleGenerator() itself.
class NoisyWithoutArgument {
 public:
  torch::Tensor get(size_t i) {
    return torch::rand({2}, data::SampleGenerator()) + static_cast<double>(i);
  }
  size_t size() const { return 20; }
};

template <typename Dataset>
std::vector<torch::Tensor> TwoEpochs(size_t workers, uint64_t seed) {
  DataLoaderOptions options = Batch(3);
  options.shuffle = true;
  options.seed = seed;
  options.num_workers = workers;
  DataLoader<Dataset> loader(Dataset(), options);
  std::vector<torch::Tensor> batches;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (auto& batch : loader) batches.push_back(batch.clone());
  }
  return batches;
}

bool Equal(const std::vector<torch::Tensor>& a,
           const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

TEST(DataLoaderTest, RandomAugmentationIsTheSameWhateverTheWorkers) {
  const auto reference = TwoEpochs<Noisy>(0, 11);
  for (size_t workers : {0u, 1u, 3u}) {
    for (int run = 0; run < 3; ++run) {
      EXPECT_TRUE(Equal(TwoEpochs<Noisy>(workers, 11), reference))
          << workers << " workers, run " << run;
      EXPECT_TRUE(
          Equal(TwoEpochs<NoisyWithoutArgument>(workers, 11), reference))
          << workers << " workers, run " << run;
    }
  }
  // Another seed draws other numbers, and so does the next epoch.
  EXPECT_FALSE(Equal(TwoEpochs<Noisy>(2, 12), reference));
  const torch::Tensor first = reference[0].frac();
  bool differs = false;
  for (size_t b = 7; b < reference.size(); ++b) {
    for (int64_t i = 0; i < reference[b].size(0); ++i) {
      for (int64_t j = 0; j < first.size(0); ++j) {
        if (std::floor(reference[b][i][0].item<double>()) ==
            std::floor(reference[0][j][0].item<double>())) {
          differs |= !torch::equal(reference[b][i].frac(), first[j]);
        }
      }
    }
  }
  EXPECT_TRUE(differs) << "a sample drew the same numbers in both epochs";
}

TEST(DataLoaderTest, RejectsBadOptions) {
  EXPECT_THROW(DataLoader<Numbers>(Numbers(3), Batch(0)), UsageError);
}

}  // namespace
}  // namespace accel
