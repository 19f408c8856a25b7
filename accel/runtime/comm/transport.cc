#include "accel/runtime/comm/transport.h"

#include <cstring>

#include "accel/runtime/base/errors.h"

namespace accel {

std::string CallSite::ToString() const {
  if (file == nullptr) return "unknown";
  const char* base = std::strrchr(file, '/');
  return std::string(base ? base + 1 : file) + ":" + std::to_string(line);
}

Transport::Transport(const BackendContext& context)
    : rank_(context.rank), size_(context.size) {}

Transport::~Transport() = default;

std::string Transport::Where() const {
  return "[" + backend_name() + "] rank " + std::to_string(rank_) + "/" +
         std::to_string(size_) + ": ";
}

void Transport::FailUsage(const char* operation,
                          const std::string& message) const {
  throw UsageError(Where() + operation + ": " + message);
}

}  // namespace accel
