// kernels/cuda/adamw.cu — multi-tensor AdamW and global grad norm (kernels/adamw.h).
//
// A launch takes a table of up to kTensors tensors and kBlocks (tensor, chunk) pairs
// as kernel parameters (13 KB, under CUDA 12.1's 32 KB limit); block b updates chunk
// block_chunk[b] (kChunk elements) of tensor block_tensor[b], 4 values per thread and
// access where the pointers allow. A model's step is about ⌈chunks/kBlocks⌉ launches:
// GPT-2's 7600 chunks take 4 launches of up to 15 blocks per SM (with 256-block tables it
// took 30 of 2 per SM, too few loads in flight to reach the memory's bandwidth). The norm uses the
// same table: each block writes the sum of squares of its chunk to a partials slot (fixed order
// inside the block), and one block adds the partials in order, so the norm is bitwise reproducible.
// The step decision (loss and norm finite, clip coefficient, bias corrections) is one single-thread
// kernel, so nothing in a step waits for the host (Note [Device-side step decision]).
#include <cmath>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/types.cuh"
#include "kernels/adamw.h"

namespace ffn::cuda {

namespace {

constexpr int kTensors = 64;
constexpr int kBlocks = 2048;
constexpr int64_t kChunk = 16384;
constexpr int kThreads = 256;

// kVec consecutive values, loaded and stored as one access (16 bytes of fp32).
constexpr int kVec = 4;
template <class U>
struct alignas(sizeof(U) * kVec) Vec {
  U x[kVec];
};
template <class U>
__device__ __forceinline__ bool aligned(const U* q) {  // null: nothing to load
  return reinterpret_cast<uintptr_t>(q) % sizeof(Vec<U>) == 0;
}
template <class U>
__device__ __forceinline__ Vec<U> load(const U* q) {
  return *reinterpret_cast<const Vec<U>*>(q);
}
template <class U>
__device__ __forceinline__ void store(U* q, const Vec<U>& x) {
  *reinterpret_cast<Vec<U>*>(q) = x;
}

template <class T, class A>
struct Table {
  T* param[kTensors];
  const T* grad[kTensors];
  A* master[kTensors];
  A* m[kTensors];
  A* v[kTensors];
  int64_t n[kTensors];
  uint8_t decay[kTensors];
  uint8_t block_tensor[kBlocks];
  int32_t block_chunk[kBlocks];
};

static_assert(sizeof(Table<float, float>) <= 32764 && sizeof(Table<double, double>) <= 32764,
              "kernel parameters are limited to 32764 bytes");

template <class A>
struct StepArgs {
  A lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale;
};

// `decision` (Note [Device-side step decision]), when given, supplies the learning rate, the
// bias corrections and the grad scale, and may skip the step.
template <class T, class A>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(Table<T, A> tab, StepArgs<A> h, const double* decision) {
  if (decision) {
    if (decision[1] == 0.0) return;
    h.lr = static_cast<A>(decision[7]);
    h.bc1 = static_cast<A>(decision[2]);
    h.bc2 = static_cast<A>(decision[3]);
    h.grad_scale = static_cast<A>(decision[4]);
  }
  const int t = tab.block_tensor[blockIdx.x];
  const int64_t begin = int64_t{tab.block_chunk[blockIdx.x]} * kChunk;
  const int64_t end = min(tab.n[t], begin + kChunk);
  T* p = tab.param[t];
  const T* g = tab.grad[t];
  A* w = tab.master[t];
  A* m = tab.m[t];
  A* v = tab.v[t];
  const A decay = A(1) - h.lr * (tab.decay[t] ? h.wd : A(0));
  auto update = [&](A gi, A wi, A& mi, A& vi) {
    gi *= h.grad_scale;
    wi *= decay;
    mi = h.beta1 * mi + (A(1) - h.beta1) * gi;
    vi = h.beta2 * vi + (A(1) - h.beta2) * gi * gi;
    return wi - h.lr * (mi / h.bc1) / (sqrt(vi / h.bc2) + h.eps);
  };
  // kVec elements per thread and iteration where every pointer allows whole vectors (the
  // chunk starts at a multiple of kChunk); the same arithmetic per element as the tail.
  int64_t i = begin;
  if (aligned<T>(p) && aligned<T>(g) && aligned<A>(w) && aligned<A>(m) && aligned<A>(v)) {
    const int64_t vend = begin + (end - begin) / kVec * kVec;
    for (int64_t j = begin + threadIdx.x * int64_t{kVec}; j < vend; j += int64_t{kThreads} * kVec) {
      const Vec<T> gv = load<T>(g + j);
      const Vec<T> pv = w ? Vec<T>{} : load<T>(p + j);
      const Vec<A> wv = w ? load<A>(w + j) : Vec<A>{};
      Vec<A> mv = load<A>(m + j), vv = load<A>(v + j), wo;
      Vec<T> po;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const A wi = w ? wv.x[e] : static_cast<A>(to_acc(pv.x[e]));
        wo.x[e] = update(static_cast<A>(to_acc(gv.x[e])), wi, mv.x[e], vv.x[e]);
        po.x[e] = from_acc<T>(wo.x[e]);
      }
      store<A>(m + j, mv);
      store<A>(v + j, vv);
      if (w) store<A>(w + j, wo);
      store<T>(p + j, po);
    }
    i = vend;
  }
  for (i += threadIdx.x; i < end; i += kThreads) {
    A mi = m[i], vi = v[i];
    const A wi =
        update(static_cast<A>(to_acc(g[i])), w ? w[i] : static_cast<A>(to_acc(p[i])), mi, vi);
    m[i] = mi;
    v[i] = vi;
    if (w) w[i] = wi;
    p[i] = from_acc<T>(wi);
  }
}

template <class T, class A>
__global__ void __launch_bounds__(kThreads)
    sumsq_kernel(Table<T, A> tab, A* partials, int64_t first_partial) {
  __shared__ A sm[kThreads];
  const int t = tab.block_tensor[blockIdx.x];
  const int64_t begin = int64_t{tab.block_chunk[blockIdx.x]} * kChunk;
  const int64_t end = min(tab.n[t], begin + kChunk);
  const T* g = tab.grad[t];
  A s = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const A x = static_cast<A>(to_acc(g[i]));
    s += x * x;
  }
  sm[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) sm[threadIdx.x] += sm[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[first_partial + blockIdx.x] = sm[0];
}

template <class A>
__global__ void __launch_bounds__(kThreads) sum_partials_kernel(const A* partials, int64_t n,
                                                                A* out) {
  __shared__ A sm[kThreads];
  A s = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) s += partials[i];
  sm[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) sm[threadIdx.x] += sm[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = sm[0];
}

// One thread: the step's decision from the loss and Σg² (the CPU reference's arithmetic).
template <class L, class S>
__global__ void decide_kernel(const L* loss, const S* sumsq, AdamWDecide d, double* o) {
  const double l = static_cast<double>(to_acc(*loss));
  const double norm = sqrt(static_cast<double>(to_acc(*sumsq))) / d.grad_divisor;
  const bool apply = isfinite(l) && isfinite(norm);
  if (apply) o[0] += 1;
  double scale = 1.0 / d.grad_divisor;
  if (d.grad_clip > 0 && norm > d.grad_clip) scale *= d.grad_clip / (norm + 1e-6);
  o[1] = apply ? 1.0 : 0.0;
  o[2] = 1.0 - pow(d.beta1, o[0]);
  o[3] = 1.0 - pow(d.beta2, o[0]);
  o[4] = scale;
  o[5] = l;
  o[6] = norm;
}

// Calls launch(table, blocks) for consecutive groups of tensors and chunks.
template <class T, class A, class Fill, class Launch>
void for_each_table(size_t count, const Fill& fill, const Launch& launch) {
  Table<T, A> tab{};
  int nt = 0, nb = 0;
  for (size_t k = 0; k < count; ++k) {
    const int64_t n = fill(tab, nt, k);
    if (n == 0) continue;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      tab.block_tensor[nb] = static_cast<uint8_t>(nt);
      tab.block_chunk[nb] = static_cast<int32_t>(c);
      ++nb;
      const bool last_chunk = c + 1 == chunks;
      if (nb == kBlocks || (last_chunk && nt + 1 == kTensors)) {
        launch(tab, nb);
        nb = 0;
        if (!last_chunk) {  // the tensor continues in the next table, as its entry 0
          tab.param[0] = tab.param[nt], tab.grad[0] = tab.grad[nt];
          tab.master[0] = tab.master[nt], tab.m[0] = tab.m[nt], tab.v[0] = tab.v[nt];
          tab.n[0] = tab.n[nt], tab.decay[0] = tab.decay[nt];
          nt = 0;
        } else {
          nt = -1;
        }
      }
    }
    ++nt;
  }
  if (nb > 0) launch(tab, nb);
}

template <class A>
A* acc_ptr(const Tensor& t) {
  return t.defined() ? static_cast<A*>(t.data_ptr()) : nullptr;
}

}  // namespace

void adamw_step(const std::vector<AdamWSlot>& slots, const AdamWHyper& h, int64_t step,
                double grad_scale, const double* decision) {
  const int dev = slots[0].param.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = stream(dev);
  FFN_DISPATCH_ALL(slots[0].param.dtype(), "adamw", [&]<class H>() {
    using T = device_t<H>;
    using A = acc_t<T>;
    const StepArgs<A> args{static_cast<A>(h.lr),
                           static_cast<A>(h.beta1),
                           static_cast<A>(h.beta2),
                           static_cast<A>(h.eps),
                           static_cast<A>(h.weight_decay),
                           static_cast<A>(1.0 - std::pow(h.beta1, static_cast<double>(step))),
                           static_cast<A>(1.0 - std::pow(h.beta2, static_cast<double>(step))),
                           static_cast<A>(grad_scale)};
    auto fill = [&](Table<T, A>& tab, int nt, size_t k) {
      const AdamWSlot& sl = slots[k];
      tab.param[nt] = static_cast<T*>(sl.param.data_ptr());
      tab.grad[nt] = static_cast<const T*>(sl.grad.data_ptr());
      tab.master[nt] = acc_ptr<A>(sl.master);
      tab.m[nt] = acc_ptr<A>(sl.m);
      tab.v[nt] = acc_ptr<A>(sl.v);
      tab.n[nt] = sl.param.numel();
      tab.decay[nt] = sl.decay ? 1 : 0;
      return sl.param.numel();
    };
    for_each_table<T, A>(slots.size(), fill, [&](const Table<T, A>& tab, int blocks) {
      adamw_kernel<T, A><<<blocks, kThreads, 0, s>>>(tab, args, decision);
      FFN_CHECK_LAUNCH();
    });
  });
}

Tensor global_grad_sumsq(const std::vector<Tensor>& grads) {
  const int dev = grads[0].device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = stream(dev);
  int64_t chunks = 0;
  for (const Tensor& g : grads) chunks += (g.numel() + kChunk - 1) / kChunk;
  const DType acc = acc_dtype(grads[0].dtype());
  if (chunks == 0) return Tensor::zeros({1}, acc, grads[0].device());
  Tensor partials = Tensor::empty({chunks + 1}, acc, grads[0].device());
  FFN_DISPATCH_ALL(grads[0].dtype(), "grad_norm", [&]<class H>() {
    using T = device_t<H>;
    using A = acc_t<T>;
    A* part = static_cast<A*>(partials.data_ptr());
    int64_t next = 0;
    auto fill = [&](Table<T, A>& tab, int nt, size_t k) {
      tab.grad[nt] = static_cast<const T*>(grads[k].data_ptr());
      tab.n[nt] = grads[k].numel();
      return grads[k].numel();
    };
    for_each_table<T, A>(grads.size(), fill, [&](const Table<T, A>& tab, int blocks) {
      sumsq_kernel<T, A><<<blocks, kThreads, 0, s>>>(tab, part, next);
      FFN_CHECK_LAUNCH();
      next += blocks;
    });
    sum_partials_kernel<A><<<1, kThreads, 0, s>>>(part, chunks, part + chunks);
    FFN_CHECK_LAUNCH();
  });
  return partials.narrow(0, chunks, 1);
}

void adamw_decide(const Tensor& loss, const Tensor& sumsq, const AdamWDecide& d,
                  Tensor& decision) {
  const int dev = decision.device().index;
  DeviceGuard guard(dev);
  FFN_DISPATCH_ALL(loss.dtype(), "adamw_decide", [&]<class HL>() {
    FFN_DISPATCH_FLOAT(sumsq.dtype(), "adamw_decide", [&]<class HS>() {
      using L = device_t<HL>;
      using S = device_t<HS>;
      decide_kernel<L, S><<<1, 1, 0, stream(dev)>>>(static_cast<const L*>(loss.data_ptr()),
                                                    static_cast<const S*>(sumsq.data_ptr()), d,
                                                    static_cast<double*>(decision.data_ptr()));
      FFN_CHECK_LAUNCH();
    });
  });
}

}  // namespace ffn::cuda
