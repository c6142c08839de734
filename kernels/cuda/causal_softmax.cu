// kernels/cuda/causal_softmax.cu — causal softmax + attention dropout, forward and backward
// (kernels/causal_softmax.h). One warp per row; each lane owns VEC consecutive columns at a
// time (VEC = 8 when rows are 16-byte aligned, so one Philox call serves a lane's VEC
// draws). Entries above the diagonal are written as 0 without reading the scores.
#include "kernels/cuda/rowwise.cuh"
#include "kernels/causal_softmax.h"

namespace ffn::cuda {

namespace {

constexpr int kWarps = 8;

template <class A>
__device__ __forceinline__ A fast_exp(A x) {
  if constexpr (std::is_same_v<A, double>)
    return exp(x);
  else
    return __expf(x);
}

template <class A>
__device__ __forceinline__ A warp_all(A v, bool is_max) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const A other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? max(v, other) : v + other;
  }
  return v;
}

template <class T, int VEC>
__global__ void __launch_bounds__(32 * kWarps)
    softmax_fwd_kernel(const T* s, T* p, T* pd, int64_t rows, int64_t t, float scale,
                       DeviceMask mask) {
  using A = acc_t<T>;
  const int64_t r = int64_t{blockIdx.x} * kWarps + threadIdx.y;
  if (r >= rows) return;
  const int64_t i = r % t, base = r * t;
  const int64_t valid = i + 1;  // columns 0..i
  A mx = -A(INFINITY);
  for (int64_t c0 = int64_t{threadIdx.x} * VEC; c0 < valid; c0 += 32 * VEC) {
    A v[VEC];
    load_vec<VEC>(s + base + c0, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (c0 + j < valid) mx = max(mx, v[j] * scale);
  }
  mx = warp_all(mx, true);
  A sum = 0;
  for (int64_t c0 = int64_t{threadIdx.x} * VEC; c0 < valid; c0 += 32 * VEC) {
    A v[VEC];
    load_vec<VEC>(s + base + c0, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (c0 + j < valid) sum += fast_exp(v[j] * scale - mx);
  }
  const A inv = A(1) / warp_all(sum, false);
  for (int64_t c0 = int64_t{threadIdx.x} * VEC; c0 < t; c0 += 32 * VEC) {
    A v[VEC], f[VEC];
    if (c0 < valid) {
      load_vec<VEC>(s + base + c0, v);
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = c0 + j < valid ? fast_exp(v[j] * scale - mx) * inv : A(0);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = A(0);
    }
    store_vec<VEC>(p + base + c0, v);
    if (pd) {
      mask.factors<VEC>(base + c0, f);
#pragma unroll  // round p first, as the CPU reference and bias_dropout on p do
      for (int j = 0; j < VEC; ++j) v[j] = to_acc(from_acc<T>(v[j])) * f[j];
      store_vec<VEC>(pd + base + c0, v);
    }
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(32 * kWarps)
    softmax_bwd_kernel(const T* p, const T* dpd, T* ds, int64_t rows, int64_t t, float scale,
                       DeviceMask mask) {
  using A = acc_t<T>;
  const int64_t r = int64_t{blockIdx.x} * kWarps + threadIdx.y;
  if (r >= rows) return;
  const int64_t base = r * t;
  A dot = 0;
  for (int64_t c0 = int64_t{threadIdx.x} * VEC; c0 < t; c0 += 32 * VEC) {
    A pv[VEC], g[VEC], f[VEC];
    load_vec<VEC>(p + base + c0, pv);
    load_vec<VEC>(dpd + base + c0, g);
    mask.factors<VEC>(base + c0, f);
#pragma unroll
    for (int j = 0; j < VEC; ++j) dot += g[j] * f[j] * pv[j];
  }
  dot = warp_all(dot, false);
  for (int64_t c0 = int64_t{threadIdx.x} * VEC; c0 < t; c0 += 32 * VEC) {
    A pv[VEC], g[VEC], f[VEC];
    load_vec<VEC>(p + base + c0, pv);
    load_vec<VEC>(dpd + base + c0, g);
    mask.factors<VEC>(base + c0, f);
#pragma unroll
    for (int j = 0; j < VEC; ++j) g[j] = scale * pv[j] * (g[j] * f[j] - dot);
    store_vec<VEC>(ds + base + c0, g);
  }
}

}  // namespace

void causal_softmax(const Tensor& s, double scale, const DropoutSpec& d, Tensor& p, Tensor* pd) {
  const int dev = s.device().index;
  DeviceGuard guard(dev);
  const int64_t rows = s.size(0) * s.size(1), t = s.size(2);
  if (rows == 0) return;
  FFN_DISPATCH_ALL(s.dtype(), "causal_softmax", [&]<class H>() {
    using T = device_t<H>;
    const unsigned blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
    const dim3 block(32, kWarps);
    T* pdp = pd ? dptr<T>(*pd) : nullptr;
    const DeviceMask mask = DeviceMask::from(d);
    if (can_vectorize(8, t, {s.data_ptr(), p.data_ptr(), pdp}) && sizeof(T) <= 2)
      softmax_fwd_kernel<T, 8><<<blocks, block, 0, stream(dev)>>>(
          dptr<T>(s), dptr<T>(p), pdp, rows, t, static_cast<float>(scale), mask);
    else
      softmax_fwd_kernel<T, 1><<<blocks, block, 0, stream(dev)>>>(
          dptr<T>(s), dptr<T>(p), pdp, rows, t, static_cast<float>(scale), mask);
    FFN_CHECK_LAUNCH();
  });
}

void causal_softmax_backward(const Tensor& p, const Tensor& dpd, double scale,
                             const DropoutSpec& d, Tensor& ds) {
  const int dev = p.device().index;
  DeviceGuard guard(dev);
  const int64_t rows = p.size(0) * p.size(1), t = p.size(2);
  if (rows == 0) return;
  FFN_DISPATCH_ALL(p.dtype(), "causal_softmax_backward", [&]<class H>() {
    using T = device_t<H>;
    const unsigned blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
    const dim3 block(32, kWarps);
    const DeviceMask mask = DeviceMask::from(d);
    if (can_vectorize(8, t, {p.data_ptr(), dpd.data_ptr(), ds.data_ptr()}) && sizeof(T) <= 2)
      softmax_bwd_kernel<T, 8><<<blocks, block, 0, stream(dev)>>>(
          dptr<T>(p), dptr<T>(dpd), dptr<T>(ds), rows, t, static_cast<float>(scale), mask);
    else
      softmax_bwd_kernel<T, 1><<<blocks, block, 0, stream(dev)>>>(
          dptr<T>(p), dptr<T>(dpd), dptr<T>(ds), rows, t, static_cast<float>(scale), mask);
    FFN_CHECK_LAUNCH();
  });
}

}  // namespace ffn::cuda
