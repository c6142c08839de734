// kernels/cuda/cross_entropy.cu — fused softmax cross-entropy (kernels/cross_entropy.h).
//
// Forward: one block per row finds the max and Σ exp in fp32 (block reductions in a
// fixed order), writes lse and the row's loss; one block then sums the row losses in a
// fixed order. Backward: one block per row writes (softmax - onehot)·d_loss/N, reading
// d_loss from device memory. Neither pass stores probabilities.
#include <cfloat>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/types.cuh"
#include "kernels/cross_entropy.h"

namespace ffn::cuda {

namespace {

constexpr int kThreads = 256;

// Reduces v over the block (max or sum) in a fixed order; every thread gets the result.
template <bool kMax, class A>
__device__ A block_reduce(A v, A* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const A other = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? max(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // smem may still be read by a previous reduction
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  A r = smem[0];
  for (int w = 1; w < kThreads / 32; ++w) r = kMax ? max(r, smem[w]) : r + smem[w];
  return r;
}

template <class T, class A>
__global__ void __launch_bounds__(kThreads)
    xent_forward_kernel(const T* logits, const int32_t* targets, A* lse, A* row_loss, int64_t v,
                        int64_t c) {
  __shared__ A smem[kThreads / 32];
  const int64_t i = blockIdx.x;
  const T* row = logits + i * v;
  A mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) mx = max(mx, static_cast<A>(to_acc(row[j])));
  mx = block_reduce<true>(mx, smem);
  A s = 0;
  for (int64_t j = threadIdx.x; j < c; j += kThreads) s += exp(static_cast<A>(to_acc(row[j])) - mx);
  s = block_reduce<false>(s, smem);
  if (threadIdx.x == 0) {
    const A l = mx + log(s);
    lse[i] = l;
    row_loss[i] = l - static_cast<A>(to_acc(row[targets[i]]));
  }
}

template <class A>
__global__ void __launch_bounds__(kThreads) mean_kernel(const A* x, int64_t n, A* out) {
  __shared__ A smem[kThreads / 32];
  A s = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) s += x[i];
  s = block_reduce<false>(s, smem);
  if (threadIdx.x == 0) *out = s / static_cast<A>(n);
}

template <class T, class A>
__global__ void __launch_bounds__(kThreads)
    xent_backward_kernel(const T* logits, const int32_t* targets, const A* lse, const A* d_loss,
                         T* d_logits, int64_t n, int64_t v, int64_t c) {
  const int64_t i = blockIdx.x;
  const A scale = *d_loss / static_cast<A>(n), l = lse[i];
  const int64_t t = targets[i];
  const T* row = logits + i * v;
  T* out = d_logits + i * v;
  for (int64_t j = threadIdx.x; j < v; j += kThreads) {
    const A p = j < c ? exp(static_cast<A>(to_acc(row[j])) - l) : A(0);
    out[j] = from_acc<T>((p - (j == t ? A(1) : A(0))) * scale);
  }
}

}  // namespace

void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                   int64_t classes) {
  const int dev = logits.device().index;
  DeviceGuard guard(dev);
  const int64_t n = logits.size(0), v = logits.size(1);
  FFN_CHECK(n < (int64_t{1} << 31), "[cross_entropy] more than 2^31 rows: ", n);
  FFN_DISPATCH_ALL(logits.dtype(), "cross_entropy", [&]<class H>() {
    using T = device_t<H>;
    using A = acc_t<T>;
    Tensor rows = Tensor::empty({n}, acc_dtype(logits.dtype()), logits.device());
    cudaStream_t s = stream(dev);
    xent_forward_kernel<T, A><<<static_cast<unsigned>(n), kThreads, 0, s>>>(
        static_cast<const T*>(logits.data_ptr()), static_cast<const int32_t*>(targets.data_ptr()),
        static_cast<A*>(lse.data_ptr()), static_cast<A*>(rows.data_ptr()), v, classes);
    FFN_CHECK_LAUNCH();
    mean_kernel<A><<<1, kThreads, 0, s>>>(static_cast<const A*>(rows.data_ptr()), n,
                                          static_cast<A*>(loss.data_ptr()));
    FFN_CHECK_LAUNCH();
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& d_loss, Tensor& d_logits, int64_t classes) {
  const int dev = logits.device().index;
  DeviceGuard guard(dev);
  const int64_t n = logits.size(0), v = logits.size(1);
  if (n == 0) return;
  FFN_DISPATCH_ALL(logits.dtype(), "cross_entropy_backward", [&]<class H>() {
    using T = device_t<H>;
    using A = acc_t<T>;
    xent_backward_kernel<T, A><<<static_cast<unsigned>(n), kThreads, 0, stream(dev)>>>(
        static_cast<const T*>(logits.data_ptr()), static_cast<const int32_t*>(targets.data_ptr()),
        static_cast<const A*>(lse.data_ptr()), static_cast<const A*>(d_loss.data_ptr()),
        static_cast<T*>(d_logits.data_ptr()), n, v, classes);
    FFN_CHECK_LAUNCH();
  });
}

}  // namespace ffn::cuda
