// core/cuda/types.cuh — device-side element types and fp32 conversions for kernels.
//
// ffn::bf16 / ffn::f16 (host structs) and __nv_bfloat16 / __half share their bit
// layout; kernels use the CUDA types so the conversion intrinsics apply. The
// dispatch macro maps a DType to the device type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dispatch.h"
#include "core/dtype.h"

namespace ffn::cuda {

template <class T>
struct DeviceType {
  using type = T;
};
template <>
struct DeviceType<bf16> {
  using type = __nv_bfloat16;
};
template <>
struct DeviceType<f16> {
  using type = __half;
};
template <class T>
using device_t = typename DeviceType<T>::type;

// Math type for an element type: double for double, float for everything else.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

__device__ __forceinline__ float to_acc(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float to_acc(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_acc(float v) {
  return v;
}
__device__ __forceinline__ double to_acc(double v) {
  return v;
}
__device__ __forceinline__ double to_acc(int32_t v) {  // exact (copies of integer tensors)
  return v;
}

// Rounds a float/double math value to element type T (nearest even).
template <class T, class A>
__device__ __forceinline__ T from_acc(A v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

// Two floats rounded to T (nearest even, as from_acc) in one packed conversion, lo in the low
// half: the 4 bytes of a bf16x2 / half2 pair.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// Element `hi` (0: low half, 1: high half) of a pair packed as pack2 packs it, as float
// (exact). A bf16 is the top half of the float it stands for: one shift or one mask, where
// extracting the high half as a 16-bit value first took two instructions.
template <class T>
__device__ __forceinline__ float unpack(uint32_t pair, int hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __uint_as_float(hi ? pair & 0xffff0000u : pair << 16);
  } else {
    const unsigned short bits = static_cast<unsigned short>(hi ? pair >> 16 : pair & 0xffffu);
    return __half2float(__ushort_as_half(bits));
  }
}

// Grid for a grid-stride loop over n items with `threads` per block.
inline unsigned grid_for(int64_t n, int threads, int max_blocks = 65535 * 8) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return static_cast<unsigned>(b);
}

}  // namespace ffn::cuda
