// kernels/cuda/adamw.cu — multi-tensor AdamW and global grad norm (kernels/adamw.h).
//
// A launch takes a table of up to kTensors tensors and kBlocks (tensor, chunk) pairs
// as kernel parameters (under the 4 KiB limit); block b updates chunk block_chunk[b]
// (kChunk elements) of tensor block_tensor[b]. A model's step is ⌈chunks/kBlocks⌉
// launches. The norm uses the same table: each block writes the sum of squares of its
// chunk to a partials slot (fixed order inside the block), and one block adds the
// partials in order, so the norm is bitwise reproducible. The step decision (loss and norm
// finite, clip coefficient, bias corrections) is one single-thread kernel, so nothing in a
// step waits for the host (Note [Device-side step decision]).
#include <cmath>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/types.cuh"
#include "kernels/adamw.h"

namespace ffn::cuda {

namespace {

constexpr int kTensors = 24;
constexpr int kBlocks = 256;
constexpr int64_t kChunk = 16384;
constexpr int kThreads = 256;

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

template <class A>
struct StepArgs {
  A lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale;
};

// `decision` (Note [Device-side step decision]), when given, supplies the bias corrections
// and the grad scale, and may skip the step.
template <class T, class A>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(Table<T, A> tab, StepArgs<A> h, const double* decision) {
  if (decision) {
    if (decision[1] == 0.0) return;
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
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const A gi = static_cast<A>(to_acc(g[i])) * h.grad_scale;
    A wi = (w ? w[i] : static_cast<A>(to_acc(p[i]))) * decay;
    const A mi = h.beta1 * m[i] + (A(1) - h.beta1) * gi;
    const A vi = h.beta2 * v[i] + (A(1) - h.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    wi -= h.lr * (mi / h.bc1) / (sqrt(vi / h.bc2) + h.eps);
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
  o[7] = 0.0;
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
