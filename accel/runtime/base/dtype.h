// Element types and reductions of the buffers that collectives move.
//
//   size_t bytes = accel::ElementSize(accel::DType::kBFloat16) * count;  // 2n
//   accel::Reduce(accel::DType::kFloat32, accel::ReduceOp::kMax, out, a, b, n);
//
// Kept free of LibTorch so the communication core and the backends compile
// fast; accel/torch_* maps torch::ScalarType onto these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace accel {

enum class DType {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
  kBool,
};

inline constexpr DType kAllDTypes[] = {
    DType::kFloat32,  DType::kFloat64, DType::kFloat16,
    DType::kBFloat16, DType::kInt8,    DType::kUInt8,
    DType::kInt32,    DType::kInt64,   DType::kBool,
};

enum class ReduceOp { kSum, kProduct, kMin, kMax };

inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kProduct,
                                             ReduceOp::kMin, ReduceOp::kMax};

size_t ElementSize(DType dtype);
const char* DTypeName(DType dtype);
const char* ReduceOpName(ReduceOp op);

// Whether `op` is defined on `dtype`. Bool supports only min (logical and)
// and max (logical or): sum and product of truth values are ambiguous.
bool SupportsReduction(DType dtype, ReduceOp op);

// out[i] = op(a[i], b[i]) for i < count. `out` may alias `a` or `b`.
// Half-precision types are reduced in float32 and rounded to nearest even.
// Throws UsageError when !SupportsReduction(dtype, op).
void Reduce(DType dtype, ReduceOp op, void* out, const void* a, const void* b,
            size_t count);

// IEEE half and bfloat16 conversions (round to nearest even).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace accel
