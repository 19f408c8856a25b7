// Keeps memory that the process frees for its own reuse, instead of handing
// it back to the system after every large tensor.
//
//   accel::ReuseFreedHostMemory();  // Once, early; the Accelerator does it
//                                   // unless --reuse_host_memory=false.
//
// Why: glibc serves a large allocation with its own mmap and unmaps it on
// free (from 128 KiB; the threshold rises as such blocks are freed, but never
// above 32 MiB), so each large tensor a training step creates (a 4096 x 4096
// weight's gradient, AdamW's temporaries) costs one page fault per 4 KiB
// page, every step: about 210 of the 456 ms step of a 25M-parameter MLP on
// this project's 2-core machine (tools/bench/ddp). Kept in the heap, the pages
// are faulted in once. This is what CUDA's caching allocator does for GPU
// memory, and what tcmalloc or jemalloc would give on the CPU; the price is
// that the process's resident memory stays at its peak rather than shrinking
// after it.
#pragma once

#include <string>

namespace accel {

// Sets glibc's malloc never to map large blocks on their own and never to
// trim the heap, unless the user set the same through the environment
// (MALLOC_MMAP_MAX_, MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, or
// GLIBC_TUNABLES with glibc.malloc.mmap_max, mmap_threshold or
// trim_threshold), whose choice wins. Returns what it did, for the logs.
std::string ReuseFreedHostMemory();

// Undoes ReuseFreedHostMemory (glibc's defaults: large blocks mapped on
// their own, the heap trimmed) and hands back what the heap holds free now.
// For a process that ran out of memory and tries again with less: memory
// kept for reuse is split among malloc's arenas and sizes, so a try that
// needs less could still fail where the same blocks, returned, would fit.
std::string ReturnFreedHostMemory();

}  // namespace accel
