// kernels/cuda/bias_dropout.cu — fused bias + dropout forward, and the backward that
// regenerates the mask and reduces db in the same pass (kernels/bias_dropout.h).
#include "kernels/bias_dropout.h"
#include "kernels/cuda/rowwise.cuh"

namespace ffn::cuda {

namespace {

template <class T>
struct BiasDropoutFwd {
  using A = acc_t<T>;
  static constexpr int kSums = 0;
  static constexpr int kUnroll = 2;
  const T* z;
  const T* b;
  T* y;
  int64_t n;
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
      for (int j = 0; j < VEC; ++j) v[u][j] = (v[u][j] + bb[j]) * f[j];
      store_vec<VEC>(y + i0, v[u]);
    }
  }
};

template <class T>
struct DropoutDbias {
  using A = acc_t<T>;
  static constexpr int kSums = 1;
  static constexpr int kUnroll = 2;
  const T* dy;
  T* dz;
  int64_t n;
  DeviceMask mask;

  template <int VEC, int U>
  __device__ __forceinline__ void apply(const int64_t (&rows)[U], const bool (&ok)[U], int64_t c0,
                                        A (&acc)[1][VEC]) const {
    A g[U][VEC], f[VEC];
    load_rows<VEC>(dy, n, c0, rows, ok, g);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!ok[u]) continue;
      const int64_t i0 = rows[u] * n + c0;
      mask.factors<VEC>(i0, f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        g[u][j] *= f[j];
        acc[0][j] += g[u][j];
      }
      if (dz) store_vec<VEC>(dz + i0, g[u]);
    }
  }
};

}  // namespace

void bias_dropout(const Tensor& z, const Tensor& b, const DropoutSpec& d, Tensor& y) {
  const int dev = z.device().index;
  DeviceGuard guard(dev);
  const int64_t m = z.size(0), n = z.size(1);
  FFN_DISPATCH_ALL(z.dtype(), "bias_dropout", [&]<class H>() {
    using T = device_t<H>;
    const BiasDropoutFwd<T> op{dptr<T>(z), dptr<T>(b), dptr<T>(y), n, DeviceMask::from(d)};
    const bool aligned = can_vectorize(16 / sizeof(T), n, {op.z, op.b, op.y});
    launch_rowwise<T>(op, aligned, m, n, dev, nullptr);
  });
}

void dropout_dbias(const Tensor& dy, const DropoutSpec& d, Tensor* dz, Tensor* db) {
  const int dev = dy.device().index;
  DeviceGuard guard(dev);
  const int64_t m = dy.size(0), n = dy.size(1);
  FFN_DISPATCH_ALL(dy.dtype(), "dropout_dbias", [&]<class H>() {
    using T = device_t<H>;
    const DropoutDbias<T> op{dptr<T>(dy), dptr<T>(dz), n, DeviceMask::from(d)};
    const bool aligned = can_vectorize(16 / sizeof(T), n, {op.dy, op.dz});
    launch_rowwise<T>(op, aligned, m, n, dev, dptr<T>(db));
  });
}

}  // namespace ffn::cuda
