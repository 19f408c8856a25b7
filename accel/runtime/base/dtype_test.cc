#include "accel/runtime/base/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

TEST(DTypeTest, ElementSizesAndNames) {
  EXPECT_EQ(ElementSize(DType::kFloat64), 8u);
  EXPECT_EQ(ElementSize(DType::kBFloat16), 2u);
  EXPECT_EQ(ElementSize(DType::kBool), 1u);
  EXPECT_STREQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_STREQ(ReduceOpName(ReduceOp::kProduct), "product");
}

TEST(DTypeTest, HalfConversionRoundTripsEveryFiniteHalf) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const float f = HalfToFloat(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), h) << "bits " << bits;
  }
}

TEST(DTypeTest, HalfConversionRoundsToNearestEven) {
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f)), 1.0f);
  EXPECT_EQ(HalfToFloat(FloatToHalf(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(70000.0f))));
  // 2049 lies halfway between 2048 and 2050: ties go to the even mantissa.
  EXPECT_EQ(HalfToFloat(FloatToHalf(2049.0f)), 2048.0f);
  EXPECT_EQ(HalfToFloat(FloatToHalf(2051.0f)), 2052.0f);
  EXPECT_EQ(HalfToFloat(FloatToHalf(5.9604645e-8f)), 5.9604645e-8f);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
}

TEST(DTypeTest, BFloat16ConversionRoundsToNearestEven) {
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(3.0f)), 3.0f);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(257.0f)), 256.0f);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(259.0f)), 260.0f);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
}

TEST(DTypeTest, ReduceEveryOperationOnFloats) {
  const float a[] = {1, -2, 3};
  const float b[] = {4, 5, -6};
  float out[3];
  Reduce(DType::kFloat32, ReduceOp::kSum, out, a, b, 3);
  EXPECT_EQ(out[0], 5);
  EXPECT_EQ(out[2], -3);
  Reduce(DType::kFloat32, ReduceOp::kProduct, out, a, b, 3);
  EXPECT_EQ(out[1], -10);
  Reduce(DType::kFloat32, ReduceOp::kMin, out, a, b, 3);
  EXPECT_EQ(out[2], -6);
  Reduce(DType::kFloat32, ReduceOp::kMax, out, a, b, 3);
  EXPECT_EQ(out[1], 5);
}

TEST(DTypeTest, IntegerSumsWrapInsteadOfOverflowing) {
  const int32_t a[] = {std::numeric_limits<int32_t>::max()};
  const int32_t b[] = {1};
  int32_t out[1];
  Reduce(DType::kInt32, ReduceOp::kSum, out, a, b, 1);
  EXPECT_EQ(out[0], std::numeric_limits<int32_t>::min());
}

TEST(DTypeTest, ReduceInPlaceOnHalf) {
  uint16_t a[] = {FloatToHalf(1.5f), FloatToHalf(-2.0f)};
  const uint16_t b[] = {FloatToHalf(2.0f), FloatToHalf(8.0f)};
  Reduce(DType::kFloat16, ReduceOp::kSum, a, a, b, 2);
  EXPECT_EQ(HalfToFloat(a[0]), 3.5f);
  EXPECT_EQ(HalfToFloat(a[1]), 6.0f);
}

TEST(DTypeTest, BoolSupportsOnlyMinAndMax) {
  const uint8_t a[] = {0, 1, 1};
  const uint8_t b[] = {1, 0, 1};
  uint8_t out[3];
  Reduce(DType::kBool, ReduceOp::kMax, out, a, b, 3);
  EXPECT_EQ(out[0] + out[1] + out[2], 3);
  Reduce(DType::kBool, ReduceOp::kMin, out, a, b, 3);
  EXPECT_EQ(out[0] + out[1] + out[2], 1);
  EXPECT_FALSE(SupportsReduction(DType::kBool, ReduceOp::kSum));
  try {
    Reduce(DType::kBool, ReduceOp::kProduct, out, a, b, 3);
    FAIL() << "product of bool did not throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "reduction 'product' is not defined for dtype bool; use "
                 "'max' (logical or) or 'min' (logical and)");
  }
}

}  // namespace
}  // namespace accel
