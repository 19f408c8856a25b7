// Files and tensors compared byte for byte, for the tests of accel's file
// formats (safetensors, model weights, checkpoints).
//
//   accel::testing::WriteBytes(path, accel::testing::ReadBytes(path) + "x");
//   accel::testing::ExpectSameTensors(Load(path), expected);
#pragma once

#include <torch/types.h>

#include <map>
#include <string>

namespace accel::testing {

using TensorMap = std::map<std::string, torch::Tensor>;

std::string ReadBytes(const std::string& path);
void WriteBytes(const std::string& path, const std::string& bytes);

// Same dtype, shape and bytes (so NaNs and -0.0 compare too).
bool SameBytes(const torch::Tensor& a, const torch::Tensor& b);
// The same names, each with SameBytes; a GoogleTest failure otherwise.
void ExpectSameTensors(const TensorMap& actual, const TensorMap& expected);

}  // namespace accel::testing
