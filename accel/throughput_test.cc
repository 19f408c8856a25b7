// The FLOPs count against PaLM's and nanoGPT's formula worked by hand, and
// the matmul peak's bounds and refusals.
#include "accel/throughput.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <stdexcept>

namespace accel {
namespace {

TEST(ThroughputTest, FlopsPerTokenIsSixNPlusAttention) {
  // GPT-2 small's shape as nanoGPT counts it: N = 124.3M less the 0.79M
  // of wpe, L 12, C 768, T 1024 -> 6 * 123.5M + 12 * 12 * 768 * 1024.
  const TransformerShape gpt2{.parameters = 123'532'032,
                              .n_layer = 12,
                              .n_embd = 768,
                              .sequence_length = 1024};
  EXPECT_DOUBLE_EQ(TransformerTrainingFlopsPerToken(gpt2),
                   6.0 * 123'532'032 + 12.0 * 12 * 768 * 1024);
  EXPECT_DOUBLE_EQ(TransformerTrainingFlopsPerToken({.parameters = 10}), 60);
}

TEST(ThroughputTest, MatmulPeakIsPositiveAndBelowTheClockBound) {
  const MatmulPeak peak = MeasureMatmulPeak(
      {.min_size = 64, .max_size = 256, .seconds_per_size = 0.02});
  EXPECT_GT(peak.flops_per_second, 1e6);
  // No core does 512 FLOPs a cycle at 6 GHz (AVX-512: 64 a cycle).
  EXPECT_LT(peak.flops_per_second, 512.0 * 6e9 * peak.threads);
  EXPECT_TRUE(peak.size == 64 || peak.size == 128 || peak.size == 256)
      << peak.size;
  EXPECT_EQ(peak.threads, BlasThreads());
}

TEST(ThroughputTest, SetCpuThreadsReachesLibTorchAndTheBlas) {
  SetCpuThreads(1);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_EQ(BlasThreads(), 1);
  SetCpuThreads(2);
  EXPECT_EQ(at::get_num_threads(), 2);
  EXPECT_EQ(BlasThreads(), 2);
}

TEST(ThroughputTest, RefusesBadOptions) {
  EXPECT_THROW(MeasureMatmulPeak({.min_size = 0}), std::invalid_argument);
  EXPECT_THROW(MeasureMatmulPeak({.min_size = 512, .max_size = 256}),
               std::invalid_argument);
  EXPECT_THROW(MeasureMatmulPeak({.seconds_per_size = 0}),
               std::invalid_argument);
}

}  // namespace
}  // namespace accel
