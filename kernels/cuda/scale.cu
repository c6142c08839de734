// kernels/cuda/scale.cu — a matrix scaled along its rows or columns (kernels/scale.h).
// Elementwise over the flat index, 16-byte vectors of x when the row length and the pointers
// allow it; each product is rounded with mul_rn (no contraction), so f32 and f64 equal the
// CPU reference bit for bit.
#include "kernels/cuda/rowwise.cuh"
#include "kernels/scale.h"

namespace ffn::cuda {

namespace {

// out = x·s[i / n] (kRows) or x·s[i % n]; VEC divides n, so a vector lies in one row.
template <class T, class S, bool kRows, int VEC>
__global__ void __launch_bounds__(256)
    scale_kernel(const T* x, const S* s, T* out, int64_t total, int64_t n) {
  using A = acc_t<T>;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x * VEC;
  for (int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * VEC; i < total; i += stride) {
    A v[VEC], f[VEC];
    load_vec<VEC>(x + i, v);
    if constexpr (kRows) {
      const A r = to_acc(s[i / n]);
#pragma unroll
      for (int j = 0; j < VEC; ++j) f[j] = r;
    } else {
      load_vec<VEC>(s + i % n, f);
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = mul_rn(v[j], f[j]);
    store_vec<VEC>(out + i, v);
  }
}

template <bool kRows>
void launch_scale(const Tensor& x, const Tensor& s, Tensor& out, const char* op) {
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  const int64_t total = x.numel(), n = x.size(1);
  if (total == 0) return;
  FFN_DISPATCH_ALL(x.dtype(), op, [&]<class H>() {
    using T = device_t<H>;
    using S = std::conditional_t<kRows, acc_t<T>, T>;
    constexpr int kVec = 16 / sizeof(T);
    const S* sp = dptr<S>(s);
    if (can_vectorize(kVec, n, {dptr<T>(x), dptr<T>(out), kRows ? nullptr : sp}))
      scale_kernel<T, S, kRows, kVec><<<grid_for(total / kVec, 256), 256, 0, stream(dev)>>>(
          dptr<T>(x), sp, dptr<T>(out), total, n);
    else
      scale_kernel<T, S, kRows, 1>
          <<<grid_for(total, 256), 256, 0, stream(dev)>>>(dptr<T>(x), sp, dptr<T>(out), total, n);
    FFN_CHECK_LAUNCH();
  });
}

}  // namespace

void scale_rows(const Tensor& x, const Tensor& s, Tensor& out) {
  launch_scale<true>(x, s, out, "scale_rows");
}

void scale_columns(const Tensor& x, const Tensor& s, Tensor& out) {
  launch_scale<false>(x, s, out, "scale_columns");
}

}  // namespace ffn::cuda
