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

std::string RankName(const BackendContext& context, int rank) {
  if (context.group.empty() || rank < 0 ||
      rank >= static_cast<int>(context.job_ranks.size())) {
    return "rank " + std::to_string(rank);
  }
  return "rank " + std::to_string(context.job_ranks[rank]) + " (" +
         std::to_string(rank) + " of group " + context.group + ")";
}

std::string RankWhere(const BackendContext& context) {
  const std::string position =
      std::to_string(context.rank) + "/" + std::to_string(context.size);
  if (context.group.empty() ||
      context.rank >= static_cast<int>(context.job_ranks.size())) {
    return "rank " + position;
  }
  return "rank " + std::to_string(context.job_ranks[context.rank]) + " (" +
         position + " of group " + context.group + ")";
}

Transport::Transport(const BackendContext& context)
    : rank_(context.rank),
      size_(context.size),
      where_(RankWhere(context)),
      checks_enabled_(context.options.check_collectives) {}

std::unique_ptr<Transport> Transport::MakeGroup(
    const Op& /*op*/, const BackendContext* group, int /*color*/, int /*key*/,
    const TransportFactory& factory) {
  if (group == nullptr) return nullptr;
  return factory(*group);
}

void Transport::RequestAbort() {
  abort_requested_.store(true);
  Abort();
}

Transport::~Transport() = default;

std::string Transport::Where() const {
  return "[" + backend_name() + "] " + where_ + ": ";
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

void Transport::RunAllToAll(const Op& op, const void* input, void* output,
                            const std::vector<size_t>& counts, DType dtype) {
  const size_t element = ElementSize(dtype);
  std::vector<size_t> sent(size_, 0);  // Each rank's whole input.
  for (int q = 0; q < size_; ++q) {
    for (int r = 0; r < size_; ++r) sent[q] += counts[q * size_ + r];
  }
  const size_t total = std::accumulate(sent.begin(), sent.end(), size_t{0});
  std::vector<char> everything(total * element);
  if (total > 0) RunAllgatherv(op, input, everything.data(), sent, dtype);
  char* out = static_cast<char*>(output);
  size_t segment = 0;  // Where rank q's input starts in `everything`.
  for (int q = 0; q < size_; ++q) {
    size_t at = segment;
    for (int r = 0; r < rank_; ++r) at += counts[q * size_ + r];
    const size_t n = counts[q * size_ + rank_] * element;
    if (n > 0) std::memcpy(out, everything.data() + at * element, n);
    out += n;
    segment += sent[q];
  }
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
