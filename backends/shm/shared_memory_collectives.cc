// SharedMemoryGroup's collectives (see shared_memory_group.h): barrier,
// broadcast, allgatherv, allreduce and reduce-scatter over the shared
// segment's chunks.
#include <algorithm>
#include <cstring>

#include "accel/runtime/base/errors.h"
#include "backends/shm/shared_memory_group.h"
#include "backends/shm/shared_memory_layout.h"

namespace accel {

using shm_internal::CallId;
using shm_internal::Copy;
using shm_internal::Kind;
using shm_internal::kRunning;
using shm_internal::Part;
using shm_internal::PartOf;

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
    WaitPosted(call, chunk, id, /*small=*/true);
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
    const bool small = bytes <= kMailboxBytes;
    for (size_t offset = 0; offset < bytes; offset += options_.slot_bytes) {
      const size_t n = std::min(options_.slot_bytes, bytes - offset);
      const uint64_t chunk = BeginChunk(call);
      if (local_rank_ == root) Copy(Staging(chunk, small), data + offset, n);
      Post(chunk, id);
      // Waiting for every rank, not only the root, checks that all of them
      // are in this call before anyone moves on.
      WaitPosted(call, chunk, id, small);
      if (local_rank_ != root) {
        Copy(data + offset, Staged(root, chunk, small), n);
      }
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
    const bool small = largest <= kMailboxBytes;
    for (size_t offset = 0; offset < largest; offset += options_.slot_bytes) {
      auto piece = [&](int r) {
        return bytes[r] > offset
                   ? std::min(options_.slot_bytes, bytes[r] - offset)
                   : size_t{0};
      };
      const uint64_t chunk = BeginChunk(call);
      const size_t own = piece(local_rank_);
      Copy(Staging(chunk, small), in + offset, own);
      Post(chunk, id);
      // Our own piece while the others post theirs.
      char* own_destination = out + offsets[local_rank_] + offset;
      if (receive && own > 0 && own_destination != in + offset) {
        Copy(own_destination, in + offset, own);
      }
      WaitPosted(call, chunk, id, small);
      if (receive) {
        for (int r = 0; r < local_size_; ++r) {
          const size_t n = piece(r);
          if (r != local_rank_ && n > 0) {
            Copy(out + offsets[r] + offset, Staged(r, chunk, small), n);
          }
        }
      }
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
        const bool small = n * element <= kMailboxBytes;
        Copy(Staging(chunk, small), own, n * element);
        Post(chunk, id);
        WaitPosted(call, chunk, id, small);
        if (receive) {
          Reduce(dtype, op, own, Staged(0, chunk, small),
                 Staged(1, chunk, small), n);
          for (int r = 2; r < local_size_; ++r) {
            Reduce(dtype, op, own, own, Staged(r, chunk, small), n);
          }
        }
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
    }
  });
}

void SharedMemoryGroup::ReduceScatter(const Call& call, const void* input,
                                      void* output,
                                      const std::vector<size_t>& counts,
                                      DType dtype, ReduceOp op) {
  Guarded([&] {
    const size_t element = ElementSize(dtype);
    CallId call_id(call.sequence);
    call_id.Add(static_cast<uint64_t>(Kind::kReduceScatter))
        .Add(static_cast<uint64_t>(dtype))
        .Add(static_cast<uint64_t>(op));
    std::vector<size_t> offsets(local_size_);
    size_t total = 0;
    size_t largest = 0;
    for (int r = 0; r < local_size_; ++r) {
      call_id.Add(counts[r]);
      offsets[r] = total;
      total += counts[r];
      largest = std::max(largest, counts[r]);
    }
    const uint64_t id = call_id.value();
    const char* in = static_cast<const char*>(input);
    char* out = static_cast<char*>(output);
    if (local_size_ == 1) {
      const char* own = in + offsets[0] * element;
      if (counts[0] > 0 && out != own) Copy(out, own, counts[0] * element);
      return;
    }
    // Each round, every rank puts the next piece of each rank's segment in
    // its slot, at that rank's part (its own cache lines where the slot is
    // large enough), and each rank reduces its part over all the slots.
    size_t step =
        std::max<size_t>(options_.slot_bytes / local_size_ / element, 1);
    if (step * element >= 64) step = step * element / 64 * 64 / element;
    const size_t stride = step * element;
    for (size_t begin = 0; begin < largest; begin += step) {
      auto piece = [&](int r) {
        return counts[r] > begin ? std::min(step, counts[r] - begin)
                                 : size_t{0};
      };
      const uint64_t chunk = BeginChunk(call);
      char* slot = Slot(local_rank_, chunk);
      // Our own piece too: `output` may be our segment of `input`, which
      // reducing into it overwrites.
      for (int q = 0; q < local_size_; ++q) {
        const size_t n = piece(q);
        if (n > 0) {
          Copy(slot + q * stride, in + (offsets[q] + begin) * element,
               n * element);
        }
      }
      Post(chunk, id);
      WaitPosted(call, chunk, id);
      const size_t n = piece(local_rank_);
      if (n > 0) {
        auto source = [&](int r) -> const char* {
          return Slot(r, chunk) + local_rank_ * stride;
        };
        char* destination = out + begin * element;
        Reduce(dtype, op, destination, source(0), source(1), n);
        for (int r = 2; r < local_size_; ++r) {
          Reduce(dtype, op, destination, destination, source(r), n);
        }
      }
    }
  });
}

}  // namespace accel
