// The arithmetic of accel-estimate-memory (tools/estimate_memory.cc): the
// memory a process holds for a model's training state at each ZeRO stage,
// process count and mixed precision, from docs/parallelism.md's table
// "model-state bytes per parameter (fp32 AdamW, N ranks)", as `accelerate
// estimate-memory` gives it for Hugging Face models.
//
//   using namespace accel::memory_estimate;
//   Model model = ModelOfSize(ParseParameterCount("1.3B"), "--parameters");
//   EstimateOptions options;
//   options.process_counts = ParseProcessCounts("1,2,4,8");
//   options.precisions = ParsePrecisions("all");
//   std::fputs(Report(model, options).c_str(), stdout);
//
// Only the model state is estimated (parameters, gradients, AdamW's two
// moments, the 12/L of stage 3's units when L is given); Report says what
// it leaves out. Parse errors are accel::UsageError naming the flag and the
// value found.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace accel::memory_estimate {

// The precisions --mixed_precision names, "all" being all three.
inline const std::vector<std::string> kPrecisions = {"no", "bf16", "fp16"};

// --parameters: a whole number of parameters, plain ("350000") or with a
// suffix K, M, B or G (thousands, millions, billions, billions; either
// case) after a decimal number ("125M", "1.3B", "7b"), which must come to
// a whole number of at least 1.
int64_t ParseParameterCount(const std::string& text);

// --num_processes: a comma-separated list of process counts from 1 to
// 1000000, e.g. "1,2,4,8"; kept in the order given, repeats dropped.
std::vector<int> ParseProcessCounts(const std::string& text);

// --mixed_precision: "no", "bf16", "fp16" or "all" (the three).
std::vector<std::string> ParsePrecisions(const std::string& text);

// Model-state bytes per parameter of one process at ZeRO `stage` (0: DDP)
// on `processes` ranks, with AdamW and fp32 master state:
//   stage 0: 16; stage 1: 4 + 4 + 8/N; stage 2: 4 + 4/N + 8/N;
//   stage 3: 16/N + 12/L, the 12/L left out when `units` is 0.
double BytesPerParameter(int stage, int processes, int units = 0);

// "512 B", "1.5 KiB", "19.4 GiB": one decimal, powers of 1024.
std::string HumanBytes(double bytes);

// What is estimated: its parameter count, where it came from, and (from a
// weights file) its largest tensor, which stage 2's transient depends on.
struct Model {
  int64_t parameters = 0;
  std::string source;             // "--parameters=1.3B", or the path.
  int64_t largest_parameter = 0;  // Elements; 0 when unknown.
  std::string details;            // What the weights file holds.
};

// A model of `parameters` given as `source` on the command line.
Model ModelOfSize(int64_t parameters, const std::string& source);

// The model whose weights are at `path` (a model.safetensors file, a
// model.safetensors.index.json with its shards, or a folder save_model
// wrote), counted from the files' headers: no tensor is read. Every
// floating-point tensor counts as parameters (a state dict's float buffers
// too: the file does not tell them apart); integer and bool tensors are
// buffers and are left out. CheckpointError for a missing or corrupt file.
Model ModelFromWeights(const std::string& path);

struct EstimateOptions {
  std::vector<int> process_counts = {1, 2, 4, 8};
  std::vector<std::string> precisions = kPrecisions;
  int units = 0;  // Stage 3's units (L); 0 leaves the 12/L out.
};

// The tables: for each precision, rows stage 0-3, columns per process
// count with bytes per parameter and the total per process, then notes on
// what the precision stores and what is not counted.
std::string Report(const Model& model, const EstimateOptions& options);

}  // namespace accel::memory_estimate
