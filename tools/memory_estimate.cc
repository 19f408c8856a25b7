#include "tools/memory_estimate.h"

#include <c10/core/ScalarType.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <optional>
#include <set>

#include "accel/checkpoint/model_weights.h"
#include "accel/runtime/base/errors.h"
#include "accel/runtime/base/files.h"

namespace accel::memory_estimate {
namespace {

constexpr int kMaxProcesses = 1000000;
constexpr int kStages = 4;

// "1,300,000,000": counts read at a glance.
std::string WithCommas(int64_t value) {
  std::string digits = std::to_string(value);
  for (int at = static_cast<int>(digits.size()) - 3; at > 0; at -= 3) {
    digits.insert(static_cast<size_t>(at), ",");
  }
  return digits;
}

std::string Format(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), format, value);
  return text;
}

std::string PadLeft(const std::string& text, size_t width) {
  return text.size() >= width ? text
                              : std::string(width - text.size(), ' ') + text;
}

std::string PadRight(const std::string& text, size_t width) {
  return text.size() >= width ? text
                              : text + std::string(width - text.size(), ' ');
}

// A whole number of at most `max`, or nullopt (empty, a sign, another
// character, too large).
std::optional<int64_t> ParseWhole(const std::string& text, int64_t max) {
  if (text.empty()) return std::nullopt;
  int64_t value = 0;
  for (const char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c)) ||
        __builtin_mul_overflow(value, int64_t{10}, &value) ||
        __builtin_add_overflow(value, int64_t{c - '0'}, &value)) {
      return std::nullopt;
    }
  }
  if (value > max) return std::nullopt;
  return value;
}

// safetensors' names, which Hugging Face's model cards use.
std::string DtypeName(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Double:
      return "F64";
    case c10::ScalarType::Float:
      return "F32";
    case c10::ScalarType::Half:
      return "F16";
    case c10::ScalarType::BFloat16:
      return "BF16";
    default:
      return c10::toString(dtype);
  }
}

const char* PrecisionNote(const std::string& precision) {
  if (precision == "no") {
    return "fp32 parameters (4 bytes), gradients (4) and AdamW's exp_avg and "
           "exp_avg_sq (8):\n  ZeRO stage 1 shards the 8, stage 2 the "
           "gradients too, stage 3 everything.";
  }
  if (precision == "bf16") {
    return "the same bytes as fp32: accel's autocast (accel/optim/autocast.h) "
           "keeps fp32 parameters,\n  gradients and optimizer state and "
           "stores no bf16 copy of the model. It runs matmuls\n  and "
           "convolutions in bf16, which halves their activations; between "
           "forward and backward\n  autograd also keeps the bf16 copies of "
           "the weights it cast (up to 2 bytes per parameter):\n  both are "
           "activations, not estimated here.";
  }
  return "the same bytes as fp32: autocast keeps fp32 parameters, gradients "
         "and optimizer state,\n  and the loss scaler (accel::GradScaler) "
         "adds a few scalars. On a GPU fp16 halves matmul\n  activations as "
         "bf16 does; on the CPU LibTorch 1.13 has no fp16 autocast, so fp16 "
         "only\n  scales the loss.";
}

}  // namespace

int64_t ParseParameterCount(const std::string& text) {
  const auto fail = [&]() -> int64_t {
    throw UsageError(
        "--parameters: expected a whole number of parameters, plain or with "
        "K, M, B or G (thousands, millions, billions), e.g. 350000, 125M or "
        "1.3B; found '" +
        text + "'");
  };
  std::string number = text;
  int exponent = 0;  // Of the suffix's power of 10.
  if (!number.empty()) {
    switch (std::toupper(static_cast<unsigned char>(number.back()))) {
      case 'K':
        exponent = 3;
        break;
      case 'M':
        exponent = 6;
        break;
      case 'B':
      case 'G':
        exponent = 9;
        break;
    }
    if (exponent > 0) number.pop_back();
  }
  // Digits with at most one point, which only a suffix may follow: in
  // whole units (exactly, without floating point) "1.3" with 10^9 is
  // 13 * 10^8.
  const size_t point = number.find('.');
  std::string digits = number;
  int decimals = 0;
  if (point != std::string::npos) {
    if (exponent == 0) return fail();
    digits = number.substr(0, point) + number.substr(point + 1);
    decimals = static_cast<int>(number.size() - point - 1);
    if (point == 0 || decimals == 0) return fail();
  }
  // Trailing zeros of the fraction do not change the value.
  while (decimals > 0 && digits.back() == '0') {
    digits.pop_back();
    --decimals;
  }
  if (decimals > exponent) return fail();  // Not whole: "1.2345K".
  const auto too_large = [&]() -> int64_t {
    throw UsageError("--parameters: '" + text +
                     "' is more than the 9.2e18 parameters accel counts");
  };
  if (digits.empty() ||
      !std::all_of(digits.begin(), digits.end(),
                   [](unsigned char c) { return std::isdigit(c); })) {
    return fail();
  }
  const auto value = ParseWhole(digits, std::numeric_limits<int64_t>::max());
  if (!value) return too_large();
  int64_t count = *value;
  for (int i = decimals; i < exponent; ++i) {
    if (__builtin_mul_overflow(count, int64_t{10}, &count)) return too_large();
  }
  if (count < 1) {
    throw UsageError("--parameters: a model has at least 1 parameter; found '" +
                     text + "'");
  }
  return count;
}

std::vector<int> ParseProcessCounts(const std::string& text) {
  std::vector<int> counts;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma - start);
    const auto value = ParseWhole(item, kMaxProcesses);
    if (!value || *value < 1) {
      throw UsageError(
          "--num_processes: expected a comma-separated list of process "
          "counts from 1 to " +
          std::to_string(kMaxProcesses) + ", e.g. 1,2,4,8; found '" + text +
          "' ('" + item + "' is not one)");
    }
    if (std::find(counts.begin(), counts.end(), *value) == counts.end()) {
      counts.push_back(static_cast<int>(*value));
    }
    if (comma == std::string::npos) return counts;
    start = comma + 1;
  }
}

std::vector<std::string> ParsePrecisions(const std::string& text) {
  if (text == "all") return kPrecisions;
  if (std::find(kPrecisions.begin(), kPrecisions.end(), text) !=
      kPrecisions.end()) {
    return {text};
  }
  throw UsageError(
      "--mixed_precision: expected one of no, bf16, fp16, all; found '" + text +
      "'");
}

double BytesPerParameter(int stage, int processes, int units) {
  if (stage < 0 || stage >= kStages) {
    throw UsageError("BytesPerParameter: stage must be 0 to 3, found " +
                     std::to_string(stage));
  }
  if (processes < 1 || units < 0) {
    throw UsageError(
        "BytesPerParameter: expected processes >= 1 and units >= 0, found " +
        std::to_string(processes) + " and " + std::to_string(units));
  }
  const double n = processes;
  switch (stage) {
    case 0:
      return 4 + 4 + 8;
    case 1:
      return 4 + 4 + 8 / n;
    case 2:
      return 4 + 4 / n + 8 / n;
    default:
      // During backward: the running unit's parameters and gradients and
      // the prefetched unit's parameters, 4/L bytes each; a single unit
      // has none to prefetch.
      return 16 / n + (units > 1 ? 12.0 / units : units == 1 ? 8.0 : 0.0);
  }
}

std::string HumanBytes(double bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB",
                                       "TiB", "PiB", "EiB"};
  // Units as printed: 1023.97 KiB shows as 1.0 MiB, not 1024.0 KiB.
  if (bytes < 1023.5) return Format("%.0f B", bytes);
  int unit = 0;
  bytes /= 1024;
  while (unit < 5 && bytes >= 1023.95) {
    bytes /= 1024;
    ++unit;
  }
  return Format("%.1f ", bytes) + kUnits[unit];
}

Model ModelOfSize(int64_t parameters, const std::string& source) {
  Model model;
  model.parameters = parameters;
  model.source = source;
  return model;
}

Model ModelFromWeights(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    throw UsageError("--model: cannot read '" + path +
                     "': " + ErrnoText(errno) +
                     " (give a model.safetensors file, a "
                     "model.safetensors.index.json or a folder save_model "
                     "wrote)");
  }
  Model model;
  model.source = path;
  int64_t tensors = 0;
  int64_t other_tensors = 0;
  int64_t other_elements = 0;
  std::set<std::string> dtypes;
  for (const auto& [name, info] : LoadModelWeightsInfo(path)) {
    const int64_t elements = info.numel();
    if (!c10::isFloatingType(info.dtype)) {
      ++other_tensors;
      other_elements += elements;
      continue;
    }
    ++tensors;
    model.parameters += elements;
    model.largest_parameter = std::max(model.largest_parameter, elements);
    dtypes.insert(DtypeName(info.dtype));
  }
  if (model.parameters == 0) {
    throw UsageError("--model: '" + path +
                     "' holds no floating-point tensor: nothing to train");
  }
  std::string listed;
  for (const std::string& dtype : dtypes) {
    listed += (listed.empty() ? "" : ", ") + dtype;
  }
  model.details = std::to_string(tensors) + " floating-point tensors (" +
                  listed + "; trained in fp32 whatever the file holds)";
  if (other_tensors > 0) {
    model.details += "; " + std::to_string(other_tensors) +
                     " integer or bool tensors (" + WithCommas(other_elements) +
                     " elements) are buffers, not counted";
  }
  return model;
}

std::string Report(const Model& model, const EstimateOptions& options) {
  if (model.parameters < 1 || options.process_counts.empty() ||
      options.precisions.empty() || options.units < 0) {
    throw UsageError(
        "Report: needs parameters, process counts and precisions, and units "
        ">= 0");
  }
  std::string out = "accel-estimate-memory: " + WithCommas(model.parameters) +
                    " parameters (" + model.source + ")";
  if (!model.details.empty()) out += ":\n  " + model.details;
  out +=
      "\nModel state per process for AdamW with fp32 master state: bytes per "
      "parameter\n(docs/parallelism.md's table, N processes) and their "
      "total.\n";

  // Each process count's cell: a gap, bytes per parameter, the total.
  constexpr size_t kLabel = 14;
  constexpr size_t kGap = 3;
  constexpr size_t kPerParameter = 7;  // "B/param", "16.00".
  constexpr size_t kTotal = 12;        // "1023.9 GiB" and room.
  constexpr size_t kCell = kGap + kPerParameter + kTotal;
  const auto cell = [&](double per_parameter) {
    return PadLeft(Format("%.2f", per_parameter), kGap + kPerParameter) +
           PadLeft(HumanBytes(per_parameter *
                              static_cast<double>(model.parameters)),
                   kTotal);
  };
  for (const std::string& precision : options.precisions) {
    out += "\n--mixed_precision=" + precision +
           (precision == "no" ? " (fp32)" : "") + "\n";
    std::string counts_line = PadRight("", kLabel);
    std::string units_line = PadRight("stage", kLabel);
    for (const int n : options.process_counts) {
      counts_line += PadLeft(
          std::to_string(n) + (n == 1 ? " process" : " processes"), kCell);
      units_line +=
          PadLeft("B/param", kGap + kPerParameter) + PadLeft("total", kTotal);
    }
    out += counts_line + "\n" + units_line + "\n";
    const char* const kLabels[kStages] = {"0 (DDP)", "1 (ZeRO 1)", "2 (ZeRO 2)",
                                          "3 (ZeRO 3)"};
    for (int stage = 0; stage < kStages; ++stage) {
      std::string label = kLabels[stage];
      if (stage == 3) label += options.units > 0 ? "" : "*";
      std::string row = PadRight(label, kLabel);
      for (const int n : options.process_counts) {
        row += cell(BytesPerParameter(stage, n, options.units));
      }
      out += row + "\n";
    }
    out += "  " + std::string(PrecisionNote(precision)) + "\n";
  }

  out += "\n";
  if (options.units > 0) {
    out += "Stage 3 includes 12/L with L = " + std::to_string(options.units) +
           " units (" + Format("%.2f", 12.0 / options.units) +
           " bytes per parameter): during backward\ntwo units' parameters "
           "(the one running and the one prefetched) and the running one's\n"
           "gradients are whole.\n";
  } else {
    out +=
        "* Stage 3 leaves out 12/L bytes per parameter, with L equal units: "
        "during backward two units'\n  parameters and one unit's gradients "
        "are whole (give --units=L to add it).\n";
  }
  out +=
      "Stage 2 also holds about 3 gradients of the largest parameter during "
      "backward, not in the table";
  if (model.largest_parameter > 0) {
    out += ":\n3 x 4 bytes x " + WithCommas(model.largest_parameter) +
           " elements = " +
           HumanBytes(3.0 * 4 * static_cast<double>(model.largest_parameter)) +
           " here";
  }
  out += ".\n";
  out +=
      "Not counted: activations (they grow with batch and sequence length, "
      "and ZeRO does not\nshard them), buffers (--model counts a file's "
      "floating-point buffers as parameters and\nleaves out integer ones), "
      "the full-size gradients that gradient accumulation keeps\nbetween "
      "syncs under stages 2-3 (4 bytes per parameter), the fp16 loss scaler "
      "(a few\nscalars, negligible), and LibTorch's and the backend's own "
      "memory.\n";
  return out;
}

}  // namespace accel::memory_estimate
