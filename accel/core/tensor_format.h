// Tensors printed as Python's torch prints them, on one line for vectors:
//
//   accel::Repr(torch::tensor({1, 2, 3}))        // "tensor([1, 2, 3])"
//   accel::Repr(torch::tensor({0.5, 2.0}))       // "tensor([0.5000, 2.0000])"
//   accel::Repr(torch::tensor({true, false}))    // "tensor([True, False])"
//   accel::Repr(torch::ones({2, 2}, torch::kLong))
//       // "tensor([[1, 1],\n        [1, 1]])"
//
// so that a Python script's printed output and its port's read the same.
// More than 1000 elements are summarized with "..." (3 items each side), as
// torch does.
#pragma once

#include <torch/types.h>

#include <string>

namespace accel {

std::string Repr(const torch::Tensor& tensor);

}  // namespace accel
