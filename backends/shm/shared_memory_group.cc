#include "backends/shm/shared_memory_group.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <thread>

#include "accel/runtime/base/errors.h"
#include "backends/shm/shared_memory_layout.h"

namespace accel {

using shm_internal::kAborted;
using shm_internal::kLongestSleep;
using shm_internal::kMagic;
using shm_internal::kOverlappedSpin;
using shm_internal::kOversubscribedYield;
using shm_internal::kPageBytes;
using shm_internal::kReasonBytes;
using shm_internal::kRunning;
using shm_internal::kWriting;
using shm_internal::Pause;
using shm_internal::RoundUp;

using Clock = std::chrono::steady_clock;

namespace {

int UsableCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::thread::hardware_concurrency());
}

}  // namespace

SharedMemoryGroup::SharedMemoryGroup(int local_rank,
                                     std::vector<int> global_ranks,
                                     Store& store,
                                     std::chrono::milliseconds timeout,
                                     const SharedMemoryOptions& options)
    : local_rank_(local_rank),
      local_size_(static_cast<int>(global_ranks.size())),
      global_ranks_(std::move(global_ranks)),
      options_(options),
      // More local ranks than CPUs: a waiting rank holds a CPU that the
      // rank it waits for may need, so it sleeps at once.
      oversubscribed_(local_size_ > UsableCpus()),
      spin_(oversubscribed_ ? std::chrono::microseconds(0) : options.spin) {
  if (options_.slot_bytes < 4096 || options_.slot_bytes % 64 != 0) {
    throw UsageError(
        "shared memory slots must be a multiple of 64 bytes and "
        "at least 4096, found " +
        std::to_string(options_.slot_bytes));
  }
  const size_t states_offset = RoundUp(sizeof(Header), 128);
  const size_t slots_offset =
      RoundUp(states_offset + sizeof(RankState) * local_size_, kPageBytes);
  const size_t bytes = slots_offset + 2 * options_.slot_bytes * local_size_;
  segment_ = std::make_unique<SharedSegment>(local_rank_, local_size_, bytes,
                                             store, timeout);
  // Zero-filled memory is a valid initial state for every field (lock-free
  // atomics are plain words); the sizes are written by local rank 0 and
  // checked by the others after the first barrier.
  header_ = reinterpret_cast<Header*>(segment_->data());
  states_ = reinterpret_cast<RankState*>(segment_->data() + states_offset);
  slots_ = segment_->data() + slots_offset;
  State(local_rank_).cpu.store(-1, std::memory_order_relaxed);
  if (local_rank_ == 0) {
    header_->local_size = static_cast<uint64_t>(local_size_);
    header_->slot_bytes = options_.slot_bytes;
    header_->magic = kMagic;
  }
  Barrier({0, Clock::now() + timeout});
  if (header_->magic != kMagic ||
      header_->local_size != static_cast<uint64_t>(local_size_) ||
      header_->slot_bytes != options_.slot_bytes) {
    throw Error("local ranks disagree on the shared memory layout");
  }
}

SharedMemoryGroup::~SharedMemoryGroup() = default;

char* SharedMemoryGroup::Slot(int rank, uint64_t chunk) const {
  return slots_ +
         (2 * static_cast<size_t>(rank) + chunk % 2) * options_.slot_bytes;
}

SharedMemoryGroup::RankState& SharedMemoryGroup::State(int rank) const {
  return states_[rank];
}

std::string SharedMemoryGroup::Name(int rank) const {
  return "rank " + std::to_string(global_ranks_[rank]);
}

bool SharedMemoryGroup::Reached(Counter counter, int rank,
                                uint64_t target) const {
  const RankState& state = State(rank);
  const std::atomic<uint64_t>& value =
      counter == Counter::kPosted ? state.posted : state.reduced;
  return value.load(std::memory_order_acquire) >= target;
}

void SharedMemoryGroup::WakeAll() {
  header_->wake.fetch_add(1, std::memory_order_seq_cst);
  syscall(SYS_futex, &header_->wake, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void SharedMemoryGroup::Publish(Counter counter, uint64_t value) {
  RankState& state = State(local_rank_);
  std::atomic<uint64_t>& target =
      counter == Counter::kPosted ? state.posted : state.reduced;
  target.store(value, std::memory_order_release);
  // Pairs with the waiter's fence: either it sees the new value before it
  // sleeps, or we see it registered as a sleeper and wake it.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (header_->sleepers.load(std::memory_order_relaxed) != 0) WakeAll();
}

void SharedMemoryGroup::ThrowAborted() const {
  // The aborting rank writes its reason before it publishes kAborted.
  for (int i = 0; i < 1000 && header_->abort_state.load(
                                  std::memory_order_acquire) == kWriting;
       ++i) {
    std::this_thread::yield();
  }
  if (header_->abort_state.load(std::memory_order_acquire) != kAborted) {
    throw PeerError(
        "another local rank stopped the shared memory "
        "collectives");
  }
  const int by = header_->aborted_by;
  const std::string reason(header_->reason,
                           strnlen(header_->reason, kReasonBytes));
  if (by == global_ranks_[local_rank_]) throw PeerError(reason);
  throw PeerError("rank " + std::to_string(by) +
                  " stopped the shared memory collectives: " + reason);
}

void SharedMemoryGroup::Abort(const std::string& reason) {
  uint32_t expected = kRunning;
  if (header_->abort_state.compare_exchange_strong(expected, kWriting)) {
    header_->aborted_by = global_ranks_[local_rank_];
    const size_t n = std::min(reason.size(), kReasonBytes - 1);
    std::memcpy(header_->reason, reason.data(), n);
    header_->reason[n] = '\0';
    header_->abort_state.store(kAborted, std::memory_order_release);
  }
  WakeAll();
}

template <typename Ready, typename Laggards>
void SharedMemoryGroup::WaitUntil(const Call& call, Ready&& ready,
                                  Laggards&& laggards) {
  if (ready()) return;
  auto check_abort = [&] {
    if (header_->abort_state.load(std::memory_order_relaxed) != kRunning) {
      ThrowAborted();
    }
  };
  auto time_out = [&] {
    throw TimeoutError("waited for " + laggards() + " in shared memory");
  };
  // Poll: in lockstep, the others arrive within microseconds. A rank that
  // last ran on our CPU may be waiting for it: give it the CPU. Not when
  // oversubscribed: the rank we wait for most likely waits for our CPU, and
  // there is no free CPU to move to.
  // The clock is read from the first check on: in lockstep the others
  // arrive before it, and a read costs about a tenth of a latency-bound call.
  Clock::time_point spin_until;
  for (uint32_t i = 1; !oversubscribed_ || call.overlapped; ++i) {
    Pause();
    if (ready()) return;
    if (i % 64 == 0) {
      check_abort();
      const auto now = Clock::now();
      if (i == 64) {
        spin_until =
            now + (call.overlapped ? std::min(spin_, kOverlappedSpin) : spin_);
      } else if (now >= spin_until) {
        break;
      }
      if (SharesCpu()) sched_yield();
    }
  }
  // Oversubscribed (spin_ is 0): yield to the ranks sharing our CPU for a
  // while, unless computation overlaps the call and needs the CPU more.
  if (oversubscribed_ && !call.overlapped) {
    SpreadOverCpus();
    const auto yield_until = Clock::now() + kOversubscribedYield;
    while (Clock::now() < yield_until) {
      sched_yield();
      if (ready()) return;
      check_abort();
    }
  }
  // Sleep on the segment's futex word until a rank publishes progress.
  header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
  struct Leave {
    std::atomic<uint32_t>& sleepers;
    ~Leave() { sleepers.fetch_sub(1, std::memory_order_relaxed); }
  } leave{header_->sleepers};
  while (true) {
    const uint32_t seen = header_->wake.load(std::memory_order_acquire);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (ready()) return;
    check_abort();
    const auto now = Clock::now();
    if (now >= call.deadline) time_out();
    const auto sleep =
        std::min<Clock::duration>(call.deadline - now, kLongestSleep);
    const auto seconds =
        std::chrono::duration_cast<std::chrono::seconds>(sleep);
    timespec relative{
        static_cast<time_t>(seconds.count()),
        static_cast<long>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                              sleep - seconds)
                              .count())};
    syscall(SYS_futex, &header_->wake, FUTEX_WAIT, seen, &relative, nullptr, 0);
  }
}

bool SharedMemoryGroup::OthersOn(int cpu, cpu_set_t* others_use) const {
  CPU_ZERO(others_use);
  bool shared = false;
  for (int r = 0; r < local_size_; ++r) {
    if (r == local_rank_) continue;
    const int other = State(r).cpu.load(std::memory_order_acquire);
    if (other == cpu) shared = true;
    if (other >= 0 && other < CPU_SETSIZE) CPU_SET(other, others_use);
  }
  return shared;
}

bool SharedMemoryGroup::SharesCpu() {
  cpu_set_t others_use;
  if (!OthersOn(sched_getcpu(), &others_use)) return false;
  // The kernel wakes a sleeping thread on its waker's CPU, so two ranks can
  // end up taking turns on one CPU while another has room (8 us per
  // collective instead of 0.2, measured). Move to a CPU that no other local
  // rank last ran on, or any other, then let the thread go anywhere again.
  // At most every few milliseconds, so as not to fight the scheduler.
  cpu_set_t allowed;
  if (!MayMove(&allowed)) return true;
  // One rank moves at a time. Two ranks sharing a CPU both see it; moving
  // at once, each would head for the CPU the other has just left and land
  // together again (measured after a rank slept through a 300 ms wait:
  // both moved in step every 5 ms for seconds, 8.9 us per barrier).
  uint32_t free = 0;
  if (!header_->mover.compare_exchange_strong(free, 1,
                                              std::memory_order_acquire)) {
    return true;
  }
  struct Release {
    std::atomic<uint32_t>& mover;
    ~Release() { mover.store(0, std::memory_order_release); }
  } release{header_->mover};
  // Read again: the rank that moved before us has published where it went.
  const int cpu = sched_getcpu();
  if (!OthersOn(cpu, &others_use)) return false;
  cpu_set_t target;
  CPU_AND(&target, &allowed, &others_use);
  CPU_XOR(&target, &allowed, &target);  // allowed and not used by others
  if (CPU_COUNT(&target) == 0) {
    target = allowed;
    CPU_CLR(cpu, &target);
    if (CPU_COUNT(&target) == 0) return true;
  }
  return !MoveTo(target, allowed);
}

bool SharedMemoryGroup::MayMove(cpu_set_t* allowed) {
  const auto now = Clock::now();
  if (now < next_move_) return false;
  next_move_ = now + std::chrono::milliseconds(5);
  return sched_getaffinity(0, sizeof(*allowed), allowed) == 0;
}

bool SharedMemoryGroup::MoveTo(const cpu_set_t& target,
                               const cpu_set_t& allowed) {
  if (sched_setaffinity(0, sizeof(target), &target) != 0) return false;
  sched_setaffinity(0, sizeof(allowed), &allowed);
  State(local_rank_).cpu.store(sched_getcpu(), std::memory_order_release);
  return true;
}

void SharedMemoryGroup::SpreadOverCpus() {
  cpu_set_t allowed;
  if (!MayMove(&allowed)) return;
  const int cpu = sched_getcpu();
  std::vector<int> ranks_on(CPU_SETSIZE, 0);
  int highest_here = local_rank_;
  for (int r = 0; r < local_size_; ++r) {
    const int other =
        r == local_rank_ ? cpu : State(r).cpu.load(std::memory_order_relaxed);
    if (other < 0 || other >= CPU_SETSIZE) continue;
    ++ranks_on[other];
    if (other == cpu) highest_here = std::max(highest_here, r);
  }
  // One rank moves at a time, the highest of those crowding a CPU, so that
  // two do not trade places.
  if (highest_here != local_rank_ || cpu < 0 || cpu >= CPU_SETSIZE) return;
  int target = -1;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed) &&
        (target < 0 || ranks_on[c] < ranks_on[target])) {
      target = c;
    }
  }
  if (target < 0 || ranks_on[target] + 1 >= ranks_on[cpu]) return;
  cpu_set_t only;
  CPU_ZERO(&only);
  CPU_SET(target, &only);
  MoveTo(only, allowed);
}

uint64_t SharedMemoryGroup::BeginChunk(const Call& call) {
  const uint64_t chunk = next_chunk_++;
  // Our slot for this chunk held chunk - 2. A rank reads a chunk's slots
  // before it begins its next chunk, so every rank is done with chunk - 2
  // once it has posted chunk - 1. Each chunk waits for every rank's post,
  // so that is known here without reading shared memory (one cache line
  // fewer to move per chunk: a barrier took 0.59 us, with a third counter
  // to publish and read, between two pinned threads); the wait below runs
  // only if the wait for the previous chunk failed.
  if (chunk < 2 || chunks_posted_by_all_ >= chunk) return chunk;
  auto behind = [&](int r) {
    return r != local_rank_ && !Reached(Counter::kPosted, r, chunk);
  };
  WaitUntil(
      call,
      [&] {
        for (int r = 0; r < local_size_; ++r) {
          if (behind(r)) return false;
        }
        return true;
      },
      [&] {
        std::string names;
        for (int r = 0; r < local_size_; ++r) {
          if (behind(r)) names += (names.empty() ? "" : ", ") + Name(r);
        }
        return names + " to finish reading the previous collective";
      });
  chunks_posted_by_all_ = chunk;
  return chunk;
}

char* SharedMemoryGroup::Staging(uint64_t chunk, bool small) const {
  return small ? State(local_rank_).mailbox[chunk % 2].data
               : Slot(local_rank_, chunk);
}

const char* SharedMemoryGroup::Staged(int rank, uint64_t chunk,
                                      bool small) const {
  return small ? State(rank).mailbox[chunk % 2].data : Slot(rank, chunk);
}

void SharedMemoryGroup::Post(uint64_t chunk, uint64_t id) {
  RankState& state = State(local_rank_);
  state.cpu.store(sched_getcpu(), std::memory_order_relaxed);
  state.call[chunk % 2].store(id, std::memory_order_relaxed);
  Mailbox& mailbox = state.mailbox[chunk % 2];
  mailbox.call.store(id, std::memory_order_relaxed);
  mailbox.posted.store(chunk + 1, std::memory_order_release);
  Publish(Counter::kPosted, chunk + 1);
}

void SharedMemoryGroup::WaitPosted(const Call& call, uint64_t chunk,
                                   uint64_t id, bool small, int only_rank) {
  auto posted = [&](int r) {
    if (small) {
      const Mailbox& mailbox = State(r).mailbox[chunk % 2];
      return mailbox.posted.load(std::memory_order_acquire) >= chunk + 1 &&
             mailbox.call.load(std::memory_order_relaxed) == id;
    }
    return Reached(Counter::kPosted, r, chunk + 1) &&
           State(r).call[chunk % 2].load(std::memory_order_relaxed) == id;
  };
  WaitUntil(
      call,
      [&] {
        if (only_rank != kEveryRank) return posted(only_rank);
        for (int r = 0; r < local_size_; ++r) {
          if (r != local_rank_ && !posted(r)) return false;
        }
        return true;
      },
      [&] {
        std::string names;
        for (int r = 0; r < local_size_; ++r) {
          if (r == local_rank_ || posted(r) ||
              (only_rank != kEveryRank && r != only_rank)) {
            continue;
          }
          names += (names.empty() ? "" : ", ") + Name(r);
          if (Reached(Counter::kPosted, r, chunk + 1)) {
            names += " (which is in a different collective)";
          }
        }
        return names;
      });
  if (only_rank == kEveryRank) chunks_posted_by_all_ = chunk + 1;
}

void SharedMemoryGroup::MarkReduced(uint64_t chunk) {
  Publish(Counter::kReduced, chunk + 1);
}

void SharedMemoryGroup::WaitReduced(const Call& call, uint64_t chunk) {
  auto missing = [&](int r) {
    return r != local_rank_ && !Reached(Counter::kReduced, r, chunk + 1);
  };
  WaitUntil(
      call,
      [&] {
        for (int r = 0; r < local_size_; ++r) {
          if (missing(r)) return false;
        }
        return true;
      },
      [&] {
        std::string names;
        for (int r = 0; r < local_size_; ++r) {
          if (missing(r)) names += (names.empty() ? "" : ", ") + Name(r);
        }
        return names + " to reduce its part";
      });
}

}  // namespace accel
