// Private to SharedMemoryGroup: the shared segment's layout (header, one
// state per rank) and the small pieces both of its files use (call ids,
// chunk partitioning, waiting). Not for other code.
//
//   const CallId id = CallId(sequence).Add(static_cast<uint64_t>(kind));
//   const Part part = PartOf(n, local_size, local_rank, sizeof(float));
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "backends/shm/shared_memory_group.h"

namespace accel::shm_internal {

constexpr uint64_t kMagic = 0x6163636c73686d31;  // "acclshm1"
constexpr size_t kPageBytes = 4096;
// The longest a sleeping waiter goes without looking at the clock.
constexpr auto kLongestSleep = std::chrono::milliseconds(100);
// How long an overlapped call polls (see Call::overlapped): about what a
// futex wake-up costs.
constexpr auto kOverlappedSpin = std::chrono::microseconds(20);
// With more local ranks than CPUs, how long a waiting rank keeps yielding
// its CPU before it sleeps: the rank it waits for is likely runnable on
// the same CPU, and a yield hands it the CPU at once, where a futex sleep
// and wake-up cost tens of microseconds (4 ranks on 2 cores: a barrier took
// 50 us sleeping at once, against Open MPI's 13 us, which yields).
constexpr auto kOversubscribedYield = std::chrono::microseconds(200);
constexpr size_t kReasonBytes = 512;

enum AbortState : uint32_t { kRunning = 0, kWriting = 1, kAborted = 2 };

// What a call's chunks are tagged with: the call's sequence number and
// arguments, so that different collectives never accept each other's data.
class CallId {
 public:
  explicit CallId(uint64_t sequence) { Add(sequence); }
  CallId& Add(uint64_t value) {
    // One multiply per value (FNV-1a over its bytes took eight, in a chain:
    // about 50 ns of a 0.4 us allgather), and the high bits folded down.
    hash_ = (hash_ ^ value) * 0x9e3779b97f4a7c15ull;
    hash_ ^= hash_ >> 29;
    return *this;
  }
  // Zero is the value of a slot that holds no chunk yet.
  uint64_t value() const { return hash_ == 0 ? 1 : hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

enum class Kind : uint64_t {
  kAllreduce = 1,
  kAllgatherv,
  kBroadcast,
  kBarrier,
  kReduceScatter
};

inline size_t RoundUp(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

inline void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The part of an n-element chunk that local rank q reduces: equal shares,
// each starting on a cache line.
struct Part {
  size_t begin;
  size_t count;
};
inline Part PartOf(size_t n, int parts, int q, size_t element) {
  const size_t align = std::max<size_t>(1, 64 / element);
  const size_t share = RoundUp((n + parts - 1) / parts, align);
  const size_t begin = std::min(n, share * q);
  return {begin, std::min(n, begin + share) - begin};
}

// Copies n bytes between buffers that do not overlap, avoiding memcpy's
// slow case (see shared_memory_layout.cc).
void Copy(void* destination, const void* source, size_t n);

}  // namespace accel::shm_internal

namespace accel {

struct alignas(128) SharedMemoryGroup::Header {
  uint64_t magic;
  uint64_t local_size;
  uint64_t slot_bytes;
  alignas(64) std::atomic<uint32_t> wake;  // futex word, bumped to wake all
  std::atomic<uint32_t> sleepers;
  // Held (1) by the one local rank that is moving itself to another CPU
  // (SharedMemoryGroup::SharesCpu), so that two ranks do not move at once.
  alignas(64) std::atomic<uint32_t> mover;
  alignas(64) std::atomic<uint32_t> abort_state;
  int32_t aborted_by;
  char reason[shm_internal::kReasonBytes];
};

// One cache line per slot parity that carries a chunk's post, its call and,
// for a small chunk, its data: a rank waiting for a small collective moves
// one line per other rank instead of three (counter, call, slot data).
struct alignas(64) SharedMemoryGroup::Mailbox {
  std::atomic<uint64_t> posted;  // chunk + 1 of the chunk it holds
  std::atomic<uint64_t> call;    // its CallId
  char data[kMailboxBytes];
  static_assert(2 * sizeof(uint64_t) + kMailboxBytes == 64,
                "a mailbox is one cache line");
};

// Written only by its rank; read by the others.
struct alignas(128) SharedMemoryGroup::RankState {
  std::atomic<uint64_t> posted;   // chunks posted (chunk t: posted > t)
  std::atomic<uint64_t> reduced;  // chunks whose part this rank reduced
  std::atomic<uint64_t> call[2];  // the CallId of the chunk in each slot
  std::atomic<int32_t> cpu;       // where this rank last ran (sched_getcpu)
  Mailbox mailbox[2];             // by chunk parity, like the slots
};

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "shared memory counters must be lock-free");

}  // namespace accel
