// The environment variables accel reads, parsed strictly: a value that does
// not parse is a UsageError naming the variable and quoting the value,
// never a silent 0 or default.
//
//   std::optional<int64_t> ns = accel::EnvInt64("ACCEL_LAUNCH_STEADY_NS");
//   bool tcp = !accel::EnvSwitch("ACCEL_SHARED_MEMORY").value_or(true);
//   accel::CheckEnvLength("ACCEL_RUN_SECRET", secret, kMaxRunSecretBytes);
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace accel {

// The longest ACCEL_RUN_SECRET and ACCEL_JOB_ID: both travel in the store's
// greeting, which is at most 4096 bytes before a client is admitted.
inline constexpr size_t kMaxRunSecretBytes = 1024;
inline constexpr size_t kMaxJobIdBytes = 256;

// A decimal integer in [min, max], or nullopt when unset.
std::optional<int64_t> EnvInt64(
    const char* name, int64_t min = std::numeric_limits<int64_t>::min(),
    int64_t max = std::numeric_limits<int64_t>::max());

// 1/0, true/false, on/off, yes/no (any case), or nullopt when unset or
// empty.
std::optional<bool> EnvSwitch(const char* name);

// UsageError when `value` (of variable `name`) is longer than `max_bytes`.
void CheckEnvLength(const char* name, const std::string& value,
                    size_t max_bytes);

// UsageError unless OMP_NUM_THREADS's value (null: unset) is what OpenMP
// takes: a number of threads, or one per nesting level ("4,2").
void CheckOmpNumThreads(const char* value);

}  // namespace accel
