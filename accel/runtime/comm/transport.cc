#include "accel/runtime/comm/transport.h"

#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "accel/runtime/base/errors.h"

namespace accel {

std::string CallSite::ToString() const {
  if (file == nullptr) return "unknown";
  const char* base = std::strrchr(file, '/');
  return std::string(base ? base + 1 : file) + ":" + std::to_string(line);
}

std::string CallSite::Parenthesized() const {
  return file == nullptr ? "" : " (" + ToString() + ")";
}

Transport::Transport(const BackendContext& context)
    : rank_(context.rank),
      size_(context.size),
      checks_enabled_(context.options.check_collectives) {}

void Transport::RequestAbort() {
  abort_requested_.store(true);
  Abort();
}

Transport::~Transport() = default;

std::string Transport::Where() const {
  return "[" + backend_name() + "] rank " + std::to_string(rank_) + "/" +
         std::to_string(size_) + ": ";
}

void Transport::FailUsage(const char* operation,
                          const std::string& message) const {
  throw UsageError(Where() + operation + ": " + message);
}

void Transport::ReduceScatterByAllreduce(const Op& op, const void* input,
                                         void* output,
                                         const std::vector<size_t>& counts,
                                         DType dtype, ReduceOp reduce_op) {
  const size_t element = ElementSize(dtype);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t before =
      std::accumulate(counts.begin(), counts.begin() + rank_, size_t{0});
  if (total == 0) return;
  if (checks_enabled_ && size_ > 1) AgreeOnCall(op);
  std::vector<char> whole(static_cast<const char*>(input),
                          static_cast<const char*>(input) + total * element);
  RunAllreduce(op, whole.data(), total, dtype, reduce_op);
  if (counts[rank_] > 0) {
    std::memcpy(output, whole.data() + before * element,
                counts[rank_] * element);
  }
}

std::chrono::steady_clock::time_point Transport::Op::Deadline() const {
  const auto from = started == std::chrono::steady_clock::time_point{}
                        ? std::chrono::steady_clock::now()
                        : started;
  return from + timeout;
}

void Transport::AgreeOnCall(const Op& op) {
  // The maxima of the hash and of its complement are ours only when every
  // rank's hash is.
  uint64_t call = 0xcbf29ce484222325ull ^ op.sequence;
  for (const char c : op.signature) {
    call = (call ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  }
  int64_t values[2] = {static_cast<int64_t>(call), static_cast<int64_t>(~call)};
  RunAllreduce(op, values, 2, DType::kInt64, ReduceOp::kMax);
  if (values[0] == static_cast<int64_t>(call) &&
      values[1] == static_cast<int64_t>(~call)) {
    return;
  }
  // Nothing has moved; the watchdog compares the calls through the store.
  const auto deadline = std::chrono::steady_clock::now() + op.timeout;
  while (!abort_requested()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      throw TimeoutError("the ranks called different collectives");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  throw PeerError("the watchdog stopped the collective");
}

}  // namespace accel
