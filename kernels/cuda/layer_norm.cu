// kernels/cuda/layer_norm.cu — fused LayerNorm forward/backward (kernels/layer_norm.h).
//
// Forward and dx: one warp per row, fp32 statistics (shuffle reductions in a fixed
// order, so results are deterministic); the forward holds the row in registers and moves
// 16-byte vectors on the backward's common shapes below. Backward, the common shapes (16-bit w, C %
// 8 == 0, C ≤ 1024, aligned rows): one kernel reads x and dy once and writes dx (optionally added
// to what dx holds: the residual stream's gradient sum) and the dw/db partial sums of its
// 64 rows; a warp takes rows w, w+8, … of the block in order, warps are summed in order,
// and reduce_partials sums the blocks in order (Note [Deterministic column sums]: a
// function of M and C only). Other shapes: dx per row, then the rowwise framework's column
// sums over dy ⊙ x̂ and dy. RMSNorm (kernels/layer_norm.h) runs the same kernels with a null
// mean: no centering, no mean term in dx.
#include "kernels/bias_act_dropout.h"  // bias_grad
#include "kernels/cuda/rowwise.cuh"
#include "kernels/dropout_add.h"
#include "kernels/layer_norm.h"

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
  if (mean)  // else RMSNorm: the mean is held at 0
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
    if (mean) mean[row] = static_cast<S>(mu);
    rstd[row] = static_cast<S>(r);
  }
  if (!y) return;  // the statistics only (kernels/layer_norm.h)
  T* yr = y + row * c;
  for (int64_t j = threadIdx.x; j < c; j += 32) {
    const A o = (to_acc(xr[j]) - mu) * r * to_acc(w[j]) + (b ? to_acc(b[j]) : A(0));
    yr[j] = from_acc<T>(o);
  }
}

// The forward for the backward's common shapes (16-bit w, C % 8 == 0, C ≤ 1024, aligned
// rows): lane l holds the 8-column vectors l, l+32, … of its row in registers, so x is read
// once with 16-byte loads (the kernel above reads it three times, a value per load). With h,
// the row is first a = x + dropout(h) as dropout_add computes it, written to `a` (Note
// [Residual add and norm]).
template <class X, class T, class S, int K>
__global__ void __launch_bounds__(32 * kWarps)
    ln_forward_vec_kernel(const X* x, const T* w, const T* b, T* y, S* mean, S* rstd, int64_t m,
                          int c, float eps, const T* h, X* a, DeviceMask mask) {
  const int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.y;
  if (row >= m) return;
  const int lane = threadIdx.x, nv = c / 8;
  float xv[K][8];
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (lane + 32 * k < nv) {
      const int64_t i0 = row * c + 8 * (lane + 32 * k);
      load_vec<8>(x + i0, xv[k]);
      if (h) {
        float hv[8], f[8];
        load_vec<8>(h + i0, hv);
        mask.factors<8>(i0, f);
#pragma unroll
        for (int j = 0; j < 8; ++j) xv[k][j] = add_rn(xv[k][j], mul_rn(hv[j], f[j]));
        store_vec<8>(a + i0, xv[k]);
      }
    }
  float s = 0.0f;
  if (mean)  // else RMSNorm: the mean is held at 0
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (lane + 32 * k < nv)
#pragma unroll
        for (int j = 0; j < 8; ++j) s += xv[k][j];
  const float mu = warp_sum(s) / static_cast<float>(c);
  float v = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (lane + 32 * k < nv)
#pragma unroll
      for (int j = 0; j < 8; ++j) v += (xv[k][j] - mu) * (xv[k][j] - mu);
  const float r = 1.0f / sqrtf(warp_sum(v) / static_cast<float>(c) + eps);
  if (lane == 0) {
    if (mean) mean[row] = static_cast<S>(mu);
    rstd[row] = static_cast<S>(r);
  }
  if (!y) return;  // the statistics only (kernels/layer_norm.h)
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (lane + 32 * k < nv) {
      const int col = 8 * (lane + 32 * k);
      float wv[8], bv[8] = {}, o[8];
      load_vec<8>(w + col, wv);
      if (b) load_vec<8>(b + col, bv);
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] = (xv[k][j] - mu) * r * wv[j] + bv[j];
      store_vec<8>(y + row * c + col, o);
    }
}

template <class X, class T, class S>
__global__ void __launch_bounds__(32 * kWarps)
    ln_dx_kernel(const T* dy, const X* x, const T* w, const S* mean, const S* rstd, X* dx,
                 bool accumulate, int64_t m, int64_t c, bool prescaled) {
  using A = acc_t<T>;
  const int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.y;
  if (row >= m) return;
  const X* xr = x + row * c;
  const T* gr = dy + row * c;
  const A mu = mean ? static_cast<A>(mean[row]) : A(0), r = static_cast<A>(rstd[row]);
  A s1 = 0, s2 = 0;
  for (int64_t j = threadIdx.x; j < c; j += 32) {
    const A g = to_acc(gr[j]) * to_acc(w[j]);
    s1 += g;
    s2 += g * (to_acc(xr[j]) - mu) * r;
  }
  s1 = mean ? warp_sum(s1) / static_cast<A>(c) : A(0);  // RMSNorm has no mean term
  s2 = warp_sum(s2) / static_cast<A>(c);
  X* out = dx + row * c;
  for (int64_t j = threadIdx.x; j < c; j += 32) {
    const A g = to_acc(gr[j]) * to_acc(w[j]);
    const A xh = (to_acc(xr[j]) - mu) * r;
    const A v = (prescaled ? A(1) : r) * (g - s1 - xh * s2);  // prescaled: dy is rstd·dy
    out[j] = from_acc<X>(accumulate ? to_acc(out[j]) + v : v);
  }
}

constexpr int kBwdRows = 64;       // rows per block of ln_backward_kernel
constexpr int kBwdMaxCols = 1024;  // its column bound (registers: K = C/256 vectors of 8)

// One row's data in a lane's registers: x, dy and (when accumulating) dx's old values, the
// lane's 8-column vectors lane, lane + 32, …
template <int K>
struct BwdRow {
  float x[K][8], g[K][8], prev[K][8];
};
template <class X, class T, int K>
__device__ __forceinline__ void load_bwd_row(BwdRow<K>& r, const T* dy, const X* x, const X* dx,
                                             bool accumulate, int64_t row, int c, int lane) {
  const int nv = c / 8;
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int j = 0; j < 8; ++j) r.prev[k][j] = 0.0f;
    if (lane + 32 * k < nv) {
      load_vec<8>(x + row * c + 8 * (lane + 32 * k), r.x[k]);
      load_vec<8>(dy + row * c + 8 * (lane + 32 * k), r.g[k]);
      if (dx && accumulate) load_vec<8>(dx + row * c + 8 * (lane + 32 * k), r.prev[k]);
    }
  }
}

// Shared memory of ln_backward_kernel: each warp's column sums, kSets × K × 2 float4s a lane
// (set s, vector k, half h at ((s·K + k)·2 + h)·32 + lane: a warp's accesses are contiguous).
template <int K, bool kDhSum>
constexpr int bwd_smem_bytes() {
  return kWarps * (kDhSum ? 3 : 2) * K * 2 * 32 * 16;
}

// The fused backward over rows [64·block, 64·block + 64): dx (+= when accumulate; dx may be
// null) and, when partials is set, partials[block][0, C) = Σ dy ⊙ x̂, partials[block][C, 2C) = Σ dy;
// with dh, also dh = dropout_add_backward(dx) of the final dx (Note [Residual add and norm]),
// and with kDhSum partials[block][2C, 3C) = Σ dh, the rounded values (the rows of a block are
// always the same 64, so the sums do not depend on the launch).
// Lane l handles the 8-column vectors l, l+32, … (K of them at most). Warp w takes rows w,
// w + 8, … of the block in order and adds each row's terms to its own column sums in shared
// memory; the block then adds the warps' sums in warp order. The next row's loads are issued
// before the current row is computed, so each warp keeps a row's bytes in flight while it
// works: one block of 8 warps fills an SM at these registers, and with the row loaded when
// its turn came its latency was exposed. Held in registers, the column sums took 72 of 205
// registers and left none for the next row (gpt2_small's shape, ffn-bench --norm on an H100:
// 0.102 ms a call that way, 0.089 this way; session 23, bench/RESULTS-2026-11-26-s20-25.md).
// Staging the next two rows in shared memory with cp.async instead, sums in registers,
// measured slower still (0.116–0.120 ms).
// Rows of at most 512 (K ≤ 2: the char models' 384) fit two blocks an SM in 128 registers
// (16 bytes spilled a thread), so twice the rows are in flight: H200, session
// 40, ffn-bench --norm alternated 3x, llama_char's RMSNorm backward 0.049–0.050 → 0.041–0.042
// ms, shakespeare_char's LayerNorm 0.051 → 0.042–0.043, their steps 2.3% faster. At K = 3
// (GPT-2's 768) 128 registers with the next row spill 496 bytes a thread; without it (each
// warp loads its next row after storing the current one, 48 bytes spilled) two blocks an SM
// still win: GPT-2's backward 0.072–0.073 → 0.069–0.070 ms, gpt2_small's step 29.62 → 29.41
// ms (alternated twice, session 40). K = 4 keeps one block and the prefetch.
// kPrescaled (RMSNorm, kernels/layer_norm.h): dy holds rstd·dy. A template argument: as a
// run-time flag its two factors a row added 8-24 bytes of spills to these kernels (session 50).
template <class X, class T, class S, int K, bool kDhSum, bool kPrescaled>
__global__ void __launch_bounds__(32 * kWarps, K <= 3 ? 2 : 1)
    ln_backward_kernel(const T* dy, const X* x, const T* w, const S* mean, const S* rstd, X* dx,
                       bool accumulate, float* partials, int64_t m, int c, T* dh, DeviceMask mask) {
  constexpr int kSets = kDhSum ? 3 : 2;
  constexpr int kSlab = kSets * K * 2 * 32;  // float4s per warp
  extern __shared__ float4 ln_bwd_sums[];
  const int warp = threadIdx.y, lane = threadIdx.x, nv = c / 8;
  float4* sums = ln_bwd_sums + warp * kSlab;
  auto sum_at = [&](int set, int k, int h) -> float4& {
    return sums[((set * K + k) * 2 + h) * 32 + lane];
  };
  const bool with_sums = partials != nullptr;
  if (with_sums)
    for (int i = lane; i < kSlab; i += 32) sums[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float wv[K][8];
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (lane + 32 * k < nv) load_vec<8>(w + 8 * (lane + 32 * k), wv[k]);
  const int64_t first = int64_t{blockIdx.x} * kBwdRows + warp;
  constexpr bool kPrefetch = K != 3;
  BwdRow<K> cur;
  [[maybe_unused]] BwdRow<K> next;
  // dx's old values (accumulate) load with x and dy: one trip to memory per row, not two.
  if (first < m) load_bwd_row<X, T, K>(cur, dy, x, dx, accumulate, first, c, lane);
  for (int rr = 0; rr < kBwdRows / kWarps; ++rr) {
    const int64_t row = first + rr * kWarps;
    if (row >= m) break;
    if constexpr (kPrefetch)
      if (row + kWarps < m && rr + 1 < kBwdRows / kWarps)
        load_bwd_row<X, T, K>(next, dy, x, dx, accumulate, row + kWarps, c, lane);
    const float mu = mean ? static_cast<float>(mean[row]) : 0.0f;
    const float r = static_cast<float>(rstd[row]);
    // kPrescaled: dx drops its leading rstd and dw's terms dy ⊙ x̂ are dy ⊙ x̂ / rstd.
    const float lead = kPrescaled ? 1.0f : r, xs = kPrescaled ? 1.0f / r : 1.0f;
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (lane + 32 * k < nv)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          cur.x[k][j] = (cur.x[k][j] - mu) * r;  // x̂ from here on
          const float g = cur.g[k][j] * wv[k][j];
          s1 += g;
          s2 += g * cur.x[k][j];
        }
    s1 = mean ? warp_sum(s1) / static_cast<float>(c) : 0.0f;  // RMSNorm: no mean term
    s2 = warp_sum(s2) / static_cast<float>(c);
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (lane + 32 * k < nv) {
        if (with_sums)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float4& aw = sum_at(0, k, h);
            float4& ab = sum_at(1, k, h);
            const float* gg = cur.g[k] + 4 * h;
            const float* xh = cur.x[k] + 4 * h;
            aw = make_float4(aw.x + gg[0] * (xh[0] * xs), aw.y + gg[1] * (xh[1] * xs),
                             aw.z + gg[2] * (xh[2] * xs), aw.w + gg[3] * (xh[3] * xs));
            ab = make_float4(ab.x + gg[0], ab.y + gg[1], ab.z + gg[2], ab.w + gg[3]);
          }
        if (!dx) continue;
        X* out = dx + row * c + 8 * (lane + 32 * k);
        float o[8];
#pragma unroll
        for (int j = 0; j < 8; ++j)
          o[j] = cur.prev[k][j] + lead * (cur.g[k][j] * wv[k][j] - s1 - cur.x[k][j] * s2);
        store_vec<8>(out, o);
        if (dh) {  // dropout_add_backward's arithmetic on the value dx holds (rounded to X)
          const int64_t i0 = row * c + 8 * (lane + 32 * k);
          float f[8], g[8];
          mask.factors<8>(i0, f);
#pragma unroll
          for (int j = 0; j < 8; ++j) g[j] = mul_rn(to_acc(from_acc<X>(o[j])), f[j]);
          store_vec<8>(dh + i0, g);
          if constexpr (kDhSum)
            if (with_sums)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                float4& ah = sum_at(2, k, h);
                const float* gh = g + 4 * h;
                ah = make_float4(ah.x + to_acc(from_acc<T>(gh[0])),
                                 ah.y + to_acc(from_acc<T>(gh[1])),
                                 ah.z + to_acc(from_acc<T>(gh[2])),
                                 ah.w + to_acc(from_acc<T>(gh[3])));
              }
        }
      }
    if constexpr (kPrefetch)
      cur = next;
    else if (row + kWarps < m && rr + 1 < kBwdRows / kWarps)
      load_bwd_row<X, T, K>(cur, dy, x, dx, accumulate, row + kWarps, c, lane);
  }
  if (!with_sums) return;
  __syncthreads();
  // Column col of set s: the warps' sums in warp order (the order the registers' had).
  float* part = partials + int64_t{blockIdx.x} * kSets * c;
  const float* all = reinterpret_cast<const float*>(ln_bwd_sums);
  for (int i = warp * 32 + lane; i < kSets * c; i += 32 * kWarps) {
    const int set = i / c, col = i % c;
    const int v = col / 8, j = col % 8;  // vector v = lane' + 32k', element j
    const int at = (((set * K + v / 32) * 2 + j / 4) * 32 + v % 32) * 4 + j % 4;
    float acc = all[at];
    for (int wi = 1; wi < kWarps; ++wi) acc += all[wi * kSlab * 4 + at];
    part[i] = acc;
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
  bool prescaled;  // dy holds rstd·dy (RMSNorm): dy ⊙ x̂ is dy ⊙ x

  template <int VEC, int U>
  __device__ __forceinline__ void apply(const int64_t (&rows)[U], const bool (&ok)[U], int64_t c0,
                                        A (&acc)[2][VEC]) const {
    A g[U][VEC], xv[U][VEC];
    load_rows<VEC>(dy, n, c0, rows, ok, g);
    load_rows<VEC>(x, n, c0, rows, ok, xv);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!ok[u]) continue;
      const A mu = mean ? static_cast<A>(mean[rows[u]]) : A(0);
      const A r = prescaled ? A(1) : static_cast<A>(rstd[rows[u]]);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        acc[0][j] += g[u][j] * ((xv[u][j] - mu) * r);
        acc[1][j] += g[u][j];
      }
    }
  }
};

// f.template operator()<K>() with K = ⌈C/256⌉, the 8-column vectors per lane of the
// register-resident kernels (ln_forward_vec_kernel, ln_backward_kernel; C ≤ kBwdMaxCols).
template <class F>
void with_row_vectors(int64_t c, const F& f) {
  switch ((c / 8 + 31) / 32) {
    case 1:
      return f.template operator()<1>();
    case 2:
      return f.template operator()<2>();
    case 3:
      return f.template operator()<3>();
    default:
      return f.template operator()<4>();
  }
}

// Null for an undefined tensor (RMSNorm's mean).
template <class S>
S* stat_ptr(const Tensor& t) {
  return t.defined() ? static_cast<S*>(t.data_ptr()) : nullptr;
}


}  // namespace

void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
                Tensor& mean, Tensor& rstd, const Tensor& h, const DropoutSpec& d, Tensor* a) {
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  const int64_t m = x.size(0), c = x.size(1);
  if (m == 0) return;
  const bool add = h.defined();
  dispatch_mixed(x, w, "layer_norm", [&]<class X, class T>() {
    using S = acc_t<T>;
    const unsigned blocks = static_cast<unsigned>((m + kWarps - 1) / kWarps);
    if constexpr (sizeof(T) == 2) {
      auto aligned32 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 32 == 0; };
      if (c % 8 == 0 && c <= kBwdMaxCols && aligned32(dptr<X>(x)) &&
          can_vectorize(8, c, {dptr<T>(w), dptr<T>(b), dptr<T>(y)}) &&
          (!add || (aligned32(dptr<X>(*a)) && can_vectorize(8, c, {dptr<T>(h)})))) {
        with_row_vectors(c, [&]<int K>() {
          ln_forward_vec_kernel<X, T, S, K><<<blocks, dim3(32, kWarps), 0, stream(dev)>>>(
              dptr<X>(x), dptr<T>(w), dptr<T>(b), dptr<T>(y), stat_ptr<S>(mean), stat_ptr<S>(rstd),
              m, static_cast<int>(c), static_cast<float>(eps), add ? dptr<T>(h) : nullptr,
              add ? dptr<X>(*a) : nullptr, DeviceMask::from(d));
        });
        FFN_CHECK_LAUNCH();
        return;
      }
    }
    // The general kernel: the add as its own pass first.
    const Tensor* in = &x;
    if (add) {
      cuda::dropout_add(x, h, d, *a);
      in = a;
    }
    ln_forward_kernel<X, T, S><<<blocks, dim3(32, kWarps), 0, stream(dev)>>>(
        dptr<X>(*in), dptr<T>(w), dptr<T>(b), dptr<T>(y), stat_ptr<S>(mean), stat_ptr<S>(rstd), m,
        c, static_cast<float>(eps));
    FFN_CHECK_LAUNCH();
  });
}

void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                         const Tensor& rstd, Tensor* dx, Tensor* dw, Tensor* db, bool accumulate_dx,
                         Tensor* dh, const DropoutSpec& dh_d, Tensor* dh_sum, bool prescaled) {
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  const int64_t m = x.size(0), c = x.size(1);
  dispatch_mixed(x, w, "layer_norm_backward", [&]<class X, class T>() {
    using S = acc_t<T>;
    const bool sums = dw || db;
    const bool fused = sizeof(T) == 2 && c % 8 == 0 && c <= kBwdMaxCols && m > 0 &&
                       reinterpret_cast<uintptr_t>(dptr<X>(x)) % 32 == 0 &&
                       (!dx || reinterpret_cast<uintptr_t>(dptr<X>(dx)) % 32 == 0) &&
                       can_vectorize(8, c, {dptr<T>(dy), dptr<T>(w), dh ? dptr<T>(*dh) : nullptr});
    if (fused) {
      if constexpr (sizeof(T) == 2) {
        const int64_t blocks = (m + kBwdRows - 1) / kBwdRows;
        // dh's column sums ride along up to C = 768 (K = 3: a third set of sums, 72 KiB of
        // shared memory in all; kept from when the sums lived in registers and K = 4 would
        // have spilled); above, a column-sum pass follows.
        const bool sum_dh = dh && dh_sum && c <= 768;
        const int sets = sum_dh ? 3 : 2;
        Tensor partials;
        if (sums || sum_dh) partials = Tensor::empty({blocks * sets * c}, DType::f32, x.device());
        with_row_vectors(c, [&]<int K>() {
          auto launch = [&](auto kernel, int smem) {
            allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
            kernel<<<static_cast<unsigned>(blocks), dim3(32, kWarps), smem, stream(dev)>>>(
                dptr<T>(dy), dptr<X>(x), dptr<T>(w), stat_ptr<S>(mean), stat_ptr<S>(rstd),
                dptr<X>(dx), accumulate_dx, partials.defined() ? partials.data<float>() : nullptr,
                m, static_cast<int>(c), dh ? dptr<T>(*dh) : nullptr, DeviceMask::from(dh_d));
          };
          auto run = [&]<bool kPre>() {
            if constexpr (K <= 3) {
              if (sum_dh)
                return launch(ln_backward_kernel<X, T, S, K, true, kPre>,
                              bwd_smem_bytes<K, true>());
            }
            launch(ln_backward_kernel<X, T, S, K, false, kPre>, bwd_smem_bytes<K, false>());
          };
          if (prescaled)
            run.template operator()<true>();
          else
            run.template operator()<false>();
        });
        FFN_CHECK_LAUNCH();
        if (dh && dh_sum && !sum_dh) bias_grad(*dh, *dh_sum);
        if (!partials.defined()) return;
        // Each set's sums straight into its tensor, no copies (a captured step had 3 copy
        // nodes per norm); the front door checks that dw, db and dh_sum are contiguous [c]
        // tensors of w's dtype on its device.
        auto ptr = [](Tensor* t) { return t ? dptr<T>(*t) : nullptr; };
        const PartialsOut<T> out(ptr(dw), ptr(db), sum_dh ? ptr(dh_sum) : nullptr, c);
        reduce_partials_kernel<float, T>
            <<<static_cast<unsigned>((sets * c + 31) / 32), dim3(32, 8), 0, stream(dev)>>>(
                partials.data<float>(), blocks, sets * c, out);
        FFN_CHECK_LAUNCH();
        return;
      }
    }
    if (dx && m > 0) {
      const unsigned blocks = static_cast<unsigned>((m + kWarps - 1) / kWarps);
      ln_dx_kernel<X, T, S><<<blocks, dim3(32, kWarps), 0, stream(dev)>>>(
          dptr<T>(dy), dptr<X>(x), dptr<T>(w), stat_ptr<S>(mean), stat_ptr<S>(rstd), dptr<X>(dx),
          accumulate_dx, m, c, prescaled);
      FFN_CHECK_LAUNCH();
      if (dh) cuda::dropout_add_backward(*dx, dh_d, *dh);  // the general path: a pass of its own
      if (dh && dh_sum) bias_grad(*dh, *dh_sum);
    }
    if (!sums) return;
    Tensor both = Tensor::empty({2 * c}, w.dtype(), w.device());
    const LnParamGrads<X, T, S> op{dptr<T>(dy),       dptr<X>(x), stat_ptr<S>(mean),
                                   stat_ptr<S>(rstd), c,          prescaled};
    // A vector of x spans VEC·sizeof(X) bytes (32 for fp32 x with bf16 w): require that.
    constexpr int kVec = 16 / sizeof(T);
    const bool aligned = can_vectorize(kVec, c, {op.dy, op.x}) &&
                         reinterpret_cast<uintptr_t>(op.x) % (kVec * sizeof(X)) == 0;
    launch_rowwise<T>(op, aligned, m, c, dev, dptr<T>(both));
    if (dw) dw->copy_(both.narrow(0, 0, c));
    if (db) db->copy_(both.narrow(0, c, c));
  });
}

}  // namespace ffn::cuda
