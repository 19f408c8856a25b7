#include "accel/core/tensor_format.h"

#include <gtest/gtest.h>

namespace accel {
namespace {

TEST(TensorFormatTest, PrintsAsPythonTorchDoes) {
  EXPECT_EQ(Repr(torch::tensor({1, 2, 3, 1, 2, 3})),
            "tensor([1, 2, 3, 1, 2, 3])");
  EXPECT_EQ(Repr(torch::tensor({0.5, 2.0})), "tensor([0.5000, 2.0000])");
  EXPECT_EQ(Repr(torch::tensor({true, false})), "tensor([True, False])");
  EXPECT_EQ(Repr(torch::tensor(int64_t{7})), "tensor(7)");
  EXPECT_EQ(Repr(torch::arange(4).reshape({2, 2})),
            "tensor([[0, 1],\n        [2, 3]])");
  EXPECT_EQ(Repr(torch::zeros({0})), "tensor([])");
  EXPECT_EQ(Repr(torch::arange(2000)),
            "tensor([0, 1, 2, ..., 1997, 1998, 1999])");
}

}  // namespace
}  // namespace accel
