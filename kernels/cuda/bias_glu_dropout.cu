// kernels/cuda/bias_glu_dropout.cu — the fused gated-FFN middle on the GPU (kernels/bias_glu_dropout.h).
// Forward reads the [M, 2h] GEMM output once and writes [M, h]; backward writes the
// concatenated dz [M, 2h] and reduces both halves of db in the same pass.
#include "kernels/cuda/rowwise.cuh"
#include "kernels/bias_glu_dropout.h"

namespace ffn::cuda {

namespace {

template <class T>
struct GluFwd {
  using A = acc_t<T>;
  static constexpr int kSums = 0;
  static constexpr int kUnroll = 2;
  const T* z;  // [M, 2h]
  const T* b;  // [2h]
  T* out;      // [M, h]
  int64_t h;
  Activation act;
  DeviceMask mask;

  template <int VEC, int U>
  __device__ __forceinline__ void apply(const int64_t (&rows)[U], const bool (&ok)[U], int64_t c0,
                                        A (&)[1][VEC]) const {
    A v[U][VEC], g[U][VEC], bv[VEC], bg[VEC], f[VEC];
    load_rows<VEC>(z, 2 * h, c0, rows, ok, v);      // value half
    load_rows<VEC>(z + h, 2 * h, c0, rows, ok, g);  // gate half
    load_bias<VEC>(b, c0, bv);
    load_bias<VEC>(b ? b + h : nullptr, c0, bg);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!ok[u]) continue;
      const int64_t io = rows[u] * h + c0;
      mask.factors<VEC>(io, f);
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        v[u][j] = (v[u][j] + bv[j]) * act_math::value<T>(g[u][j] + bg[j], act) * f[j];
      store_vec<VEC>(out + io, v[u]);
    }
  }
};

template <class T>
struct DgluDbias {
  using A = acc_t<T>;
  static constexpr int kSums = 2;  // [value | gate] halves of db
  // 1: with 2 the three [VEC] loads per row spill registers
  static constexpr int kUnroll = 1;
  const T* dout;
  const T* z;
  const T* b;
  T* dz;
  T* out;  // optional recomputed forward
  int64_t h;
  Activation act;
  DeviceMask mask;

  template <int VEC, int U>
  __device__ __forceinline__ void apply(const int64_t (&rows)[U], const bool (&ok)[U], int64_t c0,
                                        A (&acc)[2][VEC]) const {
    A s[U][VEC], v[U][VEC], g[U][VEC], bv[VEC], bg[VEC], f[VEC], o[VEC];
    load_rows<VEC>(dout, h, c0, rows, ok, s);
    load_rows<VEC>(z, 2 * h, c0, rows, ok, v);
    load_rows<VEC>(z + h, 2 * h, c0, rows, ok, g);
    load_bias<VEC>(b, c0, bv);
    load_bias<VEC>(b ? b + h : nullptr, c0, bg);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!ok[u]) continue;
      const int64_t iv = rows[u] * 2 * h + c0, io = rows[u] * h + c0;
      mask.factors<VEC>(io, f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const A val = v[u][j] + bv[j], gate = g[u][j] + bg[j];
        A a, da;
        act_math::value_grad<T>(gate, act, a, da);
        const A sj = s[u][j] * f[j];
        v[u][j] = sj * a;         // d value
        g[u][j] = sj * val * da;  // d gate
        acc[0][j] += v[u][j];
        acc[1][j] += g[u][j];
        if (out) o[j] = val * a * f[j];
      }
      store_vec<VEC>(dz + iv, v[u]);
      store_vec<VEC>(dz + iv + h, g[u]);
      if (out) store_vec<VEC>(out + io, o);
    }
  }
};

}  // namespace

void bias_glu_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                      Tensor& out) {
  const int dev = z.device().index;
  DeviceGuard guard(dev);
  const int64_t m = z.size(0), h = z.size(1) / 2;
  FFN_DISPATCH_ALL(z.dtype(), "bias_glu_dropout", [&]<class H>() {
    using T = device_t<H>;
    const GluFwd<T> op{dptr<T>(z), dptr<T>(b), dptr<T>(out), h, act, DeviceMask::from(d)};
    const bool aligned = can_vectorize(16 / sizeof(T), h, {op.z, op.b, op.out});
    launch_rowwise<T>(op, aligned, m, h, dev, nullptr);
  });
}

void bias_glu_dropout_backward(const Tensor& dout, const Tensor& z, const Tensor& b, Activation act,
                        const DropoutSpec& d, Tensor& dz, Tensor* db, Tensor* out) {
  const int dev = z.device().index;
  DeviceGuard guard(dev);
  const int64_t m = z.size(0), h = z.size(1) / 2;
  FFN_DISPATCH_ALL(z.dtype(), "bias_glu_dropout_backward", [&]<class H>() {
    using T = device_t<H>;
    const DgluDbias<T> op{dptr<T>(dout), dptr<T>(z), dptr<T>(b), dptr<T>(dz),
                          dptr<T>(out),  h,          act,        DeviceMask::from(d)};
    const bool aligned = can_vectorize(16 / sizeof(T), h, {op.dout, op.z, op.b, op.dz, op.out});
    launch_rowwise<T>(op, aligned, m, h, dev, dptr<T>(db));
  });
}

}  // namespace ffn::cuda
