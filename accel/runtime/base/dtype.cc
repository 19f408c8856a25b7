#include "accel/runtime/base/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "accel/runtime/base/errors.h"

namespace accel {
namespace {

uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Signed integer sums and products wrap like the hardware (and like torch)
// instead of being undefined behaviour.
template <typename T>
T WrappingAdd(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(
        static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <typename T>
T WrappingMultiply(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    // Promote to at least unsigned int so uint16 * uint16 cannot overflow int.
    using U = std::common_type_t<std::make_unsigned_t<T>, unsigned int>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

template <typename T>
T Combine(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
      return WrappingAdd(a, b);
    case ReduceOp::kProduct:
      return WrappingMultiply(a, b);
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
  }
  return a;
}

template <typename T>
void ReduceTyped(ReduceOp op, void* out, const void* a, const void* b,
                 size_t count) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  // One loop per operation, so that each vectorizes.
  switch (op) {
    case ReduceOp::kSum:
      for (size_t i = 0; i < count; ++i) o[i] = WrappingAdd(x[i], y[i]);
      return;
    case ReduceOp::kProduct:
      for (size_t i = 0; i < count; ++i) o[i] = WrappingMultiply(x[i], y[i]);
      return;
    case ReduceOp::kMin:
      for (size_t i = 0; i < count; ++i) o[i] = std::min(x[i], y[i]);
      return;
    case ReduceOp::kMax:
      for (size_t i = 0; i < count; ++i) o[i] = std::max(x[i], y[i]);
      return;
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void ReduceHalf(ReduceOp op, void* out, const void* a, const void* b,
                size_t count) {
  auto* o = static_cast<uint16_t*>(out);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < count; ++i) {
    o[i] = FromFloat(Combine(op, ToFloat(x[i]), ToFloat(y[i])));
  }
}

}  // namespace

size_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
      return 1;
  }
  throw UsageError("unknown dtype value " +
                   std::to_string(static_cast<int>(dtype)));
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProduct:
      return "product";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
  }
  return "unknown";
}

bool SupportsReduction(DType dtype, ReduceOp op) {
  if (dtype == DType::kBool) {
    return op == ReduceOp::kMin || op == ReduceOp::kMax;
  }
  return true;
}

void Reduce(DType dtype, ReduceOp op, void* out, const void* a, const void* b,
            size_t count) {
  if (!SupportsReduction(dtype, op)) {
    throw UsageError(std::string("reduction '") + ReduceOpName(op) +
                     "' is not defined for dtype " + DTypeName(dtype) +
                     "; use 'max' (logical or) or 'min' (logical and)");
  }
  switch (dtype) {
    case DType::kFloat32:
      return ReduceTyped<float>(op, out, a, b, count);
    case DType::kFloat64:
      return ReduceTyped<double>(op, out, a, b, count);
    case DType::kFloat16:
      return ReduceHalf<HalfToFloat, FloatToHalf>(op, out, a, b, count);
    case DType::kBFloat16:
      return ReduceHalf<BFloat16ToFloat, FloatToBFloat16>(op, out, a, b, count);
    case DType::kInt8:
      return ReduceTyped<int8_t>(op, out, a, b, count);
    case DType::kUInt8:
    case DType::kBool:  // 0/1 bytes: min is "and", max is "or".
      return ReduceTyped<uint8_t>(op, out, a, b, count);
    case DType::kInt32:
      return ReduceTyped<int32_t>(op, out, a, b, count);
    case DType::kInt64:
      return ReduceTyped<int64_t>(op, out, a, b, count);
  }
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) {
    return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  }
  return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t FloatToHalf(float f) {
  const uint32_t bits = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  uint32_t mantissa = bits & 0x7fffff;
  const int exponent = static_cast<int>((bits >> 23) & 0xff);
  if (exponent == 0xff) {  // Infinity or NaN (kept quiet).
    return sign | 0x7c00 | (mantissa ? 0x200 : 0);
  }
  const int half_exponent = exponent - 127 + 15;
  if (half_exponent >= 0x1f) return sign | 0x7c00;  // Overflow to infinity.
  uint32_t half;
  uint32_t remainder;
  uint32_t halfway;
  if (half_exponent <= 0) {  // Subnormal half, or zero.
    if (half_exponent < -10) return sign;
    mantissa |= 0x800000;
    const int shift = 14 - half_exponent;
    half = mantissa >> shift;
    remainder = mantissa & ((1u << shift) - 1);
    halfway = 1u << (shift - 1);
  } else {
    half = (static_cast<uint32_t>(half_exponent) << 10) | (mantissa >> 13);
    remainder = mantissa & 0x1fff;
    halfway = 0x1000;
  }
  // A carry out of the mantissa correctly bumps the exponent.
  if (remainder > halfway || (remainder == halfway && (half & 1))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float BFloat16ToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

uint16_t FloatToBFloat16(float f) {
  const uint32_t bits = FloatBits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

}  // namespace accel
