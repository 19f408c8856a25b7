#include "backends/shm/shared_memory_group.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <climits>
#include <cstring>
#include <thread>

#include "accel/runtime/base/errors.h"

namespace accel {

using Clock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kMagic = 0x6163636c73686d31;  // "acclshm1"
constexpr size_t kPageBytes = 4096;
// The longest a sleeping waiter goes without looking at the clock.
constexpr auto kLongestSleep = std::chrono::milliseconds(100);
// How long an overlapped call polls (see Call::overlapped): about what a
// futex wake-up costs.
constexpr auto kOverlappedSpin = std::chrono::microseconds(20);
constexpr size_t kReasonBytes = 512;

enum AbortState : uint32_t { kRunning = 0, kWriting = 1, kAborted = 2 };

// What a call's chunks are tagged with: the call's sequence number and
// arguments, so that different collectives never accept each other's data.
class CallId {
 public:
  explicit CallId(uint64_t sequence) { Add(sequence); }
  CallId& Add(uint64_t value) {
    // FNV-1a over the value's bytes.
    for (int i = 0; i < 8; ++i) {
      hash_ ^= (value >> (8 * i)) & 0xff;
      hash_ *= 0x100000001b3ull;
    }
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
  kBarrier
};

size_t RoundUp(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Copies n bytes between buffers that do not overlap. glibc's memcpy (rep
// movsb, for 4 KiB to 256 KiB on this machine's AMD EPYC) runs 13 times
// slower when the destination lies 1 to 31 bytes past the source modulo
// 4096 (3 GB/s instead of 40-50, measured): exactly where a malloc'd buffer,
// 16 bytes past a page, lands against our page-aligned slots. A plain vector
// loop has no such case.
void Copy(void* destination, const void* source, size_t n) {
  const uintptr_t distance = (reinterpret_cast<uintptr_t>(destination) -
                              reinterpret_cast<uintptr_t>(source)) %
                             4096;
  if (n < 2048 || distance == 0 || distance >= 64) {
    std::memcpy(destination, source, n);
    return;
  }
#if defined(__SSE2__)
  auto* to = static_cast<char*>(destination);
  const auto* from = static_cast<const char*>(source);
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i a =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i));
    const __m128i b =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i + 16));
    const __m128i c =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i + 32));
    const __m128i d =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i + 48));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + i), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + i + 16), b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + i + 32), c);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + i + 48), d);
  }
  std::memcpy(to + i, from + i, n - i);
#else
  std::memcpy(destination, source, n);
#endif
}

int UsableCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::thread::hardware_concurrency());
}

// The part of an n-element chunk that local rank q reduces: equal shares,
// each starting on a cache line.
struct Part {
  size_t begin;
  size_t count;
};
Part PartOf(size_t n, int parts, int q, size_t element) {
  const size_t align = std::max<size_t>(1, 64 / element);
  const size_t share = RoundUp((n + parts - 1) / parts, align);
  const size_t begin = std::min(n, share * q);
  return {begin, std::min(n, begin + share) - begin};
}

}  // namespace

struct alignas(128) SharedMemoryGroup::Header {
  uint64_t magic;
  uint64_t local_size;
  uint64_t slot_bytes;
  alignas(64) std::atomic<uint32_t> wake;  // futex word, bumped to wake all
  std::atomic<uint32_t> sleepers;
  alignas(64) std::atomic<uint32_t> abort_state;
  int32_t aborted_by;
  char reason[kReasonBytes];
};

// Written only by its rank; read by the others.
struct alignas(128) SharedMemoryGroup::RankState {
  std::atomic<uint64_t> posted;    // chunks posted (chunk t: posted > t)
  std::atomic<uint64_t> reduced;   // chunks whose part this rank reduced
  std::atomic<uint64_t> consumed;  // chunks this rank is done reading
  std::atomic<uint64_t> call[2];   // the CallId of the chunk in each slot
  std::atomic<int32_t> cpu;        // where this rank last ran (sched_getcpu)
};

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "shared memory counters must be lock-free");

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
      spin_(local_size_ > UsableCpus() ? std::chrono::microseconds(0)
                                       : options.spin) {
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
      counter == Counter::kPosted    ? state.posted
      : counter == Counter::kReduced ? state.reduced
                                     : state.consumed;
  return value.load(std::memory_order_acquire) >= target;
}

void SharedMemoryGroup::WakeAll() {
  header_->wake.fetch_add(1, std::memory_order_seq_cst);
  syscall(SYS_futex, &header_->wake, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void SharedMemoryGroup::Publish(Counter counter, uint64_t value) {
  RankState& state = State(local_rank_);
  std::atomic<uint64_t>& target = counter == Counter::kPosted ? state.posted
                                  : counter == Counter::kReduced
                                      ? state.reduced
                                      : state.consumed;
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
  // last ran on our CPU may be waiting for it: give it the CPU.
  const auto spin_until =
      Clock::now() +
      (call.overlapped ? std::min(spin_, kOverlappedSpin) : spin_);
  for (uint32_t i = 1;; ++i) {
    Pause();
    if (ready()) return;
    if (i % 64 == 0) {
      check_abort();
      if (Clock::now() >= spin_until) break;
      if (SharesCpu()) sched_yield();
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

bool SharedMemoryGroup::SharesCpu() {
  const int cpu = sched_getcpu();
  cpu_set_t others_use;
  CPU_ZERO(&others_use);
  bool shared = false;
  for (int r = 0; r < local_size_; ++r) {
    if (r == local_rank_) continue;
    const int other = State(r).cpu.load(std::memory_order_relaxed);
    if (other == cpu) shared = true;
    if (other >= 0 && other < CPU_SETSIZE) CPU_SET(other, &others_use);
  }
  if (!shared) return false;
  // The kernel wakes a sleeping thread on its waker's CPU, so two ranks can
  // end up taking turns on one CPU while another has room (8 us per
  // collective instead of 0.2, measured). Move to a CPU that no other local
  // rank last ran on, or any other, then let the thread go anywhere again.
  // At most every few milliseconds, so as not to fight the scheduler.
  const auto now = Clock::now();
  if (now < next_move_) return true;
  next_move_ = now + std::chrono::milliseconds(5);
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return true;
  cpu_set_t target;
  CPU_AND(&target, &allowed, &others_use);
  CPU_XOR(&target, &allowed, &target);  // allowed and not used by others
  if (CPU_COUNT(&target) == 0) {
    target = allowed;
    CPU_CLR(cpu, &target);
    if (CPU_COUNT(&target) == 0) return true;
  }
  if (sched_setaffinity(0, sizeof(target), &target) != 0) return true;
  sched_setaffinity(0, sizeof(allowed), &allowed);
  State(local_rank_).cpu.store(sched_getcpu(), std::memory_order_relaxed);
  return false;
}

uint64_t SharedMemoryGroup::BeginChunk(const Call& call) {
  const uint64_t chunk = next_chunk_++;
  if (chunk < 2) return chunk;
  // Our slot for this chunk held chunk - 2: every rank must be done with it.
  const uint64_t target = chunk - 1;
  WaitUntil(
      call,
      [&] {
        for (int r = 0; r < local_size_; ++r) {
          if (r != local_rank_ && !Reached(Counter::kConsumed, r, target)) {
            return false;
          }
        }
        return true;
      },
      [&] {
        std::string names;
        for (int r = 0; r < local_size_; ++r) {
          if (r != local_rank_ && !Reached(Counter::kConsumed, r, target)) {
            names += (names.empty() ? "" : ", ") + Name(r);
          }
        }
        return names + " to finish reading the previous collective";
      });
  return chunk;
}

void SharedMemoryGroup::Post(uint64_t chunk, uint64_t id) {
  State(local_rank_).cpu.store(sched_getcpu(), std::memory_order_relaxed);
  State(local_rank_).call[chunk % 2].store(id, std::memory_order_relaxed);
  Publish(Counter::kPosted, chunk + 1);
}

void SharedMemoryGroup::WaitPosted(const Call& call, uint64_t chunk,
                                   uint64_t id, int only_rank) {
  auto posted = [&](int r) {
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

void SharedMemoryGroup::Consume(uint64_t chunk) {
  Publish(Counter::kConsumed, chunk + 1);
}

template <typename Body>
void SharedMemoryGroup::Guarded(Body&& body) {
  if (header_->abort_state.load(std::memory_order_relaxed) != kRunning) {
    ThrowAborted();
  }
  try {
    body();
  } catch (const std::exception& e) {
    // Our counters are now out of step with the others': nobody may go on.
    Abort(e.what());
    throw;
  }
}

void SharedMemoryGroup::Barrier(const Call& call) {
  Guarded([&] {
    const uint64_t id = CallId(call.sequence)
                            .Add(static_cast<uint64_t>(Kind::kBarrier))
                            .value();
    const uint64_t chunk = BeginChunk(call);
    Post(chunk, id);
    WaitPosted(call, chunk, id);
    Consume(chunk);
  });
}

void SharedMemoryGroup::Broadcast(const Call& call, void* buffer, size_t bytes,
                                  int root) {
  Guarded([&] {
    const uint64_t id = CallId(call.sequence)
                            .Add(static_cast<uint64_t>(Kind::kBroadcast))
                            .Add(bytes)
                            .Add(static_cast<uint64_t>(root))
                            .value();
    char* data = static_cast<char*>(buffer);
    for (size_t offset = 0; offset < bytes; offset += options_.slot_bytes) {
      const size_t n = std::min(options_.slot_bytes, bytes - offset);
      const uint64_t chunk = BeginChunk(call);
      if (local_rank_ == root) Copy(Slot(root, chunk), data + offset, n);
      Post(chunk, id);
      // Waiting for every rank, not only the root, checks that all of them
      // are in this call before anyone moves on.
      WaitPosted(call, chunk, id);
      if (local_rank_ != root) Copy(data + offset, Slot(root, chunk), n);
      Consume(chunk);
    }
  });
}

void SharedMemoryGroup::Allgatherv(const Call& call, const void* input,
                                   void* output,
                                   const std::vector<size_t>& bytes,
                                   const std::vector<size_t>& offsets,
                                   int receiver) {
  Guarded([&] {
    CallId call_id(call.sequence);
    call_id.Add(static_cast<uint64_t>(Kind::kAllgatherv))
        .Add(static_cast<uint64_t>(receiver));
    size_t largest = 0;
    for (size_t b : bytes) {
      call_id.Add(b);
      largest = std::max(largest, b);
    }
    const uint64_t id = call_id.value();
    const bool receive = receiver == kEveryRank || receiver == local_rank_;
    char* out = static_cast<char*>(output);
    const char* in = static_cast<const char*>(input);
    const size_t mine = bytes[local_rank_];
    // Our input inside the output anywhere but at our own place would be
    // overwritten by the others' data before we have sent all of it.
    std::vector<char> copy;
    if (receive && mine > 0 && in != out + offsets[local_rank_]) {
      size_t out_bytes = 0;
      for (int r = 0; r < local_size_; ++r) {
        out_bytes = std::max(out_bytes, offsets[r] + bytes[r]);
      }
      const auto in_at = reinterpret_cast<uintptr_t>(in);
      const auto out_at = reinterpret_cast<uintptr_t>(out);
      if (in_at < out_at + out_bytes && out_at < in_at + mine) {
        copy.assign(in, in + mine);
        in = copy.data();
      }
    }
    for (size_t offset = 0; offset < largest; offset += options_.slot_bytes) {
      auto piece = [&](int r) {
        return bytes[r] > offset
                   ? std::min(options_.slot_bytes, bytes[r] - offset)
                   : size_t{0};
      };
      const uint64_t chunk = BeginChunk(call);
      Copy(Slot(local_rank_, chunk), in + offset, piece(local_rank_));
      Post(chunk, id);
      WaitPosted(call, chunk, id);
      if (receive) {
        for (int r = 0; r < local_size_; ++r) {
          const size_t n = piece(r);
          if (n == 0) continue;
          char* destination = out + offsets[r] + offset;
          const char* source = r == local_rank_ ? in + offset : Slot(r, chunk);
          if (destination != source) Copy(destination, source, n);
        }
      }
      Consume(chunk);
    }
  });
}

void SharedMemoryGroup::Allreduce(const Call& call, void* buffer, size_t count,
                                  DType dtype, ReduceOp op, int receiver) {
  Guarded([&] {
    if (local_size_ == 1) return;
    const size_t element = ElementSize(dtype);
    const uint64_t id = CallId(call.sequence)
                            .Add(static_cast<uint64_t>(Kind::kAllreduce))
                            .Add(static_cast<uint64_t>(dtype))
                            .Add(static_cast<uint64_t>(op))
                            .Add(count)
                            .Add(static_cast<uint64_t>(receiver))
                            .value();
    const bool receive = receiver == kEveryRank || receiver == local_rank_;
    char* data = static_cast<char*>(buffer);
    const size_t bytes = count * element;
    // Two ranks: reducing the whole chunk from the other's slot costs about
    // the memory traffic of reducing half and copying the other half back,
    // with one exchange per chunk instead of two.
    if (local_size_ == 2 || bytes <= options_.small_allreduce_bytes ||
        count < static_cast<size_t>(local_size_)) {
      // Every rank reduces every slot in rank order: one exchange per chunk.
      const size_t step = options_.slot_bytes / element;
      for (size_t begin = 0; begin < count; begin += step) {
        const size_t n = std::min(step, count - begin);
        char* own = data + begin * element;
        const uint64_t chunk = BeginChunk(call);
        Copy(Slot(local_rank_, chunk), own, n * element);
        Post(chunk, id);
        WaitPosted(call, chunk, id);
        if (receive) {
          Reduce(dtype, op, own, Slot(0, chunk), Slot(1, chunk), n);
          for (int r = 2; r < local_size_; ++r) {
            Reduce(dtype, op, own, own, Slot(r, chunk), n);
          }
        }
        Consume(chunk);
      }
      return;
    }
    // Reduce-scatter then allgather, one chunk at a time.
    const size_t step = options_.slot_bytes / element;
    for (size_t begin = 0; begin < count; begin += step) {
      const size_t n = std::min(step, count - begin);
      char* base = data + begin * element;
      const uint64_t chunk = BeginChunk(call);
      char* slot = Slot(local_rank_, chunk);
      // The others need every part of ours but our own.
      for (int q = 0; q < local_size_; ++q) {
        const Part part = PartOf(n, local_size_, q, element);
        if (q != local_rank_ && part.count > 0) {
          Copy(slot + part.begin * element, base + part.begin * element,
               part.count * element);
        }
      }
      Post(chunk, id);
      WaitPosted(call, chunk, id);
      const Part mine = PartOf(n, local_size_, local_rank_, element);
      if (mine.count > 0) {
        const size_t at = mine.begin * element;
        auto source = [&](int r) -> const char* {
          return r == local_rank_ ? base + at : Slot(r, chunk) + at;
        };
        // The sum lands in our slot, where the others copy it from.
        Reduce(dtype, op, slot + at, source(0), source(1), mine.count);
        for (int r = 2; r < local_size_; ++r) {
          Reduce(dtype, op, slot + at, slot + at, source(r), mine.count);
        }
        if (receive) Copy(base + at, slot + at, mine.count * element);
      }
      MarkReduced(chunk);
      if (receive) {
        WaitReduced(call, chunk);
        for (int q = 0; q < local_size_; ++q) {
          const Part part = PartOf(n, local_size_, q, element);
          if (q != local_rank_ && part.count > 0) {
            Copy(base + part.begin * element,
                 Slot(q, chunk) + part.begin * element, part.count * element);
          }
        }
      }
      Consume(chunk);
    }
  });
}

}  // namespace accel
