// The examples' synthetic classification data: points around random
// centres, labelled by their centre, made from a seed, so every process
// makes the same samples without a download.
//
//   auto [train, eval] = accel_examples::MakeBlobs(/*seed=*/42);
//   accel::DataLoader<accel_examples::Blobs> loader(train, options);
//   accel_examples::Blobs fold = train.Select({0, 5, 7});
#pragma once

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>
#include <torch/types.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace accel_examples {

class Blobs : public torch::data::datasets::Dataset<Blobs> {
 public:
  Blobs(torch::Tensor inputs, torch::Tensor labels)
      : inputs_(std::move(inputs)), labels_(std::move(labels)) {}
  torch::data::Example<> get(size_t i) override {
    return {inputs_[i], labels_[i]};
  }
  torch::optional<size_t> size() const override { return inputs_.size(0); }

  // The samples at `indices`, in that order (datasets' select()).
  Blobs Select(const std::vector<int64_t>& indices) const {
    const torch::Tensor at = torch::tensor(indices, torch::kLong);
    return Blobs(inputs_.index_select(0, at), labels_.index_select(0, at));
  }
  const torch::Tensor& inputs() const { return inputs_; }
  const torch::Tensor& labels() const { return labels_; }

 private:
  torch::Tensor inputs_, labels_;
};

struct BlobsShape {
  int64_t train_samples = 240;  // Divisible by 12 = lcm of 1..4 * 3.
  int64_t eval_samples = 110;   // Not: gather_for_metrics matters.
  int64_t features = 16;
  int64_t classes = 3;
  double spread = 3.0;  // The noise's standard deviation.
};

// A training and an evaluation set around the same centres.
inline std::pair<Blobs, Blobs> MakeBlobs(uint64_t seed,
                                         const BlobsShape& shape = {}) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const torch::Tensor centres =
      torch::randn({shape.classes, shape.features}, generator) * 2;
  std::vector<Blobs> sets;
  for (int64_t n : {shape.train_samples, shape.eval_samples}) {
    torch::Tensor labels =
        torch::randint(0, shape.classes, {n}, generator, torch::kLong);
    torch::Tensor inputs =
        centres.index_select(0, labels) +
        torch::randn({n, shape.features}, generator) * shape.spread;
    sets.emplace_back(inputs, labels);
  }
  return {sets[0], sets[1]};
}

}  // namespace accel_examples
