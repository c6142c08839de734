// kernels/cuda/dropout_add.cu — the residual add of a dropped-out branch in one pass each
// way (kernels/dropout_add.h). Elementwise over the flat [M·N] index, 16-byte vectors of y
// (8 bf16) when sizes and addresses allow; products and sums are rounded as the CPU
// reference rounds them (no FMA contraction), so f32 results equal it bit for bit.
#include "kernels/cuda/rowwise.cuh"
#include "kernels/dropout_add.h"

namespace ffn::cuda {

namespace {

// out = res + y·mask (X: the type of res/out; T: y's).
template <class T, class X, int VEC>
__global__ void __launch_bounds__(256)
    dropout_add_kernel(const X* res, const T* y, X* out, int64_t n, DeviceMask mask) {
  using A = acc_t<T>;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x * VEC;
  for (int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * VEC; i < n; i += stride) {
    A yv[VEC], rv[VEC], f[VEC], o[VEC];
    load_vec<VEC>(y + i, yv);
    load_vec<VEC>(res + i, rv);
    mask.factors<VEC>(i, f);
#pragma unroll
    for (int j = 0; j < VEC; ++j) o[j] = add_rn(rv[j], mul_rn(yv[j], f[j]));
    store_vec<VEC>(out + i, o);
  }
}

// dy = dout·mask, rounded once to T.
template <class T, class X, int VEC>
__global__ void __launch_bounds__(256)
    dropout_add_bwd_kernel(const X* dout, T* dy, int64_t n, DeviceMask mask) {
  using A = acc_t<T>;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x * VEC;
  for (int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * VEC; i < n; i += stride) {
    A g[VEC], f[VEC];
    load_vec<VEC>(dout + i, g);
    mask.factors<VEC>(i, f);
#pragma unroll
    for (int j = 0; j < VEC; ++j) g[j] = mul_rn(g[j], f[j]);
    store_vec<VEC>(dy + i, g);
  }
}

// VEC elements per thread (16 bytes of y) when n and every base allow it, else 1.
template <class T, class X>
bool vector_ok(int64_t n, std::initializer_list<const void*> narrow,
               std::initializer_list<const void*> wide) {
  constexpr int kVec = 16 / sizeof(T);
  if (!can_vectorize(kVec, n, narrow)) return false;
  for (const void* p : wide)
    if (reinterpret_cast<uintptr_t>(p) % (kVec * sizeof(X)) != 0) return false;
  return true;
}

}  // namespace

void dropout_add(const Tensor& res, const Tensor& y, const DropoutSpec& d, Tensor& out) {
  const int dev = y.device().index;
  DeviceGuard guard(dev);
  const int64_t n = y.numel();
  if (n == 0) return;
  const DeviceMask mask = DeviceMask::from(d);
  dispatch_mixed(res, y, "dropout_add", [&]<class X, class T>() {
    constexpr int kVec = 16 / sizeof(T);
    if (vector_ok<T, X>(n, {dptr<T>(y)}, {dptr<X>(res), dptr<X>(out)}))
      dropout_add_kernel<T, X, kVec><<<grid_for(n / kVec, 256), 256, 0, stream(dev)>>>(
          dptr<X>(res), dptr<T>(y), dptr<X>(out), n, mask);
    else
      dropout_add_kernel<T, X, 1><<<grid_for(n, 256), 256, 0, stream(dev)>>>(
          dptr<X>(res), dptr<T>(y), dptr<X>(out), n, mask);
    FFN_CHECK_LAUNCH();
  });
}

void dropout_add_backward(const Tensor& dout, const DropoutSpec& d, Tensor& dy) {
  const int dev = dy.device().index;
  DeviceGuard guard(dev);
  const int64_t n = dy.numel();
  if (n == 0) return;
  const DeviceMask mask = DeviceMask::from(d);
  dispatch_mixed(dout, dy, "dropout_add_backward", [&]<class X, class T>() {
    constexpr int kVec = 16 / sizeof(T);
    if (vector_ok<T, X>(n, {dptr<T>(dy)}, {dptr<X>(dout)}))
      dropout_add_bwd_kernel<T, X, kVec><<<grid_for(n / kVec, 256), 256, 0, stream(dev)>>>(
          dptr<X>(dout), dptr<T>(dy), n, mask);
    else
      dropout_add_bwd_kernel<T, X, 1><<<grid_for(n, 256), 256, 0, stream(dev)>>>(
          dptr<X>(dout), dptr<T>(dy), n, mask);
    FFN_CHECK_LAUNCH();
  });
}

}  // namespace ffn::cuda
