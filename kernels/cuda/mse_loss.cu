// kernels/cuda/mse_loss.cu — MSE loss on the GPU (kernels/mse_loss.h): one block sums
// in double in a fixed order (deterministic); the backward is elementwise and reads
// d_loss from device memory, so neither direction waits for the host.
#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/types.cuh"
#include "kernels/mse_loss.h"

namespace ffn::cuda {

namespace {

constexpr int kThreads = 512;

template <class T>
__global__ void __launch_bounds__(kThreads) mse_kernel(const T* p, const T* t, int64_t n, T* loss) {
  __shared__ double sm[kThreads];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const double e = static_cast<double>(to_acc(p[i])) - static_cast<double>(to_acc(t[i]));
    acc += e * e;
  }
  sm[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) sm[threadIdx.x] += sm[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = from_acc<T>(sm[0] / static_cast<double>(n));
}

template <class T>
__global__ void mse_backward_kernel(const T* p, const T* t, const T* d_loss, int64_t n, T* g) {
  using A = acc_t<T>;
  const A k = to_acc(*d_loss) * A(2) / static_cast<A>(n);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    g[i] = from_acc<T>(k * (to_acc(p[i]) - to_acc(t[i])));
}

}  // namespace

void mse_loss(const Tensor& pred, const Tensor& target, Tensor& loss) {
  const int dev = pred.device().index;
  DeviceGuard guard(dev);
  FFN_DISPATCH_ALL(pred.dtype(), "mse_loss", [&]<class H>() {
    using T = device_t<H>;
    mse_kernel<T><<<1, kThreads, 0, stream(dev)>>>(static_cast<const T*>(pred.data_ptr()),
                                                   static_cast<const T*>(target.data_ptr()),
                                                   pred.numel(), static_cast<T*>(loss.data_ptr()));
    FFN_CHECK_LAUNCH();
  });
}

void mse_loss_backward(const Tensor& pred, const Tensor& target, const Tensor& d_loss,
                       Tensor& d_pred) {
  const int dev = pred.device().index;
  DeviceGuard guard(dev);
  const int64_t n = pred.numel();
  FFN_DISPATCH_ALL(pred.dtype(), "mse_loss_backward", [&]<class H>() {
    using T = device_t<H>;
    mse_backward_kernel<T><<<grid_for(n, 256), 256, 0, stream(dev)>>>(
        static_cast<const T*>(pred.data_ptr()), static_cast<const T*>(target.data_ptr()),
        static_cast<const T*>(d_loss.data_ptr()), n, static_cast<T*>(d_pred.data_ptr()));
    FFN_CHECK_LAUNCH();
  });
}

}  // namespace ffn::cuda
