// kernels/cuda/sgd.cu — the SGD step on the GPU (kernels/sgd.h), elementwise in fp32
// (f64 for f64 parameters).
#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/types.cuh"
#include "kernels/sgd.h"

namespace ffn::cuda {

namespace {

template <class T>
__global__ void sgd_kernel(T* w, const T* g, T* buf, int64_t n, SgdHyper h, bool first) {
  using A = acc_t<T>;
  const A lr = A(h.lr), mom = A(h.momentum), wd = A(h.weight_decay);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const A wi = to_acc(w[i]);
    const A gi = to_acc(g[i]) + wd * wi;
    A step = gi;
    if (buf) {
      const A b = first ? gi : mom * to_acc(buf[i]) + gi;
      buf[i] = from_acc<T>(b);
      step = h.nesterov ? gi + mom * b : b;
    }
    w[i] = from_acc<T>(wi - lr * step);
  }
}

}  // namespace

void sgd_step(Tensor& w, const Tensor& g, Tensor* buf, const SgdHyper& h, bool first_step) {
  const int dev = w.device().index;
  DeviceGuard guard(dev);
  const int64_t n = w.numel();
  FFN_DISPATCH_ALL(w.dtype(), "sgd", [&]<class H>() {
    using T = device_t<H>;
    sgd_kernel<T><<<grid_for(n, 256), 256, 0, stream(dev)>>>(
        static_cast<T*>(w.data_ptr()), static_cast<const T*>(g.data_ptr()),
        buf ? static_cast<T*>(buf->data_ptr()) : nullptr, n, h, first_step);
    FFN_CHECK_LAUNCH();
  });
}

}  // namespace ffn::cuda
