// Memory shared by the ranks of one host, which no exit path can leak.
//
//   // On every rank of the host, with a store only this group uses:
//   accel::SharedSegment segment(local_rank, local_size, bytes, store,
//                                std::chrono::seconds(30));
//   char* base = segment.data();  // the same bytes in every local rank
//
// Local rank 0 creates an anonymous memory file (memfd_create) and hands its
// descriptor to the other local ranks over a unix socket (SCM_RIGHTS). The
// file has no name anywhere, so the kernel frees it with the last process
// that maps it, however the processes end (SIGKILL included): there is
// nothing to clean up in /dev/shm, unlike with shm_open. The socket is in
// the abstract namespace (no file either) and only hands the descriptor to a
// process of the same user that presents a nonce which only the job's store
// holds, so other processes on the host cannot read the job's data.
#pragma once

#include <chrono>
#include <cstddef>

#include "accel/runtime/store/store.h"

namespace accel {

class SharedSegment {
 public:
  // Blocks until every local rank has the segment mapped. Zero-filled.
  // TimeoutError names the local ranks that did not arrive.
  SharedSegment(int local_rank, int local_size, size_t bytes, Store& store,
                std::chrono::milliseconds timeout);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  // Local rank 0: creates the file and serves it to the others.
  int CreateAndServe(int local_size, Store& store,
                     std::chrono::steady_clock::time_point deadline);
  // The other local ranks: fetch the descriptor from local rank 0.
  int Fetch(int local_rank, Store& store,
            std::chrono::steady_clock::time_point deadline);

  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace accel
