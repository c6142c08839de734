// kernels/cuda/cross_entropy.cu — fused softmax cross-entropy (kernels/cross_entropy.h).
//
// Forward: one block per row reads the row once: each thread keeps a running max and the
// sum of exp(x - max) over its elements (rescaled when the max grows, the online softmax),
// then the block combines the threads' pairs in a fixed order and writes lse and the row's
// loss; one block then sums the row losses in a fixed order. Backward: one block per row
// writes (softmax - onehot)·d_loss/N, reading d_loss from device memory. Rows whose length
// and start allow it move in 16-byte vectors (8 bf16/f16 or 4 f32 values). Neither pass
// stores probabilities. Columns from `classes` on are padding (Note [Padded vocabulary]).
//
// cross_entropy_rows (the fused classifier's forward-and-backward): one block of up to 512
// threads per row copies the row into shared memory (cp.async, 16 bytes at a time; GPT-2's
// padded row is 100.6 KB, so two blocks share an SM and one copies while the other
// computes), then takes the max, the sum of exponentials and, with a gradient, writes
// (softmax - onehot)·scale back over the row: one read and one write of the row in all,
// where cross_entropy + cross_entropy_backward read it twice and write a second buffer. For
// bf16/f16 the exponentials are ex2.approx of one FFMA (relative error ~2^-22, far below
// the 16-bit gradient's rounding); f32/f64 keep exp. Rows too wide for shared memory are
// read from global memory three times instead.
#include <algorithm>
#include <cfloat>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/types.cuh"
#include "kernels/cross_entropy.h"

namespace ffn::cuda {

namespace {

constexpr int kThreads = 256;

// Reduces v over the block (max or sum; any whole number of warps) in a fixed order;
// every thread gets the result.
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
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w)
    r = kMax ? max(r, smem[w]) : r + smem[w];
  return r;
}

// Online softmax state: m the max so far, s = Σ exp(x - m).
template <class A>
struct MaxSum {
  A m, s;
};
template <class A>
__device__ __forceinline__ void absorb(MaxSum<A>& st, A x) {
  if (x > st.m) {
    st.s = st.s * exp(st.m - x) + A(1);  // exp(-inf) = 0 for the first element
    st.m = x;
  } else if (x > -INFINITY) {  // (-inf adds nothing; exp(-inf - -inf) would be NaN)
    st.s += exp(x - st.m);
  } else if (x != x) {
    st.s = x;  // NaN propagates
  }
}
template <class A>
__device__ __forceinline__ MaxSum<A> combine(MaxSum<A> a, MaxSum<A> b) {
  const A m = max(a.m, b.m);
  if (m == -INFINITY) return a;
  return {m, a.s * exp(a.m - m) + b.s * exp(b.m - m)};
}

// Combines every thread's state over the block in a fixed order; every thread gets it.
template <class A>
__device__ MaxSum<A> block_combine(MaxSum<A> v, MaxSum<A>* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum<A> other;
    other.m = __shfl_xor_sync(0xffffffffu, v.m, o);
    other.s = __shfl_xor_sync(0xffffffffu, v.s, o);
    v = combine(v, other);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  MaxSum<A> r = smem[0];
  for (int w = 1; w < kThreads / 32; ++w) r = combine(r, smem[w]);
  return r;
}

// Values per 16-byte vector, and whether row i of a [n, v] matrix at p can be read in them.
template <class T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));
template <class T>
__host__ __device__ bool vector_rows(const void* p, int64_t v) {
  return v % kVec<T> == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <class T, class A, bool VEC>
__global__ void __launch_bounds__(kThreads)
    xent_forward_kernel(const T* logits, const int32_t* targets, A* lse, A* row_loss, int64_t v,
                        int64_t c) {
  __shared__ MaxSum<A> smem[kThreads / 32];
  const int64_t i = blockIdx.x;
  const T* row = logits + i * v;
  MaxSum<A> st{-INFINITY, A(0)};
  if constexpr (VEC) {
    constexpr int W = kVec<T>;
    for (int64_t j = threadIdx.x * int64_t{W}; j < c; j += int64_t{kThreads} * W) {
      const uint4 raw = *reinterpret_cast<const uint4*>(row + j);
      const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int e = 0; e < W; ++e)
        if (j + e < c) absorb(st, static_cast<A>(to_acc(x[e])));
    }
  } else {
    for (int64_t j = threadIdx.x; j < c; j += kThreads) absorb(st, static_cast<A>(to_acc(row[j])));
  }
  st = block_combine(st, smem);
  if (threadIdx.x == 0) {
    const A l = st.m + log(st.s);
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

template <class T, class A, bool VEC>
__global__ void __launch_bounds__(kThreads)
    xent_backward_kernel(const T* logits, const int32_t* targets, const A* lse, const A* d_loss,
                         T* d_logits, int64_t n, int64_t v, int64_t c) {
  const int64_t i = blockIdx.x;
  const A scale = *d_loss / static_cast<A>(n), l = lse[i];
  const int64_t t = targets[i];
  const T* row = logits + i * v;
  T* out = d_logits + i * v;
  auto grad = [&](int64_t j, A x) {
    const A p = j < c ? exp(x - l) : A(0);
    return from_acc<T>((p - (j == t ? A(1) : A(0))) * scale);
  };
  if constexpr (VEC) {
    constexpr int W = kVec<T>;
    for (int64_t j = threadIdx.x * int64_t{W}; j < v; j += int64_t{kThreads} * W) {
      const uint4 raw = *reinterpret_cast<const uint4*>(row + j);
      const T* x = reinterpret_cast<const T*>(&raw);
      uint4 res;
      T* o = reinterpret_cast<T*>(&res);
#pragma unroll
      for (int e = 0; e < W; ++e) o[e] = grad(j + e, static_cast<A>(to_acc(x[e])));
      *reinterpret_cast<uint4*>(out + j) = res;
    }
  } else {
    for (int64_t j = threadIdx.x; j < v; j += kThreads) out[j] = grad(j, static_cast<A>(to_acc(row[j])));
  }
}

// ---- cross_entropy_rows, mean_rows, scale_by -------------------------------------------

// Threads per row: one per 16-byte vector (or value) up to 512, in whole warps, so that
// narrow rows (a character vocabulary) do not leave most of a block idle.
constexpr int kMaxRowThreads = 512;

// e^(x·k - b) with k = log2(e) and b = m·log2(e) for 16-bit inputs (one FFMA and MUFU.EX2),
// e^(x - m) otherwise.
template <class T, class A>
struct Exp {
  static constexpr bool kFast = sizeof(T) == 2;
  A m, b;
  __device__ explicit Exp(A m_) : m(m_), b(static_cast<A>(m_ * A(1.4426950408889634))) {}
  __device__ __forceinline__ A operator()(A x) const {
    if constexpr (kFast) {
      float y;
      asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(fmaf(x, 1.4426950408889634f, -b)));
      return y;
    } else {
      return exp(x - m);
    }
  }
};

// f(j, x) over the row's columns [0, end) in the order each thread owns them (16-byte
// vectors of W values when VEC).
template <class T, bool VEC, class F>
__device__ __forceinline__ void for_row(const T* row, int64_t end, F&& f) {
  if constexpr (VEC) {
    constexpr int W = kVec<T>;
    for (int64_t j = threadIdx.x * int64_t{W}; j < end; j += int64_t{blockDim.x} * W) {
      const uint4 raw = *reinterpret_cast<const uint4*>(row + j);
      const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int e = 0; e < W; ++e)
        if (j + e < end) f(j + e, x[e]);
    }
  } else {
    for (int64_t j = threadIdx.x; j < end; j += blockDim.x) f(j, row[j]);
  }
}

template <class T, class A, bool VEC, bool STAGED, bool GRAD>
__global__ void __launch_bounds__(kMaxRowThreads)
    xent_rows_kernel(T* logits, const int32_t* targets, A* row_loss, int64_t v, int64_t c,
                     A scale) {
  extern __shared__ uint4 staged[];
  __shared__ A red[kMaxRowThreads / 32];
  const int64_t i = blockIdx.x;
  T* grow = logits + i * v;
  const T* row = grow;
  if constexpr (STAGED) {
    T* s = reinterpret_cast<T*>(staged);
    if constexpr (VEC) {
      constexpr int W = kVec<T>;
      for (int64_t j = threadIdx.x; j < v / W; j += blockDim.x) {
        const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(s + j * W));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(grow + j * W)
                     : "memory");
      }
      asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
    } else {
      for (int64_t j = threadIdx.x; j < v; j += blockDim.x) s[j] = grow[j];
    }
    __syncthreads();
    row = s;
  }
  A m = -INFINITY;  // (fmax drops NaN here; the sum below brings it back)
  for_row<T, VEC>(row, c, [&](int64_t, T x) { m = max(m, static_cast<A>(to_acc(x))); });
  m = block_reduce<true>(m, red);
  const Exp<T, A> e(m);
  A sum = 0;
  for_row<T, VEC>(row, c, [&](int64_t, T x) { sum += e(static_cast<A>(to_acc(x))); });
  const int64_t t = targets[i];
  // Read before the barrier in the reduction: past it, the row in global memory is written.
  const A xt = threadIdx.x == 0 ? static_cast<A>(to_acc(row[t])) : A(0);
  sum = block_reduce<false>(sum, red);
  const A lse = m + log(sum);
  if (threadIdx.x == 0) row_loss[i] = lse - xt;
  if constexpr (GRAD) {
    const Exp<T, A> p(lse);
    auto grad = [&](int64_t j, T x) {
      const A q = j < c ? p(static_cast<A>(to_acc(x))) : A(0);
      return from_acc<T>((q - (j == t ? A(1) : A(0))) * scale);
    };
    if constexpr (VEC) {
      constexpr int W = kVec<T>;
      for (int64_t j = threadIdx.x * int64_t{W}; j < v; j += int64_t{blockDim.x} * W) {
        const uint4 raw = *reinterpret_cast<const uint4*>(row + j);
        const T* x = reinterpret_cast<const T*>(&raw);
        uint4 res;
        T* o = reinterpret_cast<T*>(&res);
#pragma unroll
        for (int k = 0; k < W; ++k) o[k] = grad(j + k, x[k]);
        *reinterpret_cast<uint4*>(grow + j) = res;
      }
    } else {
      for (int64_t j = threadIdx.x; j < v; j += blockDim.x) grow[j] = grad(j, row[j]);
    }
  }
}

// In place, a factor of exactly 1 leaves y as it is: the kernel reads s and returns (the
// classifier's dx under the usual d_loss = 1: no 50 MB pass a gpt2_small step).
template <class X, class Y, class A, bool IN_PLACE>
__global__ void scale_kernel(const X* x, const A* s, Y* y, int64_t n) {
  const A k = *s;
  if (IN_PLACE && k == A(1)) return;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = from_acc<Y>(static_cast<A>(to_acc(x[i])) * k);
}

}  // namespace

void cross_entropy_rows(Tensor& logits, const Tensor& targets, Tensor& row_loss, int64_t classes,
                        std::optional<double> grad_scale) {
  const int dev = logits.device().index;
  DeviceGuard guard(dev);
  const int64_t n = logits.size(0), v = logits.size(1);
  FFN_CHECK(n < (int64_t{1} << 31), "[cross_entropy_rows] more than 2^31 rows: ", n);
  FFN_DISPATCH_ALL(logits.dtype(), "cross_entropy_rows", [&]<class H>() {
    using T = device_t<H>;
    using A = acc_t<T>;
    const bool vec = vector_rows<T>(logits.data_ptr(), v);
    const size_t bytes = (static_cast<size_t>(v) * sizeof(T) + 15) / 16 * 16;
    const bool staged =
        bytes + kMaxRowThreads / 32 * sizeof(A) <= properties(dev).sharedMemPerBlockOptin;
    const int64_t items = vec ? v / kVec<T> : v;
    const int threads = static_cast<int>(std::min<int64_t>(kMaxRowThreads, (items + 31) / 32 * 32));
    auto pick = [&]<bool V, bool S>() {
      return grad_scale ? xent_rows_kernel<T, A, V, S, true> : xent_rows_kernel<T, A, V, S, false>;
    };
    auto kernel = vec ? (staged ? pick.template operator()<true, true>()
                                : pick.template operator()<true, false>())
                      : (staged ? pick.template operator()<false, true>()
                                : pick.template operator()<false, false>());
    const size_t smem = staged ? bytes : 0;
    allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
    kernel<<<static_cast<unsigned>(n), threads, smem, stream(dev)>>>(
        static_cast<T*>(logits.data_ptr()), static_cast<const int32_t*>(targets.data_ptr()),
        static_cast<A*>(row_loss.data_ptr()), v, classes, static_cast<A>(grad_scale.value_or(0.0)));
    FFN_CHECK_LAUNCH();
  });
}

void mean_rows(const Tensor& row_loss, Tensor& loss) {
  const int dev = loss.device().index;
  DeviceGuard guard(dev);
  FFN_DISPATCH_FLOAT(loss.dtype(), "mean_rows", [&]<class A>() {
    mean_kernel<A><<<1, kThreads, 0, stream(dev)>>>(static_cast<const A*>(row_loss.data_ptr()),
                                                    row_loss.size(0),
                                                    static_cast<A*>(loss.data_ptr()));
    FFN_CHECK_LAUNCH();
  });
}

void scale_by(const Tensor& x, const Tensor& s, Tensor& y) {
  const int dev = y.device().index;
  DeviceGuard guard(dev);
  const int64_t n = y.numel();
  FFN_DISPATCH_ALL(y.dtype(), "scale_by", [&]<class H>() {
    using Y = device_t<H>;
    using A = acc_t<Y>;
    constexpr int kT = 256;
    const unsigned grid = grid_for(n, kT, properties(dev).multiProcessorCount * 8);
    const A* sp = static_cast<const A*>(s.data_ptr());
    if (x.dtype() == y.dtype() && x.data_ptr() == y.data_ptr())
      scale_kernel<Y, Y, A, true><<<grid, kT, 0, stream(dev)>>>(
          static_cast<const Y*>(x.data_ptr()), sp, static_cast<Y*>(y.data_ptr()), n);
    else if (x.dtype() == y.dtype())
      scale_kernel<Y, Y, A, false><<<grid, kT, 0, stream(dev)>>>(
          static_cast<const Y*>(x.data_ptr()), sp, static_cast<Y*>(y.data_ptr()), n);
    else
      scale_kernel<A, Y, A, false><<<grid, kT, 0, stream(dev)>>>(
          static_cast<const A*>(x.data_ptr()), sp, static_cast<Y*>(y.data_ptr()), n);
    FFN_CHECK_LAUNCH();
  });
}

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
    auto kernel = vector_rows<T>(logits.data_ptr(), v) ? xent_forward_kernel<T, A, true>
                                                        : xent_forward_kernel<T, A, false>;
    kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(
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
    const bool vec = vector_rows<T>(logits.data_ptr(), v) && vector_rows<T>(d_logits.data_ptr(), v);
    auto kernel = vec ? xent_backward_kernel<T, A, true> : xent_backward_kernel<T, A, false>;
    kernel<<<static_cast<unsigned>(n), kThreads, 0, stream(dev)>>>(
        static_cast<const T*>(logits.data_ptr()), static_cast<const int32_t*>(targets.data_ptr()),
        static_cast<const A*>(lse.data_ptr()), static_cast<const A*>(d_loss.data_ptr()),
        static_cast<T*>(d_logits.data_ptr()), n, v, classes);
    FFN_CHECK_LAUNCH();
  });
}

}  // namespace ffn::cuda
