// Accelerate's helpers for doing different things on different processes.
//
//   {
//     auto first = accelerator.main_process_first();
//     MyDataset::DownloadAndCache(dir);   // the main process first, then
//   }                                     // the others, from its cache
//
//   std::vector<std::string> mine =
//       accelerator.split_between_processes(prompts);   // this rank's share
//
// split_between_processes: the first len % N ranks get one element more
// (divmod, as Accelerate); with apply_padding every rank gets ceil(len / N),
// the short ones repeating the last element, so that gathered results line
// up. Tensors are split along dim 0; maps split each value alike.
#pragma once

#include <torch/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "accel/runtime/base/errors.h"

namespace accel {

// Runs `wait` (a barrier) before the scope on the processes that go second
// and after it on the one that goes first. The barrier after the scope is
// skipped when the scope is left by an exception: the others then learn of
// the failure from the departed process, not from a mismatched barrier.
class ProcessOrderScope {
 public:
  ProcessOrderScope(bool goes_first, std::function<void()> wait)
      : goes_first_(goes_first),
        wait_(std::move(wait)),
        exceptions_(std::uncaught_exceptions()) {
    if (!goes_first_) wait_();
  }
  ~ProcessOrderScope() noexcept(false) {
    if (goes_first_ && wait_ && std::uncaught_exceptions() == exceptions_) {
      wait_();
    }
  }
  ProcessOrderScope(ProcessOrderScope&& other) noexcept
      : goes_first_(other.goes_first_),
        wait_(std::move(other.wait_)),
        exceptions_(other.exceptions_) {
    other.wait_ = nullptr;
  }
  ProcessOrderScope(const ProcessOrderScope&) = delete;
  ProcessOrderScope& operator=(const ProcessOrderScope&) = delete;
  ProcessOrderScope& operator=(ProcessOrderScope&&) = delete;

 private:
  bool goes_first_;
  std::function<void()> wait_;
  int exceptions_;
};

namespace split {

// [begin, end) of rank's share of `length` items, and the padded length.
struct Share {
  size_t begin;
  size_t end;
  size_t padded;  // Items every rank returns with padding.
};

inline Share ShareOf(size_t length, int rank, int size) {
  const size_t n = static_cast<size_t>(size);
  const size_t r = static_cast<size_t>(rank);
  const size_t base = length / n;
  const size_t extra = length % n;
  const size_t begin = r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0), (length + n - 1) / n};
}

template <typename T>
std::vector<T> Split(const std::vector<T>& items, int rank, int size,
                     bool apply_padding) {
  const Share share = ShareOf(items.size(), rank, size);
  std::vector<T> mine(items.begin() + share.begin, items.begin() + share.end);
  if (apply_padding && !items.empty()) {
    while (mine.size() < share.padded) mine.push_back(items.back());
  }
  return mine;
}

inline torch::Tensor Split(const torch::Tensor& items, int rank, int size,
                           bool apply_padding) {
  if (items.dim() == 0) {
    throw UsageError(
        "split_between_processes: a 0-d tensor cannot be split; pass a "
        "tensor with a first dimension");
  }
  const Share share = ShareOf(static_cast<size_t>(items.size(0)), rank, size);
  torch::Tensor mine =
      items.narrow(0, static_cast<int64_t>(share.begin),
                   static_cast<int64_t>(share.end - share.begin));
  if (apply_padding && items.size(0) > 0 &&
      static_cast<size_t>(mine.size(0)) < share.padded) {
    const int64_t missing = static_cast<int64_t>(share.padded) - mine.size(0);
    torch::Tensor last = items.narrow(0, items.size(0) - 1, 1);
    std::vector<int64_t> repeats(items.dim(), 1);
    repeats[0] = missing;
    mine = torch::cat({mine, last.repeat(repeats)});
  }
  return mine;
}

inline size_t LengthOf(const torch::Tensor& t) {
  return t.dim() == 0 ? 0 : static_cast<size_t>(t.size(0));
}
template <typename T>
size_t LengthOf(const std::vector<T>& v) {
  return v.size();
}

template <typename Value>
std::map<std::string, Value> Split(const std::map<std::string, Value>& items,
                                   int rank, int size, bool apply_padding) {
  std::map<std::string, Value> mine;
  for (const auto& [key, value] : items) {
    if (LengthOf(value) != LengthOf(items.begin()->second)) {
      throw UsageError(
          "split_between_processes: every value of a map must have the same "
          "length; '" +
          items.begin()->first + "' has " +
          std::to_string(LengthOf(items.begin()->second)) + ", '" + key +
          "' has " + std::to_string(LengthOf(value)));
    }
    mine[key] = Split(value, rank, size, apply_padding);
  }
  return mine;
}

}  // namespace split
}  // namespace accel
