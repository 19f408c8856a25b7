// Collectives among the ranks of one host, through shared memory: accel's
// own intra-host transport, under the Gloo backend (which adds Gloo between
// hosts, backends/gloo/gloo_transport.h).
//
//   accel::SharedMemoryGroup group(local_rank, local_size, global_ranks,
//                                  store, std::chrono::seconds(30));
//   accel::SharedMemoryGroup::Call call{sequence, deadline};
//   group.Allreduce(call, data, n, accel::DType::kFloat32,
//                   accel::ReduceOp::kSum);
//
// Why our own: Debian has no library with intra-host collectives (UCX 1.13
// gives point-to-point over shared memory, and no UCC or oneCCL is packaged),
// and one that accel owns can fail a call at its deadline and be aborted
// from the watchdog's thread, which Gloo's and MPI's collectives cannot.
//
// How: each rank owns two staging slots in one segment (shared_segment.h)
// and two counters: chunks posted and reduced. Data moves in slot-sized
// chunks, alternating slots, so that one rank can fill its next slot while
// the others still read the previous one; a rank reuses a slot only once
// every rank has posted the chunk after the one it held, which a rank does
// only after reading that one (so no third counter to publish). Allreduce
// splits each chunk into one part per rank: each rank reduces its part from
// every slot (in rank order, so results are identical everywhere) and the
// others copy it back. Small buffers, and every buffer between two ranks, are
// reduced whole by every rank instead: one exchange instead of two, for
// about the same memory traffic.
//
// A rank only accepts a chunk tagged with the same call (sequence number and
// arguments) as its own, so ranks that call different collectives wait
// rather than mix up data, and the watchdog reports them. A waiting rank
// polls (collectives in lockstep finish in microseconds), yielding its CPU
// when the rank it waits for shares it, then sleeps on a futex in the
// segment, so that ranks on shared cores do not burn each other's time. Any
// failure (timeout, Abort) poisons the segment: every local rank's current and
// later operations fail at once, naming the rank that gave up and why.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "accel/runtime/base/dtype.h"
#include "accel/runtime/store/store.h"
#include "backends/shm/shared_segment.h"

namespace accel {

struct SharedMemoryOptions {
  // Bytes each rank stages per step (two slots per rank in the segment).
  size_t slot_bytes = 256 << 10;
  // Up to this many bytes (and always with two ranks), every rank reduces
  // the whole buffer itself.
  size_t small_allreduce_bytes = 16 << 10;
  // How long a waiting rank polls before it sleeps on a futex. Collectives
  // in lockstep finish at memory speed while polling; a rank that sleeps is
  // woken through the scheduler (tens of microseconds, and the kernel tends
  // to move it onto its waker's CPU, where the two then take turns), so
  // polling lasts as long as a scheduler time slice. A rank that polls while
  // the one it waits for last ran on the same CPU moves to another CPU (at
  // most every 5 ms), or else yields its CPU.
  // With more local ranks than CPUs a waiting rank does not poll: the rank
  // it waits for may need its CPU. It yields the CPU for a while, then
  // sleeps.
  std::chrono::microseconds spin{1000};
};

class SharedMemoryGroup {
 public:
  // `receiver` value for results that every local rank wants.
  static constexpr int kEveryRank = -1;

  // Identifies one call on every local rank: the same sequence number for
  // the same call, different ones for different calls.
  struct Call {
    uint64_t sequence;
    std::chrono::steady_clock::time_point deadline;
    // The caller computes meanwhile (an async collective during backward):
    // a waiting rank polls only briefly, since the computation on this
    // host needs the CPU more than a fast wake-up.
    bool overlapped = false;
  };

  // global_ranks[r] is local rank r's rank in the job, for messages. The
  // store is private to this group (a prefix per host).
  SharedMemoryGroup(int local_rank, std::vector<int> global_ranks, Store& store,
                    std::chrono::milliseconds timeout,
                    const SharedMemoryOptions& options = {});
  ~SharedMemoryGroup();

  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

  // In place: buffer = op over the local ranks' buffers, on `receiver` (a
  // local rank) or on every rank.
  void Allreduce(const Call& call, void* buffer, size_t count, DType dtype,
                 ReduceOp op, int receiver = kEveryRank);
  // input: counts[0] + ... elements on every local rank; output: local rank
  // r's segment (counts[r] elements from counts[0] + ... + counts[r - 1])
  // reduced over the local ranks, in rank order as Allreduce reduces.
  // output may be this rank's own segment of input.
  void ReduceScatter(const Call& call, const void* input, void* output,
                     const std::vector<size_t>& counts, DType dtype,
                     ReduceOp op);
  // bytes[r] bytes from local rank r land at output + offsets[r], on
  // `receiver` or on every rank. `input` may be this rank's own place in
  // `output`.
  void Allgatherv(const Call& call, const void* input, void* output,
                  const std::vector<size_t>& bytes,
                  const std::vector<size_t>& offsets,
                  int receiver = kEveryRank);
  // In place: every local rank's buffer = local rank `root`'s.
  void Broadcast(const Call& call, void* buffer, size_t bytes, int root);
  void Barrier(const Call& call);

  // Makes every local rank's current and later operations fail, naming
  // this rank and `reason`. Any thread; the first reason wins.
  void Abort(const std::string& reason);

 private:
  struct Header;
  struct Mailbox;
  struct RankState;
  // Chunks of up to this many bytes per rank travel in the mailbox line.
  static constexpr size_t kMailboxBytes = 48;
  enum class Counter { kPosted, kReduced };

  // The chunk protocol; `id` tags the chunk with the call.
  uint64_t BeginChunk(const Call& call);
  // A chunk whose every rank's data fits kMailboxBytes is staged in the
  // mailboxes (`small`) rather than the slots; every local rank passes the
  // same `small` for a chunk.
  char* Staging(uint64_t chunk, bool small) const;
  const char* Staged(int rank, uint64_t chunk, bool small) const;
  void Post(uint64_t chunk, uint64_t id);
  void WaitPosted(const Call& call, uint64_t chunk, uint64_t id,
                  bool small = false, int only_rank = kEveryRank);
  void MarkReduced(uint64_t chunk);
  void WaitReduced(const Call& call, uint64_t chunk);

  bool Reached(Counter counter, int rank, uint64_t target) const;
  void Publish(Counter counter, uint64_t value);
  // Waits until ready() holds; `laggards` names who is missing at timeout.
  template <typename Ready, typename Laggards>
  void WaitUntil(const Call& call, Ready&& ready, Laggards&& laggards);
  [[noreturn]] void ThrowAborted() const;
  // Whether another local rank last ran on the CPU we run on (after trying
  // to move to another CPU).
  bool SharesCpu();
  // Whether another local rank last ran on `cpu`; *others_use gets the CPUs
  // the other local ranks last ran on.
  bool OthersOn(int cpu, cpu_set_t* others_use) const;
  // Oversubscribed: the kernel wakes a rank on its waker's CPU, and all the
  // local ranks can end up taking turns on one CPU while another idles (a
  // 4-byte allreduce at 4 ranks on 2 CPUs: ~22-35 us against ~10 us spread
  // 2 and 2). Moves this rank off a CPU with more local ranks than another,
  // at most every few milliseconds.
  void SpreadOverCpus();
  // Both above move at most every few milliseconds: true when this rank may
  // now, with the CPUs it may use in *allowed.
  bool MayMove(cpu_set_t* allowed);
  // Moves this rank's thread onto `target`, then lets it go anywhere in
  // `allowed` again; false if the kernel refused.
  bool MoveTo(const cpu_set_t& target, const cpu_set_t& allowed);
  void WakeAll();

  char* Slot(int rank, uint64_t chunk) const;
  RankState& State(int rank) const;
  std::string Name(int rank) const;  // "rank 3" (its rank in the job)
  // Runs one operation; a failure poisons the segment for every rank.
  template <typename Body>
  void Guarded(Body&& body);

  const int local_rank_;
  const int local_size_;
  const std::vector<int> global_ranks_;
  const SharedMemoryOptions options_;
  const bool oversubscribed_;  // More local ranks than usable CPUs.
  std::chrono::microseconds spin_;
  std::unique_ptr<SharedSegment> segment_;
  Header* header_ = nullptr;
  RankState* states_ = nullptr;
  char* slots_ = nullptr;
  uint64_t next_chunk_ = 0;
  // Chunks that every local rank has been seen to post (see BeginChunk).
  uint64_t chunks_posted_by_all_ = 0;
  std::chrono::steady_clock::time_point next_move_;  // See SharesCpu().
};

}  // namespace accel
