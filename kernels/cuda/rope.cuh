// kernels/cuda/rope.cuh — the rotary-embedding pieces other kernels fuse (Note [Fused rotary
// embeddings] in layers/attention.cpp): the cos/sin table rope.cu keeps, and the rotation of
// one pair of a head's columns (i, i + D/2) in fp32, forward or back.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/tensor.h"

namespace ffn::cuda {

// cos/sin of θ_i = t·base^(−2i/D) for t < T, i < D/2, as [T, D/2] float2 (computed in f64 on
// the host once per (device, T, D, base) and kept; kernels/rope.h).
const Tensor& rope_table(int dev, int64_t t, int64_t d, double base);

// (x, y) = (x_i, x_{i+D/2}) rotated by θ (sign = 1: kernels/rope.h's forward) or by −θ
// (sign = −1: the backward), with cs = (cos θ, sin θ).
__device__ __forceinline__ void rope_rotate(float& x, float& y, float c, float s, float sign) {
  const float sn = sign * s;
  const float x2 = x * c - y * sn;
  y = y * c + x * sn;
  x = x2;
}

}  // namespace ffn::cuda
