// kernels/cuda/layernorm.cu — fused LayerNorm forward/backward (kernels/layernorm.h).
//
// Forward and dx: one warp per row, fp32 statistics (shuffle reductions in a fixed
// order, so results are deterministic). dw/db: the rowwise framework's column sums
// (Note [Deterministic column sums]) over dy ⊙ x̂ and dy.
#include "kernels/cuda/rowwise.cuh"
#include "kernels/layernorm.h"

namespace ffn::cuda {

namespace {

constexpr int kWarps = 8;

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// X: the type of x/dx (T, or fp32 for a 16-bit T: the mixed-precision residual stream).
template <class X, class T, class S>
__global__ void __launch_bounds__(32 * kWarps)
    ln_forward_kernel(const X* x, const T* w, const T* b, T* y, S* mean, S* rstd, int64_t m,
                      int64_t c, float eps) {
  using A = acc_t<T>;
  const int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.y;
  if (row >= m) return;
  const X* xr = x + row * c;
  A s = 0;
  for (int64_t j = threadIdx.x; j < c; j += 32) s += to_acc(xr[j]);
  const A mu = warp_sum(s) / static_cast<A>(c);
  A v = 0;
  for (int64_t j = threadIdx.x; j < c; j += 32) {
    const A d = to_acc(xr[j]) - mu;
    v += d * d;
  }
  const A var = warp_sum(v) / static_cast<A>(c);
  const A r = A(1) / sqrt(var + static_cast<A>(eps));
  if (threadIdx.x == 0) {
    mean[row] = static_cast<S>(mu);
    rstd[row] = static_cast<S>(r);
  }
  T* yr = y + row * c;
  for (int64_t j = threadIdx.x; j < c; j += 32) {
    const A o = (to_acc(xr[j]) - mu) * r * to_acc(w[j]) + (b ? to_acc(b[j]) : A(0));
    yr[j] = from_acc<T>(o);
  }
}

template <class X, class T, class S>
__global__ void __launch_bounds__(32 * kWarps)
    ln_dx_kernel(const T* dy, const X* x, const T* w, const S* mean, const S* rstd, X* dx,
                 int64_t m, int64_t c) {
  using A = acc_t<T>;
  const int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.y;
  if (row >= m) return;
  const X* xr = x + row * c;
  const T* gr = dy + row * c;
  const A mu = static_cast<A>(mean[row]), r = static_cast<A>(rstd[row]);
  A s1 = 0, s2 = 0;
  for (int64_t j = threadIdx.x; j < c; j += 32) {
    const A g = to_acc(gr[j]) * to_acc(w[j]);
    s1 += g;
    s2 += g * (to_acc(xr[j]) - mu) * r;
  }
  s1 = warp_sum(s1) / static_cast<A>(c);
  s2 = warp_sum(s2) / static_cast<A>(c);
  X* out = dx + row * c;
  for (int64_t j = threadIdx.x; j < c; j += 32) {
    const A g = to_acc(gr[j]) * to_acc(w[j]);
    const A xh = (to_acc(xr[j]) - mu) * r;
    out[j] = from_acc<X>(r * (g - s1 - xh * s2));
  }
}

// Column sums of dy ⊙ x̂ (set 0) and dy (set 1).
template <class X, class T, class S>
struct LnParamGrads {
  using A = acc_t<T>;
  static constexpr int kSums = 2;
  static constexpr int kUnroll = 2;
  const T* dy;
  const X* x;
  const S* mean;
  const S* rstd;
  int64_t n;

  template <int VEC, int U>
  __device__ __forceinline__ void apply(const int64_t (&rows)[U], const bool (&ok)[U], int64_t c0,
                                        A (&acc)[2][VEC]) const {
    A g[U][VEC], xv[U][VEC];
    load_rows<VEC>(dy, n, c0, rows, ok, g);
    load_rows<VEC>(x, n, c0, rows, ok, xv);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!ok[u]) continue;
      const A mu = static_cast<A>(mean[rows[u]]), r = static_cast<A>(rstd[rows[u]]);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        acc[0][j] += g[u][j] * ((xv[u][j] - mu) * r);
        acc[1][j] += g[u][j];
      }
    }
  }
};

template <class S>
S* stat_ptr(const Tensor& t) {
  return static_cast<S*>(t.data_ptr());
}


// Calls f.template operator()<X, T>() with T = w's device type and X = x's.
template <class F>
void dispatch_ln(const Tensor& x, const Tensor& w, const char* op, F&& f) {
  FFN_DISPATCH_ALL(w.dtype(), op, [&]<class H>() {
    using T = device_t<H>;
    if (x.dtype() == w.dtype())
      f.template operator()<T, T>();
    else
      f.template operator()<float, T>();  // the front door allows only fp32 x here
  });
}

}  // namespace

void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
                Tensor& mean, Tensor& rstd) {
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  const int64_t m = x.size(0), c = x.size(1);
  if (m == 0) return;
  dispatch_ln(x, w, "layer_norm", [&]<class X, class T>() {
    using S = acc_t<T>;
    const unsigned blocks = static_cast<unsigned>((m + kWarps - 1) / kWarps);
    ln_forward_kernel<X, T, S><<<blocks, dim3(32, kWarps), 0, stream(dev)>>>(
        dptr<X>(x), dptr<T>(w), dptr<T>(b), dptr<T>(y), stat_ptr<S>(mean), stat_ptr<S>(rstd), m, c,
        static_cast<float>(eps));
    FFN_CHECK_LAUNCH();
  });
}

void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                         const Tensor& rstd, Tensor* dx, Tensor* dw, Tensor* db) {
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  const int64_t m = x.size(0), c = x.size(1);
  dispatch_ln(x, w, "layer_norm_backward", [&]<class X, class T>() {
    using S = acc_t<T>;
    if (dx && m > 0) {
      const unsigned blocks = static_cast<unsigned>((m + kWarps - 1) / kWarps);
      ln_dx_kernel<X, T, S><<<blocks, dim3(32, kWarps), 0, stream(dev)>>>(
          dptr<T>(dy), dptr<X>(x), dptr<T>(w), stat_ptr<S>(mean), stat_ptr<S>(rstd), dptr<X>(dx),
          m, c);
      FFN_CHECK_LAUNCH();
    }
    if (!dw && !db) return;
    Tensor sums = Tensor::empty({2 * c}, w.dtype(), w.device());
    const LnParamGrads<X, T, S> op{dptr<T>(dy), dptr<X>(x), stat_ptr<S>(mean), stat_ptr<S>(rstd),
                                   c};
    // A vector of x spans VEC·sizeof(X) bytes (32 for fp32 x with bf16 w): require that.
    constexpr int kVec = 16 / sizeof(T);
    const bool aligned = can_vectorize(kVec, c, {op.dy, op.x}) &&
                         reinterpret_cast<uintptr_t>(op.x) % (kVec * sizeof(X)) == 0;
    launch_rowwise<T>(op, aligned, m, c, dev, dptr<T>(sums));
    if (dw) dw->copy_(sums.narrow(0, 0, c));
    if (db) db->copy_(sums.narrow(0, c, c));
  });
}

}  // namespace ffn::cuda
