#include "accel/throughput.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/torch.h>

#include <chrono>
#include <stdexcept>

namespace accel {
namespace {

// Multiplies n x n matrices for about `seconds`; returns FLOP/s.
double MatmulRate(int64_t n, double seconds) {
  torch::NoGradGuard no_grad;
  const torch::Tensor a = torch::rand({n, n});
  const torch::Tensor b = torch::rand({n, n});
  torch::Tensor c = torch::empty({n, n});
  torch::mm_out(c, a, b);  // Warm-up: pages, BLAS buffers, threads.
  const double flops = 2.0 * static_cast<double>(n) * n * n;
  int64_t multiplies = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    torch::mm_out(c, a, b);
    ++multiplies;
    elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
  } while (elapsed < seconds);
  return flops * static_cast<double>(multiplies) / elapsed;
}

template <typename Function>
Function* OpenBlas(const char* name) {
  return reinterpret_cast<Function*>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

int BlasThreads() {
  if (auto* get = OpenBlas<int()>("openblas_get_num_threads")) return get();
  return at::get_num_threads();
}

void SetCpuThreads(int threads) {
  at::set_num_threads(threads);
  if (auto* set = OpenBlas<void(int)>("openblas_set_num_threads")) {
    set(threads);
  }
}

double TransformerTrainingFlopsPerToken(const TransformerShape& shape) {
  return 6.0 * static_cast<double>(shape.parameters) +
         12.0 * static_cast<double>(shape.n_layer) *
             static_cast<double>(shape.n_embd) *
             static_cast<double>(shape.sequence_length);
}

MatmulPeak MeasureMatmulPeak(const MatmulPeakOptions& options) {
  if (options.min_size < 1 || options.max_size < options.min_size ||
      !(options.seconds_per_size > 0)) {
    throw std::invalid_argument(
        "MeasureMatmulPeak: expected 1 <= min_size <= max_size and a positive "
        "seconds_per_size, found min_size " +
        std::to_string(options.min_size) + ", max_size " +
        std::to_string(options.max_size) + ", seconds_per_size " +
        std::to_string(options.seconds_per_size));
  }
  MatmulPeak best;
  best.threads = BlasThreads();
  for (int64_t n = options.min_size; n <= options.max_size; n *= 2) {
    const double rate = MatmulRate(n, options.seconds_per_size);
    if (rate > best.flops_per_second) {
      best.flops_per_second = rate;
      best.size = n;
    }
  }
  return best;
}

}  // namespace accel
