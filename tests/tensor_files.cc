#include "tests/tensor_files.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

namespace accel::testing {

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Same dtype, shape and bytes (so NaNs and -0.0 compare too).
bool SameBytes(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) {
    return false;
  }
  const torch::Tensor x = a.contiguous(), y = b.contiguous();
  return x.nbytes() == 0 ||
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

void ExpectSameTensors(const TensorMap& actual, const TensorMap& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, tensor] : expected) {
    ASSERT_EQ(actual.count(name), 1u) << name;
    EXPECT_TRUE(SameBytes(actual.at(name), tensor))
        << name << ": " << actual.at(name) << " vs " << tensor;
  }
}

}  // namespace accel::testing
