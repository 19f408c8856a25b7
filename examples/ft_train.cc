// Data-parallel training that goes on through lost ranks
// (accel/fault_tolerance.h): an MLP the size of train_demo's, or the GPT of
// examples/gpt_model.h, on synthetic data that is a function of the step.
//
//   bazel-bin/tools/launch --num_processes=4 --fault_tolerance
//       --max_restarts=20 bazel-bin/examples/ft_train --steps=300  (one line)
//   kill -9 <a rank's pid, not rank 0's>    # the others train on
//
// Rank 0 can write the members of every committed step (--history_out) and
// the final parameters (--params_out); --replay=HISTORY computes them again
// in one process from that history, for a bit-for-bit comparison (the sum
// over the members in rank order, as one host's collectives add them).
#include <gflags/gflags.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "accel/fault_tolerance.h"
#include "accel/runtime/base/error_report.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/excerpt.h"
#include "accel/runtime/comm/process_group.h"
#include "examples/gpt_model.h"

DEFINE_string(model, "mlp", "mlp (train_demo's size) or gpt.");
DEFINE_int64(steps, 200, "Steps to train.");
DEFINE_int64(global_batch, 48, "Samples per step, split among the replicas.");
DEFINE_int64(hidden, 32, "The MLP's hidden width.");
DEFINE_int64(seed, 42, "Seed of the data and the weights.");
DEFINE_double(lr, 0.05, "SGD's learning rate (momentum 0.9).");
DEFINE_int32(sleep_per_step_ms, 0, "Extra time per step, as a larger model.");
DEFINE_bool(print_steps, false, "Rank 0 prints a line per committed step.");
DEFINE_string(history_out, "", "Rank 0 writes each step's members here.");
DEFINE_string(params_out, "", "Rank 0 writes the final parameters here.");
DEFINE_string(replay, "",
              "A --history_out file: train in this process along it.");
DEFINE_string(backend, "gloo", "The replicas' backend.");
DEFINE_string(report_to, "",
              "Trackers for the membership changes (jsonl, tensorboard).");
DEFINE_string(logging_dir, "ft_logs", "Where the trackers write.");
DEFINE_bool(fault_tolerance, true,
            "false: plain data parallelism over one communicator (the "
            "baseline of tools/ft/overhead.py), which stops at a failure.");

namespace {

constexpr int64_t kFeatures = 16;
constexpr int64_t kClasses = 4;
constexpr int64_t kSequence = 16;

struct Model {
  std::shared_ptr<torch::nn::Module> module;
  // The loss summed over samples [begin, end) of the step's global batch.
  std::function<torch::Tensor(int64_t step, int64_t begin, int64_t end)> loss;
};

// The step's whole global batch, the same on every replica.
torch::Generator StepGenerator(int64_t step) {
  return at::make_generator<at::CPUGeneratorImpl>(FLAGS_seed * 1000003 + step);
}

Model MakeMlp() {
  torch::manual_seed(FLAGS_seed);
  auto mlp = std::make_shared<torch::nn::SequentialImpl>(
      torch::nn::Linear(kFeatures, FLAGS_hidden), torch::nn::ReLU(),
      torch::nn::Linear(FLAGS_hidden, kClasses));
  const torch::Tensor teacher = torch::randn({kFeatures, kClasses});
  Model model;
  model.module = mlp;
  model.loss = [mlp, teacher](int64_t step, int64_t begin, int64_t end) {
    auto gen = StepGenerator(step);
    const torch::Tensor x =
        torch::randn({FLAGS_global_batch, kFeatures}, gen).slice(0, begin, end);
    const torch::Tensor y = x.matmul(teacher).argmax(1);
    return torch::nn::functional::cross_entropy(
        mlp->forward(x), y,
        torch::nn::functional::CrossEntropyFuncOptions().reduction(
            torch::kSum));
  };
  return model;
}

Model MakeGpt() {
  torch::manual_seed(FLAGS_seed);
  examples::GptConfig config;  // 4 layers of 64, vocabulary 64.
  auto gpt = examples::Gpt(config);
  Model model;
  model.module = gpt.ptr();
  model.loss = [gpt, config](int64_t step, int64_t begin, int64_t end) {
    auto gen = StepGenerator(step);
    // A sequence that counts up from a random start: learnable.
    const torch::Tensor start =
        torch::randint(config.vocab_size, {FLAGS_global_batch, 1}, gen)
            .slice(0, begin, end);
    const torch::Tensor sequence =
        (start + torch::arange(kSequence + 1)) % config.vocab_size;
    const torch::Tensor tokens = sequence.slice(1, 0, kSequence);
    const torch::Tensor targets = sequence.slice(1, 1, kSequence + 1);
    // Dropout draws from a generator seeded by the samples, so that the
    // same samples draw the same masks whichever replica runs them.
    torch::manual_seed(FLAGS_seed * 7919 + step * 104729 + begin);
    const torch::Tensor logits =
        examples::Gpt(gpt)->forward(tokens, examples::CausalMask(kSequence));
    return torch::nn::functional::cross_entropy(
               logits.reshape({-1, config.vocab_size}), targets.reshape({-1}),
               torch::nn::functional::CrossEntropyFuncOptions().reduction(
                   torch::kSum)) /
           kSequence;
  };
  return model;
}

Model MakeModel() {
  if (FLAGS_model == "mlp") return MakeMlp();
  if (FLAGS_model == "gpt") return MakeGpt();
  throw accel::UsageError("--model must be mlp or gpt, found " + FLAGS_model);
}

void WriteParams(torch::nn::Module& module, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  for (const torch::Tensor& p : module.parameters()) {
    const torch::Tensor c = p.detach().contiguous();
    out.write(static_cast<const char*>(c.data_ptr()),
              static_cast<std::streamsize>(c.numel() * c.element_size()));
  }
  if (!out) throw accel::Error("cannot write " + path);
}

// A --history_out file: "<step> <rank>,<rank>,..." per step, from 0, the
// ranks increasing. Anything else is refused with its line.
std::vector<std::vector<int>> ReadHistory(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line).good() && line.empty()) {
    throw accel::UsageError("--replay=" + path +
                            ": cannot read it, or it is empty");
  }
  std::vector<std::vector<int>> history;
  do {
    const std::string where = path + ":" + std::to_string(history.size() + 1) +
                              ": expected \"" + std::to_string(history.size()) +
                              " <rank>,<rank>,...\" (ranks increasing), found ";
    auto refuse = [&] {
      throw accel::UsageError(where + accel::Excerpt(line));
    };
    const size_t space = line.find(' ');
    if (space == std::string::npos ||
        line.substr(0, space) != std::to_string(history.size())) {
      refuse();
    }
    std::vector<int> ranks;
    std::stringstream list(line.substr(space + 1));
    std::string rank;
    while (std::getline(list, rank, ',')) {
      if (rank.empty() || rank.size() > 6 ||
          rank.find_first_not_of("0123456789") != std::string::npos) {
        refuse();
      }
      ranks.push_back(std::stoi(rank));
      if (ranks.size() > 1 && ranks.back() <= ranks[ranks.size() - 2]) {
        refuse();
      }
    }
    if (ranks.empty()) refuse();
    history.push_back(ranks);
  } while (std::getline(in, line));
  return history;
}

// One process along a history: each step, every member's share in turn,
// their gradients summed in rank order.
int Replay() {
  Model model = MakeModel();
  torch::optim::SGD optimizer(model.module->parameters(),
                              torch::optim::SGDOptions(FLAGS_lr).momentum(0.9));
  const auto parameters = model.module->parameters();
  const auto history = ReadHistory(FLAGS_replay);
  if (static_cast<int64_t>(history.size()) != FLAGS_steps) {
    throw accel::UsageError(
        "--replay=" + FLAGS_replay + " has " + std::to_string(history.size()) +
        " steps, --steps=" + std::to_string(FLAGS_steps) +
        ": give the job's --steps (a job that stopped early has no replay)");
  }
  for (size_t step = 0; step < history.size(); ++step) {
    const int64_t k = static_cast<int64_t>(history[step].size());
    torch::Tensor sum;
    for (int64_t i = 0; i < k; ++i) {
      optimizer.zero_grad();
      const int64_t begin = i * FLAGS_global_batch / k;
      const int64_t end = (i + 1) * FLAGS_global_batch / k;
      (model.loss(step, begin, end) / FLAGS_global_batch).backward();
      const torch::Tensor flat = accel::FlatGradients(parameters);
      sum = i == 0 ? flat.clone() : sum.add_(flat);
    }
    accel::SetFlatGradients(parameters, sum);
    optimizer.step();
  }
  if (!FLAGS_params_out.empty()) WriteParams(*model.module, FLAGS_params_out);
  std::printf("replayed %zu steps\n", history.size());
  return 0;
}

// Steps per second after the first step: the first waits for every rank
// to start (and, with the mode, forms the first quorum), which the
// comparison of the two modes must leave out.
class StepClock {
 public:
  void Done() {
    last_ = std::chrono::steady_clock::now();
    if (done_++ == 0) first_ = last_;
  }
  std::string Describe() const {
    const double seconds =
        std::chrono::duration<double>(last_ - first_).count();
    char text[128];
    std::snprintf(text, sizeof(text),
                  "%lld steps; after the first, %.2f s (%.1f steps/s)",
                  static_cast<long long>(done_), seconds,
                  done_ > 1 && seconds > 0 ? (done_ - 1) / seconds : 0.0);
    return text;
  }

 private:
  int64_t done_ = 0;
  std::chrono::steady_clock::time_point first_, last_;
};

// The same training without the mode: one communicator over every rank,
// the flat gradients summed, for the overhead's baseline.
int TrainPlain() {
  Model model = MakeModel();
  torch::optim::SGD optimizer(model.module->parameters(),
                              torch::optim::SGDOptions(FLAGS_lr).momentum(0.9));
  auto group = accel::ProcessGroup::Join(FLAGS_backend);
  accel::Communicator& comm = group->communicator();
  const auto parameters = model.module->parameters();
  const int64_t k = comm.size();
  const int64_t i = comm.rank();
  StepClock clock;
  for (int64_t step = 0; step < FLAGS_steps; ++step) {
    const torch::Tensor loss = model.loss(step, i * FLAGS_global_batch / k,
                                          (i + 1) * FLAGS_global_batch / k) /
                               FLAGS_global_batch;
    loss.backward();
    if (FLAGS_sleep_per_step_ms > 0) {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(FLAGS_sleep_per_step_ms));
    }
    torch::Tensor flat = accel::FlatGradients(parameters);
    comm.allreduce(flat.data_ptr(), flat.numel(), accel::DType::kFloat32,
                   accel::ReduceOp::kSum);
    accel::SetFlatGradients(parameters, flat);
    optimizer.step();
    optimizer.zero_grad();
    clock.Done();
  }
  if (comm.rank() == 0) std::printf("%s\n", clock.Describe().c_str());
  if (comm.rank() == 0 && !FLAGS_params_out.empty()) {
    WriteParams(*model.module, FLAGS_params_out);
  }
  return 0;
}

// Fails now, not after the training, when rank 0 could not write `path`.
void CheckWritable(const std::string& path, const char* flag) {
  if (path.empty()) return;
  std::ofstream out(path, std::ios::binary | std::ios::app);
  if (!out) {
    throw accel::UsageError(std::string("--") + flag + "=" + path +
                            ": cannot write it");
  }
}

int Train() {
  if (std::getenv("RANK") == nullptr ||
      std::string(std::getenv("RANK")) == "0") {
    CheckWritable(FLAGS_history_out, "history_out");
    CheckWritable(FLAGS_params_out, "params_out");
  }
  Model model = MakeModel();
  torch::optim::SGD optimizer(model.module->parameters(),
                              torch::optim::SGDOptions(FLAGS_lr).momentum(0.9));
  accel::FaultToleranceOptions options;
  options.backend = FLAGS_backend;
  if (!FLAGS_report_to.empty()) {
    std::stringstream names(FLAGS_report_to);
    std::string name;
    while (std::getline(names, name, ',')) options.log_with.push_back(name);
    options.logging_dir = FLAGS_logging_dir;
  }
  accel::FaultTolerance ft(*model.module, optimizer, options);
  StepClock clock;
  double last_loss = 0;
  while (ft.step() < FLAGS_steps && ft.StartStep()) {
    const auto [begin, end] = ft.Share(FLAGS_global_batch);
    const torch::Tensor loss =
        model.loss(ft.step(), begin, end) / FLAGS_global_batch;
    loss.backward();
    if (FLAGS_sleep_per_step_ms > 0) {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(FLAGS_sleep_per_step_ms));
    }
    last_loss = loss.item<double>();
    const int64_t step = ft.step();
    if (!ft.Commit()) continue;
    clock.Done();
    if (FLAGS_print_steps && ft.rank() == 0) {
      std::printf("step %lld done (%d replicas)\n",
                  static_cast<long long>(step), ft.replicas());
      std::fflush(stdout);
    }
  }
  if (ft.rank() != 0) return 0;
  std::printf("%s\n", ft.Summary().c_str());
  std::printf("%s; last loss share %.6f\n", clock.Describe().c_str(),
              last_loss);
  if (!FLAGS_history_out.empty()) {
    std::ofstream out(FLAGS_history_out, std::ios::trunc);
    const auto& history = ft.replica().history();
    for (size_t step = 0; step < history.size(); ++step) {
      out << step << " ";
      for (size_t i = 0; i < history[step].size(); ++i) {
        out << (i > 0 ? "," : "") << history[step][i];
      }
      out << "\n";
    }
    if (!out) throw accel::Error("cannot write " + FLAGS_history_out);
  }
  if (!FLAGS_params_out.empty()) WriteParams(*model.module, FLAGS_params_out);
  return 0;
}

}  // namespace

// Flags that every rank would refuse alike, before any joins the job.
void CheckFlags() {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw accel::UsageError(message);
  };
  require(FLAGS_steps >= 1, "--steps must be at least 1");
  require(FLAGS_global_batch >= 1, "--global_batch must be at least 1");
  require(FLAGS_hidden >= 1, "--hidden must be at least 1");
  require(FLAGS_sleep_per_step_ms >= 0, "--sleep_per_step_ms must be >= 0");
  const char* world = std::getenv("WORLD_SIZE");
  if (world != nullptr && FLAGS_replay.empty()) {
    require(FLAGS_global_batch >= std::atoll(world),
            "--global_batch=" + std::to_string(FLAGS_global_batch) +
                " cannot be split among " + world + " processes");
  }
}

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "trains through lost ranks under `launch --fault_tolerance`, or "
      "replays a run (--replay)");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  torch::set_num_threads(1);
  try {
    CheckFlags();
    if (!FLAGS_replay.empty()) return Replay();
    return FLAGS_fault_tolerance ? Train() : TrainPlain();
  } catch (const accel::UsageError&) {
    accel::ReportException(std::current_exception());  // With the rank.
    return 2;
  } catch (const std::exception&) {
    accel::ReportException(std::current_exception());
    // kPeerFailedExitCode when another rank's failure ended this one: the
    // launcher replaces a lost replica, not those that lost it.
    return accel::ExitCodeFor(std::current_exception());
  }
}
