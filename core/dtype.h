// core/dtype.h — element types of tensors and the host-side 16-bit float types.
//
// bf16 and f16 are stored as their IEEE/bfloat16 bit patterns, identical to
// CUDA's __nv_bfloat16 and __half, so buffers move between host and device
// unchanged. Conversions from float round to nearest even (as the CUDA
// intrinsics __float2bfloat16_rn / __float2half_rn do); NaN stays NaN.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#if defined(__CUDACC__)
#define FFN_HD __host__ __device__ __forceinline__
#else
#define FFN_HD inline
#endif

namespace ffn {

// i32 holds integer data (token ids, targets); float ops reject it.
enum class DType : uint8_t { f64, f32, bf16, f16, i32 };

constexpr size_t dtype_size(DType t) {
  return t == DType::f64 ? 8 : (t == DType::f32 || t == DType::i32) ? 4 : 2;
}
constexpr bool is_half(DType t) {
  return t == DType::bf16 || t == DType::f16;
}
const char* dtype_name(DType t);
constexpr bool is_float(DType t) {
  return t != DType::i32;
}
// The type statistics and losses of a float dtype are kept in: f64 for f64, else f32.
constexpr DType acc_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}
// Parses "f64"/"float64", "f32"/"float32", "bf16"/"bfloat16", "f16"/"float16"/"fp16", "i32".
DType parse_dtype(const std::string& s);

FFN_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
FFN_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

FFN_HD uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
FFN_HD float bf16_bits_to_float(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

FFN_HD uint16_t float_to_f16_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u)
    return static_cast<uint16_t>(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {  // below 2^-14: f16 subnormal or zero
    // value * 2^24 is exact in float; round-half-even to an integer in [0, 1024].
    float v = bits_float(ax) * 16777216.0f;
    float r = v + 12582912.0f - 12582912.0f;  // 1.5*2^23 trick: rounds to nearest even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  ax += 0xc8000fffu + ((ax >> 13) & 1u);  // rebias exponent 127 -> 15 and round half to even
  return static_cast<uint16_t>(sign | (ax >> 13));
}
FFN_HD float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return bits_float(float_bits(v) | sign);
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Host-side storage types; layout-compatible with __nv_bfloat16 / __half.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  FFN_HD explicit bf16(float f) : bits(float_to_bf16_bits(f)) {}
  FFN_HD explicit operator float() const { return bf16_bits_to_float(bits); }
};
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  FFN_HD explicit f16(float f) : bits(float_to_f16_bits(f)) {}
  FFN_HD explicit operator float() const { return f16_bits_to_float(bits); }
};

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}

}  // namespace ffn
