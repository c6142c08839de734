// kernels/cuda/bias_act_dropout.cu — bias + activation + dropout on the GPU
// (kernels/bias_act_dropout.h): forward reads z once and writes hd; backward reads
// dhd and z once (dhd alone for bias + dropout), writes dpre (and hd, recomputed for dW2)
// and reduces db in the same pass (Note [Deterministic column sums]). Masks come from
// Philox in-kernel.
#include "kernels/bias_act_dropout.h"
#include "kernels/cuda/rowwise.cuh"

namespace ffn::cuda {

namespace {

template <class T>
struct GeluFwd {
  using A = acc_t<T>;
  static constexpr int kSums = 0;
  static constexpr int kUnroll = 2;
  const T* z;
  const T* b;
  T* hd;
  int64_t n;
  Activation act;
  DeviceMask mask;

  template <int VEC, int U>
  __device__ __forceinline__ void apply(const int64_t (&rows)[U], const bool (&ok)[U], int64_t c0,
                                        A (&)[1][VEC]) const {
    A v[U][VEC], bb[VEC], f[VEC];
    load_rows<VEC>(z, n, c0, rows, ok, v);
    load_bias<VEC>(b, c0, bb);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!ok[u]) continue;
      const int64_t i0 = rows[u] * n + c0;
      mask.factors<VEC>(i0, f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[u][j] = act_math::value<T>(v[u][j] + bb[j], act) * f[j];
      store_vec<VEC>(hd + i0, v[u]);
    }
  }
};

template <class T>
struct DgeluDbias {
  using A = acc_t<T>;
  static constexpr int kSums = 1;
  static constexpr int kUnroll = 2;
  const T* dhd;
  const T* z;  // null for act = identity without a bias (bias + dropout's backward)
  const T* b;
  T* dpre;  // optional
  T* hd;    // optional recomputed forward
  int64_t n;
  Activation act;
  DeviceMask mask;

  template <int VEC, int U>
  __device__ __forceinline__ void apply(const int64_t (&rows)[U], const bool (&ok)[U], int64_t c0,
                                        A (&acc)[1][VEC]) const {
    A g[U][VEC], v[U][VEC], bb[VEC], f[VEC], h[VEC];
    load_rows<VEC>(dhd, n, c0, rows, ok, g);
    if (z) {
      load_rows<VEC>(z, n, c0, rows, ok, v);
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[u][j] = A(0);
    }
    load_bias<VEC>(b, c0, bb);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!ok[u]) continue;
      const int64_t i0 = rows[u] * n + c0;
      mask.factors<VEC>(i0, f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        A val, d;
        act_math::value_grad<T>(v[u][j] + bb[j], act, val, d);
        g[u][j] = g[u][j] * f[j] * d;
        acc[0][j] += g[u][j];
        h[j] = val * f[j];
      }
      if (dpre) store_vec<VEC>(dpre + i0, g[u]);
      if (hd) store_vec<VEC>(hd + i0, h);
    }
  }
};

// db = Σ_rows dy alone (bias_grad: no activation, no dropout, no dz): the same sums in
// the same row order as DgeluDbias (there each value is multiplied by 1 twice), so the bits
// are the same; eight rows per load round instead of two, because this op is nothing but
// loads: two 16-byte loads in flight per thread left it at about 1 TB/s (qkv's bias, 16384 ×
// 2304 bf16: 0.081 ms, 3× its memory time).
template <class T>
struct ColumnSum {
  using A = acc_t<T>;
  static constexpr int kSums = 1;
  static constexpr int kUnroll = sizeof(T) == 8 ? 4 : 8;  // double: 4 fit the 85 registers
  const T* dy;
  int64_t n;

  template <int VEC, int U>
  __device__ __forceinline__ void apply(const int64_t (&rows)[U], const bool (&ok)[U], int64_t c0,
                                        A (&acc)[1][VEC]) const {
    // Raw 16-byte loads, converted as they are added: eight rows converted up front (load_rows)
    // would hold 64 floats and spill under the 85-register bound.
    if constexpr (VEC * sizeof(T) == 16) {
      uint4 raw[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (ok[u]) raw[u] = __ldg(reinterpret_cast<const uint4*>(dy + rows[u] * n + c0));
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (!ok[u]) continue;
        const T* t = reinterpret_cast<const T*>(&raw[u]);
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[0][j] += to_acc(t[j]);
      }
    } else {
      A g[U][VEC];
      load_rows<VEC>(dy, n, c0, rows, ok, g);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (!ok[u]) continue;
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[0][j] += g[u][j];
      }
    }
  }
};

}  // namespace

void bias_act_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                      Tensor& hd) {
  const int dev = z.device().index;
  DeviceGuard guard(dev);
  const int64_t m = z.size(0), n = z.size(1);
  FFN_DISPATCH_ALL(z.dtype(), "bias_act_dropout", [&]<class H>() {
    using T = device_t<H>;
    const GeluFwd<T> op{dptr<T>(z), dptr<T>(b), dptr<T>(hd), n, act, DeviceMask::from(d)};
    const bool aligned = can_vectorize(16 / sizeof(T), n, {op.z, op.b, op.hd});
    launch_rowwise<T>(op, aligned, m, n, dev, nullptr);
  });
}

void bias_act_dropout_backward(const Tensor& dhd, const Tensor& z, const Tensor& b,
                               Activation act, const DropoutSpec& d, Tensor* dpre, Tensor* db,
                               Tensor* hd) {
  const int dev = dhd.device().index;
  DeviceGuard guard(dev);
  const int64_t m = dhd.size(0), n = dhd.size(1);
  FFN_DISPATCH_ALL(dhd.dtype(), "bias_act_dropout_backward", [&]<class H>() {
    using T = device_t<H>;
    if (!z.defined() && !b.defined() && act == Activation::identity && !d.active() && !dpre &&
        !hd) {  // bias_grad
      const ColumnSum<T> op{dptr<T>(dhd), n};
      launch_rowwise<T>(op, can_vectorize(16 / sizeof(T), n, {op.dy}), m, n, dev, dptr<T>(db));
      return;
    }
    const DgeluDbias<T> op{dptr<T>(dhd), dptr<T>(z), dptr<T>(b), dptr<T>(dpre),
                           dptr<T>(hd),  n,          act,        DeviceMask::from(d)};
    const bool aligned = can_vectorize(16 / sizeof(T), n, {op.dhd, op.z, op.b, op.dpre, op.hd});
    launch_rowwise<T>(op, aligned, m, n, dev, dptr<T>(db));
  });
}

}  // namespace ffn::cuda
