// Accelerate's examples/by_feature/cross_validation.py in C++: k-fold cross
// validation. The training set is split into --num_folds stratified folds;
// each fold trains a fresh model on the others and evaluates on it, then
// predicts the test set (the evaluation set of the other examples), and the
// folds' averaged logits make the final predictions.
//
//   bazel run //examples/by_feature:cross_validation -- --num_processes=2
//       --num_folds=3
//
// The folds are scikit-learn's StratifiedKFold without shuffling in
// spirit (each class split into k contiguous parts), written here.
#include <vector>

#include "examples/by_feature/common.h"

DEFINE_int32(num_folds, 3, "The number of folds (at least 2).");

namespace {

struct Fold {
  std::vector<int64_t> train_idxs, valid_idxs;
};

// Each class's samples, in order, in num_folds contiguous parts; fold f
// validates on the f-th part of every class and trains on the rest.
std::vector<Fold> StratifiedKFold(const torch::Tensor& labels, int num_folds) {
  if (num_folds < 2) {
    throw accel::UsageError("--num_folds must be at least 2, found " +
                            std::to_string(num_folds));
  }
  const int64_t classes = labels.max().item<int64_t>() + 1;
  std::vector<std::vector<int64_t>> by_class(classes);
  for (int64_t i = 0; i < labels.size(0); ++i) {
    by_class[labels[i].item<int64_t>()].push_back(i);
  }
  for (int64_t c = 0; c < classes; ++c) {
    if (static_cast<int64_t>(by_class[c].size()) < num_folds) {
      throw accel::UsageError(
          "--num_folds=" + std::to_string(num_folds) + " is more than class " +
          std::to_string(c) + "'s " + std::to_string(by_class[c].size()) +
          " samples (every fold must validate on each class)");
    }
  }
  std::vector<Fold> folds(num_folds);
  for (const std::vector<int64_t>& members : by_class) {
    const size_t n = members.size();
    for (size_t i = 0; i < n; ++i) {
      const size_t fold = i * num_folds / n;
      for (int f = 0; f < num_folds; ++f) {
        auto& target = f == static_cast<int>(fold) ? folds[f].valid_idxs
                                                   : folds[f].train_idxs;
        target.push_back(members[i]);
      }
    }
  }
  return folds;
}

// get_fold_dataloaders: the fold's training and validation loaders, and
// the test set's.
std::vector<by_feature::Loader> GetFoldDataloaders(
    const accel_examples::Blobs& train, const accel_examples::Blobs& test,
    const Fold& fold, const by_feature::Config& config) {
  accel::DataLoaderOptions train_options;
  train_options.batch_size = static_cast<size_t>(config.batch_size);
  train_options.shuffle = true;
  train_options.seed = config.seed;
  accel::DataLoaderOptions eval_options;
  eval_options.batch_size = static_cast<size_t>(by_feature::kEvalBatchSize);
  return {by_feature::Loader(train.Select(fold.train_idxs), train_options),
          by_feature::Loader(train.Select(fold.valid_idxs), eval_options),
          by_feature::Loader(test, eval_options)};
}

int Main(int, char**) {
  accel::Accelerator accelerator(accel::AcceleratorOptions::FromFlags());
  const by_feature::Config config;
  const auto [train_set, test_set] = accel_examples::MakeBlobs(config.seed);
  const std::vector<Fold> folds =
      StratifiedKFold(train_set.labels(), FLAGS_num_folds);
  accelerator.set_seed(config.seed);
  std::vector<torch::Tensor> test_predictions;
  std::vector<torch::Tensor> test_references;
  for (size_t i = 0; i < folds.size(); ++i) {
    accelerator.print("fold", i, "- training on", folds[i].train_idxs.size(),
                      "samples, validating on", folds[i].valid_idxs.size());
    std::vector<by_feature::Loader> loaders =
        GetFoldDataloaders(train_set, test_set, folds[i], config);
    by_feature::Training training(accelerator, config,
                                  std::make_pair(loaders[0], loaders[1]));
    auto test_dataloader = accelerator.prepare(loaders[2]);
    by_feature::TrainAndEvaluate(accelerator, config, training);
    // New code: this fold's logits for the whole test set.
    auto& model = std::get<0>(training.prepared);
    std::vector<torch::Tensor> fold_predictions;
    for (auto& batch : test_dataloader) {
      torch::Tensor logits;
      {
        torch::NoGradGuard no_grad;
        logits = model->forward(batch).logits;
      }
      auto [predictions, references] =
          accelerator.gather_for_metrics({logits, batch.target});
      fold_predictions.push_back(predictions);
      if (i == 0) test_references.push_back(references);
    }
    test_predictions.push_back(torch::cat(fold_predictions, 0));
    // What this fold prepared goes before the next.
    accelerator.free_memory(model, std::get<1>(training.prepared));
  }
  // New code: the folds' average logits predict.
  const torch::Tensor preds =
      torch::stack(test_predictions, 0).sum(0).div(FLAGS_num_folds).argmax(-1);
  by_feature::Metric metric;
  metric.add_batch(preds, torch::cat(test_references, 0));
  accelerator.print("Average test metrics from all folds:",
                    metric.compute().ToString());
  accelerator.end_training();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return by_feature::RunScript(argc, argv, Main);
}
