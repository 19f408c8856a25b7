// Trains one epoch over 64 numbered samples and says which it trained (as
// gather_for_metrics gives them), saving and stopping after
// --save_after_steps, or resuming from --dir: the same epoch at another
// number of processes must take every sample exactly once.
//
//   resume_worker --num_processes=2 --save_after_steps=3 --dir=/tmp/ck
//   resume_worker --num_processes=3 --resume --dir=/tmp/ck
//   resume_worker --num_processes=2 --reload_rounds=3 --dir=/tmp/ck
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <sstream>

#include "accel/accelerator.h"
#include "accel/runtime/launch/program.h"

DEFINE_int32(save_after_steps, -1, "Save and stop after this many steps.");
DEFINE_bool(resume, false, "Load --dir first.");
DEFINE_string(dir, "", "The checkpoint folder.");
DEFINE_int32(batch_size, 4, "Per process, or global with --split_batches.");
DEFINE_bool(split_batches, false, "Accelerate's split_batches.");
DEFINE_int32(samples, 64, "Samples in the data set.");
DEFINE_int32(reload_rounds, 0,
             "Before training, save_state(--dir) and at once load_state(--dir) "
             "this many times (as Accelerate's DeepSpeed example keeps its "
             "best checkpoint).");
DEFINE_int64(ballast, 0,
             "Floats of a registered tensor that the main process saves: a "
             "shared file that takes a while to write.");

namespace {

struct Ballast {
  torch::Tensor values;
  void save(torch::serialize::OutputArchive& archive) const {
    archive.write("values", values);
  }
  void load(torch::serialize::InputArchive& archive) {
    archive.read("values", values);
  }
};

class Numbered {
 public:
  torch::data::Example<> get(size_t i) {
    return {torch::full({1}, static_cast<float>(i)),
            torch::tensor(static_cast<int64_t>(i))};
  }
  size_t size() const { return static_cast<size_t>(FLAGS_samples); }
};

int Main(int argc, char** argv) {
  accel::AcceleratorOptions options = accel::AcceleratorOptions::FromFlags();
  options.dataloader_config.split_batches = FLAGS_split_batches;
  accel::Accelerator accelerator(options);
  // A Sequential, so that under --zero_stage=3 its layer is a unit.
  torch::nn::Sequential model(torch::nn::Linear(1, 1));
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01));
  accel::DataLoaderOptions loader_options;
  loader_options.batch_size = static_cast<size_t>(FLAGS_batch_size);
  loader_options.shuffle = true;
  loader_options.seed = 7;
  accel::DataLoader<Numbered> data(Numbered(), loader_options);
  auto [net, optimizer, loader] = accelerator.prepare(model, sgd, data);
  Ballast ballast{torch::rand({FLAGS_ballast})};
  if (FLAGS_ballast > 0) accelerator.register_for_checkpointing(ballast);
  for (int round = 0; round < FLAGS_reload_rounds; ++round) {
    accelerator.save_state(FLAGS_dir);
    accelerator.load_state(FLAGS_dir);
  }
  if (FLAGS_resume) accelerator.load_state(FLAGS_dir);
  std::ostringstream trained;
  int steps = 0;
  for (auto& batch : loader) {
    accelerator.backward(net->forward(batch.data).pow(2).mean());
    optimizer.step();
    optimizer.zero_grad();
    const torch::Tensor ids = accelerator.gather_for_metrics(batch.target);
    for (int64_t i = 0; i < ids.numel(); ++i) {
      trained << " " << ids[i].item<int64_t>();
    }
    if (++steps == FLAGS_save_after_steps) {
      accelerator.save_state(FLAGS_dir);
      break;
    }
  }
  accelerator.print("trained:" + trained.str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  accel::InitProgram(&argc, &argv);
  return accel::RunAndReportErrors(Main, argc, argv);
}
