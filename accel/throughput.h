// Model FLOPs utilization (MFU) of transformer training on this machine:
// the FLOPs a model needs per token, and the measured matrix-multiply peak
// that MFU divides by. nanoGPT, llm.c and Accelerate's nd_parallel example
// report MFU against a GPU's datasheet peak; a CPU has no such figure that
// holds (clocks, AVX frequency licences, the BLAS's kernels), so accel
// measures one: torch::mm on square float32 matrices, with the BLAS and
// intra-op threads LibTorch uses in this process.
//
//   const double peak = accel::MeasureMatmulPeak().flops_per_second;
//   const double per_token = accel::TransformerTrainingFlopsPerToken(
//       {.parameters = n, .n_layer = 4, .n_embd = 128, .sequence_length =
//       128});
//   const double mfu = per_token * tokens_per_second / peak;
//
// Several processes sharing the cores measure at the same time, each with
// its threads, and add their peaks (what //examples:gpt does): one process
// alone would get the turbo clock and the whole cache the job never has.
#pragma once

#include <cstdint>

namespace accel {

// A decoder-only transformer as PaLM's appendix B counts it.
struct TransformerShape {
  // The parameters the matrix multiplies use: all of them, less the
  // position embedding (a lookup); a head tied to the token embedding
  // counts once, as it multiplies once.
  int64_t parameters = 0;
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t sequence_length = 0;
};

// FLOPs of one token's forward and backward: 6 N (2 per weight forward,
// 4 backward) plus attention's scores and weighted sum, 12 L C T (PaLM,
// nanoGPT's estimate_mfu; the causal mask's skipped half counted, as they
// count it).
double TransformerTrainingFlopsPerToken(const TransformerShape& shape);

struct MatmulPeakOptions {
  // Square sizes tried, doubling from min_size to max_size; the best wins.
  int64_t min_size = 256;
  int64_t max_size = 2048;
  // Timing per size (after one warm-up multiply).
  double seconds_per_size = 0.25;
};

struct MatmulPeak {
  double flops_per_second = 0;  // 2 n^3 per multiply, the best size's.
  int64_t size = 0;             // That n.
  int threads = 0;              // BlasThreads() while measuring.
};

// The threads a matrix multiply runs on in this process. Debian's LibTorch
// multiplies through OpenBLAS, which starts its own threads (all cores
// unless OPENBLAS_NUM_THREADS or OMP_NUM_THREADS says otherwise, as the
// launcher's does for each of several processes) that at::set_num_threads
// does not reach: OpenBLAS's count where it is loaded, else LibTorch's.
int BlasThreads();

// Sets LibTorch's intra-op threads and, where loaded, OpenBLAS's.
void SetCpuThreads(int threads);

// Throws std::invalid_argument for sizes below 1 or min above max, or a
// non-positive time.
MatmulPeak MeasureMatmulPeak(const MatmulPeakOptions& options = {});

}  // namespace accel
