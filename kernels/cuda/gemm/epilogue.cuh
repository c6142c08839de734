// kernels/cuda/gemm/epilogue.cuh — what the Hopper GEMM does with each accumulator pair
// before it leaves registers. A consumer hands its epilogue (row, col, v0, v1): the fp32
// results for C[row][col] and C[row][col + 1] (col even); the epilogue bounds-checks and
// stores. The FFN's elementwise work lives here, so it costs no extra pass over memory.
//
//   StoreC          C = acc (+ bias[col])
//   BiasActDropout  z = round(acc) (stored if asked), hd = dropout(act(z + b1)): fc1 of the
//                   plain FFN. z is rounded to T before the bias exactly as the unfused path
//                   stores it, so hd is the value bias_act_dropout(z) gives, and the mask is
//                   the DropoutSpec's element i = row·N + col (Note [Dropout RNG]).
#pragma once

#include "core/cuda/types.cuh"
#include "kernels/activation.h"
#include "kernels/cuda/rowwise.cuh"  // DeviceMask

namespace ffn::cuda::gemm {

// Stores a pair: one 4-byte store when both are in range and the row start is aligned.
template <class T>
__device__ __forceinline__ void store_pair(T* p, bool second, bool paired, float v0, float v1) {
  if (paired && second) {
    using P = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, __nv_bfloat162, __half2>;
    P two;
    two.x = from_acc<T>(v0);
    two.y = from_acc<T>(v1);
    *reinterpret_cast<P*>(p) = two;
  } else {
    p[0] = from_acc<T>(v0);
    if (second) p[1] = from_acc<T>(v1);
  }
}

template <class T>
struct StoreC {
  T* c;
  const T* bias;  // optional [n]
  int m, n;

  __device__ __forceinline__ void operator()(int row, int col, float v0, float v1) const {
    if (row >= m || col >= n) return;
    const bool second = col + 1 < n;
    if (bias) {
      v0 += to_acc(bias[col]);
      if (second) v1 += to_acc(bias[col + 1]);
    }
    store_pair(c + static_cast<int64_t>(row) * n + col, second, (n & 1) == 0, v0, v1);
  }
};

template <class T>
struct BiasActDropout {
  T* hd;
  T* z;           // optional: fc1's output without bias, saved for the backward
  const T* bias;  // optional [n]
  int m, n;
  Activation act;
  DeviceMask mask;

  __device__ __forceinline__ void operator()(int row, int col, float v0, float v1) const {
    if (row >= m || col >= n) return;
    const bool second = col + 1 < n;
    const int64_t i0 = static_cast<int64_t>(row) * n + col;
    // z as stored (rounded to T), then the bias in fp32, as bias_act_dropout reads it.
    const float z0 = to_acc(from_acc<T>(v0)), z1 = to_acc(from_acc<T>(v1));
    if (z) store_pair(z + i0, second, (n & 1) == 0, v0, v1);
    float f[2] = {1.0f, 1.0f};
    if (mask.active) {
      // Columns col and col + 1 of one row are elements i0, i0 + 1; with n odd they may
      // fall into two Philox blocks, so each takes its own block.
      float g[1];
      mask.factors<1>(i0, g);
      f[0] = g[0];
      if (second) {
        mask.factors<1>(i0 + 1, g);
        f[1] = g[0];
      }
    }
    const float b0 = bias ? to_acc(bias[col]) : 0.0f;
    const float b1 = bias && second ? to_acc(bias[col + 1]) : 0.0f;
    const float h0 = act_math::value(z0 + b0, act) * f[0];
    const float h1 = second ? act_math::value(z1 + b1, act) * f[1] : 0.0f;
    store_pair(hd + i0, second, (n & 1) == 0, h0, h1);
  }
};

}  // namespace ffn::cuda::gemm
