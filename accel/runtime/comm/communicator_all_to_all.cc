// Communicator::all_to_all and all_to_allv (communicator.h).
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/communicator.h"

namespace accel {
namespace {

size_t Sum(const std::vector<size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), size_t{0});
}

}  // namespace

uint64_t Communicator::all_to_all(const void* input, void* output, size_t count,
                                  DType dtype,
                                  const CollectiveOptions& options) {
  std::vector<size_t> counts(size_, count);
  return Finish(StartAllToAll(input, output, counts, counts, dtype,
                              /*equal=*/true, options, Mode::kBlocking));
}

std::shared_ptr<Work> Communicator::all_to_all_async(
    const void* input, void* output, size_t count, DType dtype,
    const CollectiveOptions& options) {
  std::vector<size_t> counts(size_, count);
  return StartAllToAll(input, output, counts, counts, dtype, /*equal=*/true,
                       options, Mode::kAsync)
      .work;
}

uint64_t Communicator::all_to_allv(const void* input,
                                   std::vector<size_t> send_counts,
                                   void* output,
                                   std::vector<size_t> recv_counts, DType dtype,
                                   const CollectiveOptions& options) {
  return Finish(StartAllToAll(input, output, std::move(send_counts),
                              std::move(recv_counts), dtype, /*equal=*/false,
                              options, Mode::kBlocking));
}

Communicator::Started Communicator::StartAllToAll(
    const void* input, void* output, std::vector<size_t> send_counts,
    std::vector<size_t> recv_counts, DType dtype, bool equal,
    const CollectiveOptions& options, Mode mode) {
  const char* name = equal ? "all_to_all" : "all_to_allv";
  for (const auto* counts : {&send_counts, &recv_counts}) {
    if (counts->size() != static_cast<size_t>(size_)) {
      FailUsage(name, "expected " + std::to_string(size_) +
                          " counts (one per rank), found " +
                          std::to_string(counts->size()));
    }
  }
  const size_t element = ElementSize(dtype);
  const size_t sending = Sum(send_counts), receiving = Sum(recv_counts);
  if ((sending > 0 && input == nullptr) ||
      (receiving > 0 && output == nullptr)) {
    FailUsage(name, "null buffer with non-zero counts");
  }
  const auto* in = static_cast<const char*>(input);
  const auto* out = static_cast<const char*>(output);
  if (sending > 0 && receiving > 0 && in < out + receiving * element &&
      out < in + sending * element) {
    FailUsage(name,
              "input and output overlap; give the output its own "
              "buffer");
  }
  std::string signature = std::string(name) + " " + DTypeName(dtype);
  if (equal) signature += " x " + std::to_string(send_counts[0]);
  return Start(
      name, options, std::move(signature),
      Task([=, send = std::move(send_counts),
            receive = std::move(recv_counts)](const Op& op) {
        std::vector<size_t> matrix(static_cast<size_t>(size_) * size_);
        if (equal) {
          std::fill(matrix.begin(), matrix.end(), send[0]);
        } else {
          // Every rank's sends and receives, so that every rank finds the
          // same mismatch, if any, and none waits for data never sent.
          std::vector<int64_t> mine(2 * size_), all(2 * size_ * size_);
          for (int r = 0; r < size_; ++r) {
            mine[r] = static_cast<int64_t>(send[r]);
            mine[size_ + r] = static_cast<int64_t>(receive[r]);
          }
          transport_->RunAllgather(op, mine.data(), all.data(), mine.size(),
                                   DType::kInt64);
          for (int q = 0; q < size_; ++q) {
            for (int r = 0; r < size_; ++r) {
              const int64_t sends = all[2 * size_ * q + r];
              const int64_t expects = all[2 * size_ * r + size_ + q];
              if (sends != expects) {
                throw UsageError(
                    "rank " + std::to_string(job_rank(q)) + " sends " +
                    std::to_string(sends) + " element(s) to rank " +
                    std::to_string(job_rank(r)) + ", which expects " +
                    std::to_string(expects) +
                    " from it (send_counts and recv_counts must agree)");
              }
              matrix[q * size_ + r] = static_cast<size_t>(sends);
            }
          }
        }
        transport_->RunAllToAll(op, input, output, matrix, dtype);
      }),
      mode, sending * element);
}

}  // namespace accel
