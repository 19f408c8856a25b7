#include "accel/core/tensor_format.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace accel {
namespace {

constexpr int64_t kSummarizeAbove = 1000;
constexpr int64_t kEdgeItems = 3;

std::string Scalar(const torch::Tensor& value) {
  if (value.scalar_type() == torch::kBool) {
    return value.item<bool>() ? "True" : "False";
  }
  if (torch::isFloatingType(value.scalar_type())) {
    const double v = value.item<double>();
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    char text[64];
    std::snprintf(text, sizeof(text), "%.4f", v);
    return text;
  }
  return std::to_string(value.item<int64_t>());
}

// Items of dimension 0 of `t`, with "..." in place of the middle ones when
// the whole tensor is summarized.
void Body(const torch::Tensor& t, bool summarize, int indent,
          std::ostringstream& out) {
  out << "[";
  const int64_t n = t.size(0);
  const bool cut = summarize && n > 2 * kEdgeItems;
  for (int64_t i = 0; i < n; ++i) {
    if (cut && i == kEdgeItems) {
      out << (t.dim() == 1 ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - kEdgeItems;
    }
    if (t.dim() == 1) {
      out << Scalar(t[i]);
    } else {
      Body(t[i], summarize, indent + 1, out);
    }
    if (i + 1 < n) {
      out << (t.dim() == 1 ? ", "
                           : "," + std::string(t.dim() - 1, '\n') +
                                 std::string(indent + 1, ' '));
    }
  }
  out << "]";
}

}  // namespace

std::string Repr(const torch::Tensor& tensor) {
  if (!tensor.defined()) return "tensor(undefined)";
  const torch::Tensor t = tensor.detach().cpu();
  std::ostringstream out;
  out << "tensor(";
  if (t.dim() == 0) {
    out << Scalar(t);
  } else {
    Body(t, t.numel() > kSummarizeAbove, /*indent=*/7, out);
  }
  out << ")";
  return out.str();
}

}  // namespace accel
