// find_executable_batch_size at 1-3 processes: the last rank runs out of
// memory (a real LibTorch allocation failure) in the middle of a training
// step while the others wait in the gradient allreduce for it; every rank
// must leave that try within seconds, agree, and retry with the same
// smaller size over a renewed communicator until the step fits, then train
// to the same parameters everywhere. Other failures stop every rank,
// naming the rank; a search that reaches zero says which sizes it tried.
#include "accel/memory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <stdexcept>
#include <system_error>

#include "accel/accelerator.h"
#include "accel/runtime/base/errors.h"
#include "tests/multiprocess_main.h"

namespace accel::testing {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

Accelerator& A() { return SharedAccelerator(); }

// What a rank's allocator does with a request it cannot serve: LibTorch's
// CPU allocator throws "DefaultCPUAllocator: can't allocate memory".
void AllocateTooMuch() {
  torch::Tensor huge = torch::empty({int64_t{1} << 52}, torch::kFloat32);
  ADD_FAILURE() << "allocated " << huge.numel() << " floats";
}

// Every rank's values, gathered (equal sizes).
std::vector<int64_t> Gathered(const std::vector<int64_t>& mine) {
  torch::Tensor all = A().gather(torch::tensor(mine, torch::kInt64));
  return std::vector<int64_t>(all.data_ptr<int64_t>(),
                              all.data_ptr<int64_t>() + all.numel());
}

TEST(FindExecutableBatchSizeTest, EveryRankRetriesTheSameSizesAfterOneRunsOut) {
  const bool last = A().process_index() == A().num_processes() - 1;
  std::vector<int64_t> tried;
  const auto start = std::chrono::steady_clock::now();
  torch::Tensor weights =
      find_executable_batch_size(A(), [&](int64_t batch_size) {
        tried.push_back(batch_size);
        A().free_memory();
        torch::manual_seed(3);
        torch::nn::Linear model(4, 1);
        torch::optim::SGD sgd(model->parameters(),
                              torch::optim::SGDOptions(0.1));
        auto [prepared, optimizer] = A().prepare(model, sgd);
        torch::manual_seed(100 + A().process_index());
        for (int step = 0; step < 3; ++step) {
          torch::Tensor x = torch::randn({batch_size, 4});
          torch::Tensor loss = prepared->forward(x).pow(2).mean();
          if (last && step == 1 && batch_size > 50) AllocateTooMuch();
          A().backward(loss);
          optimizer.step();
          optimizer.zero_grad();
        }
        return torch::cat(
            {prepared->weight.detach().flatten(), prepared->bias.detach()});
      });
  // Accelerate's sizes: int(size * 0.9) from 128 until 50 or less.
  const std::vector<int64_t> expected = {128, 115, 103, 92, 82,
                                         73,  65,  58,  52, 46};
  EXPECT_THAT(tried, ElementsAreArray(expected));
  // Every rank tried the same sizes, and ends on the same weights (the
  // gradient sync works over the renewed communicator).
  std::vector<int64_t> all = Gathered(tried);
  for (int r = 0; r < A().num_processes(); ++r) {
    EXPECT_THAT(std::vector<int64_t>(all.begin() + r * expected.size(),
                                     all.begin() + (r + 1) * expected.size()),
                ElementsAreArray(expected))
        << "rank " << r;
  }
  torch::Tensor every = A().gather(weights.unsqueeze(0));
  for (int r = 1; r < A().num_processes(); ++r) {
    EXPECT_TRUE(torch::equal(every[r], every[0])) << "rank " << r;
  }
  // Nine interrupted tries, each left within about a second.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

TEST(FindExecutableBatchSizeTest, AnotherFailureStopsEveryRankNamingIt) {
  const bool first = A().process_index() == 0;
  try {
    find_executable_batch_size(
        A(),
        [&](int64_t batch_size) {
          if (first) throw std::runtime_error("the data set is broken");
          // The others wait for rank 0 in a collective it never calls.
          A().wait_for_everyone();
        },
        16);
    ADD_FAILURE() << "the search did not fail";
  } catch (const PeerError& e) {
    EXPECT_FALSE(first) << e.what();
    EXPECT_EQ(e.failed_rank(), 0);
    EXPECT_THAT(e.what(), HasSubstr("find_executable_batch_size at batch size "
                                    "16: rank 0 failed, so every rank stops: "
                                    "the data set is broken"));
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(first) << e.what();
    EXPECT_STREQ(e.what(), "the data set is broken");
  }
  // What a program that goes on would do: the communicator was interrupted.
  A().communicator().Renew();
  A().wait_for_everyone();
}

TEST(FindExecutableBatchSizeTest, RunningOutAtEverySizeSaysWhatItTried) {
  ExecutableBatchSizeOptions options;
  options.starting_batch_size = 8;
  options.reduce_batch_size = [](int64_t size) { return size / 2; };
  try {
    find_executable_batch_size(
        A(), [](int64_t) { AllocateTooMuch(); }, options);
    ADD_FAILURE() << "the search did not fail";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no executable batch size found, reached "
                                    "zero; a rank ran out of memory at every "
                                    "size tried (8, 4, 2, 1)"));
  }
  options.reduce_batch_size = [](int64_t size) { return size; };
  try {
    find_executable_batch_size(
        A(), [](int64_t) { AllocateTooMuch(); }, options);
    ADD_FAILURE() << "the search did not fail";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("reduce_batch_size(8) returned 8, "
                                    "expected a smaller size"));
  }
  A().wait_for_everyone();
}

TEST(FindExecutableBatchSizeTest, OutOfMemoryIsFoundInsideOtherErrors) {
  auto nested = [] {
    try {
      AllocateTooMuch();
    } catch (...) {
      std::throw_with_nested(DataError("data loader: a batch failed"));
    }
    return std::exception_ptr();
  };
  try {
    nested();
  } catch (...) {
    EXPECT_TRUE(internal::IsOutOfMemory(std::current_exception()));
  }
  EXPECT_TRUE(
      internal::IsOutOfMemory(std::make_exception_ptr(std::bad_alloc())));
  EXPECT_FALSE(internal::IsOutOfMemory(
      std::make_exception_ptr(std::runtime_error("shape mismatch"))));
}

// Under a memory limit a thread's stack is refused and std::thread throws
// EAGAIN (LibTorch 2.6 starts threads inside operators).
TEST(FindExecutableBatchSizeTest, ThreadRefusedForMemoryIsOutOfMemory) {
  auto system_error = [](std::errc code) {
    return std::make_exception_ptr(
        std::system_error(std::make_error_code(code), "thread"));
  };
  EXPECT_TRUE(internal::IsOutOfMemory(
      system_error(std::errc::resource_unavailable_try_again)));
  EXPECT_TRUE(
      internal::IsOutOfMemory(system_error(std::errc::not_enough_memory)));
  EXPECT_FALSE(
      internal::IsOutOfMemory(system_error(std::errc::invalid_argument)));
}

}  // namespace
}  // namespace accel::testing
