// The handwritten digits that Debian's python3-sklearn ships
// (sklearn/datasets/data/digits.csv.gz: 1,797 8x8 images of 0-16 grey
// levels, a label each), split into fixed training and test sets, and as a
// torch dataset that augments the training images.
//
//   accel_examples::DigitSplits digits =
//       accel_examples::ReadDigits(accel_examples::FindDigits(""));
//   accel_examples::Digits train(digits.train, /*augment=*/true, /*seed=*/42);
//   train.set_epoch(1);          // before each epoch: new, reproducible shifts
//   torch::data::Example<> x = train.get(0);  // [1, 8, 8] float, label
//
// Augmentation shifts an image by up to one pixel each way; the shift of
// sample i in epoch e depends on (seed, e, i) only, so it is the same in any
// loader worker thread and at any process count.
#pragma once

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>
#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace accel_examples {

inline constexpr char kDigitsPath[] =
    "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";

struct DigitSet {
  torch::Tensor images;  // [n, 1, 8, 8] float in [0, 1].
  torch::Tensor labels;  // [n] int64.
};

struct DigitSplits {
  DigitSet train;
  DigitSet test;  // Every fifth image, in file order.
};

// `path` when given, else kDigitsPath; UsageError saying what to install
// when it is missing.
std::string FindDigits(const std::string& path);

// UsageError naming the file and line for a line that is not 64 grey levels
// and a label.
DigitSplits ReadDigits(const std::string& path);

class Digits : public torch::data::datasets::Dataset<Digits> {
 public:
  Digits(DigitSet set, bool augment, uint64_t seed)
      : set_(std::move(set)),
        augment_(augment),
        seed_(seed),
        epoch_(std::make_shared<std::atomic<int64_t>>(0)) {}
  // Safe from several loader threads at once.
  torch::data::Example<> get(size_t i) override;
  torch::optional<size_t> size() const override {
    return static_cast<size_t>(set_.labels.size(0));
  }
  // Shared by the copies a loader makes of the dataset.
  void set_epoch(int64_t epoch) { epoch_->store(epoch); }

 private:
  DigitSet set_;
  bool augment_;
  uint64_t seed_;
  std::shared_ptr<std::atomic<int64_t>> epoch_;
};

}  // namespace accel_examples
