// kernels/cuda/attention.cu — fused causal attention (kernels/attention.h) on tensor cores
// (WMMA 16×16×16, fp32 accumulation). Tiles are 64 keys wide; each warp owns 16 rows.
//
// Forward, one block per (64 or 32 query rows, b·h): S = Q·Kᵀ for the whole causal row
// block goes to shared memory in fp32, an exact (not online) softmax turns each row into
// pd = p·mask/(1−p_drop) in 16-bit in place, and O = pd·V accumulates in registers. So T is
// bounded by shared memory (BM·T·4 bytes; fused_attention_supported says where).
// Backward, two kernels, no atomics (deterministic):
//   dkv: one block per (64 keys, b·h); walks the query tiles at or after its keys,
//        recomputes p and the mask, and accumulates dV = pdᵀ·dY and dK = dSᵀ·Q;
//   dq:  one block per (64 queries, b·h); walks the key tiles up to the diagonal and
//        accumulates dQ = dS·K.
// D_i = dy_i·y_i comes from a small row-dot kernel first.
//
// Note [Attention mask draws]: element (bh, i, j) uses draw (bh·T + i)·T + j. A lane
// handles 8 consecutive keys of one query, so when T % 8 == 0 one Philox call gives all 8.
#include <mma.h>

#include <map>
#include <utility>

#include "kernels/attention.h"
#include "kernels/cuda/rowwise.cuh"

namespace ffn::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kBN = 64;     // key tile
constexpr int kBwdBM = 64;  // query tile of the backward kernels

template <class T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <class T>
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major>;
template <class T>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <class T>
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Dropout multipliers of draws e0 … e0+7 (Note [Attention mask draws]).
__device__ __forceinline__ void mask8(const DeviceMask& m, uint64_t e0, float (&f)[8]) {
  if (!m.active) {
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = 1.0f;
    return;
  }
  uint64_t blk = e0 >> 3;
  U32x4 r = philox_block(m.keys, m.offset, blk);
  if ((e0 & 7) == 0) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      f[j] = ((r.v[j >> 1] >> (16 * (j & 1))) & 0xffffu) >= m.thr ? m.scale : 0.0f;
    return;
  }
  for (int j = 0; j < 8; ++j) {
    const uint64_t e = e0 + j;
    if ((e >> 3) != blk) r = philox_block(m.keys, m.offset, blk = e >> 3);
    f[j] = mask_draw(r, e) >= m.thr ? m.scale : 0.0f;
  }
}

// rows×D tile of a row-major matrix (row stride ld) starting at row r0, into shared memory
// with row stride D+8; rows ≥ t are zeros.
template <int D, class T>
__device__ __forceinline__ void load_tile(T* sm, const T* g, int64_t ld, int64_t r0, int64_t t,
                                          int rows) {
  constexpr int V = D / 8;
  for (int idx = threadIdx.x; idx < rows * V; idx += blockDim.x) {
    const int r = idx / V, c = (idx % V) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r0 + r < t) v = *reinterpret_cast<const uint4*>(g + (r0 + r) * ld + c);
    *reinterpret_cast<uint4*>(sm + r * (D + 8) + c) = v;
  }
}

// Writes each warp's 16×D fp32 accumulators (times `mul`) to rows [r0 + 16·warp, …) of a
// row-major 16-bit matrix (row stride ld), staging through `stage` (16·(D+4) floats per
// warp); rows ≥ t are skipped.
template <int D, class T>
__device__ __forceinline__ void store_rows(FragC (&acc)[D / 16], float mul, float* stage, T* g,
                                           int64_t ld, int64_t r0, int64_t t) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* st = stage + warp * 16 * (D + 4);
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
#pragma unroll
    for (int e = 0; e < acc[n].num_elements; ++e) acc[n].x[e] *= mul;
    wmma::store_matrix_sync(st + n * 16, acc[n], D + 4, wmma::mem_row_major);
  }
  __syncwarp();
  constexpr int V = D / 8;
  for (int idx = lane; idx < 16 * V; idx += 32) {
    const int r = idx / V, c = (idx % V) * 8;
    const int64_t row = r0 + warp * 16 + r;
    if (row >= t) continue;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = st[r * (D + 4) + c + j];
    store_vec<8>(g + row * ld + c, v);
  }
}

// ---------------------------------------------------------------------------------------
// Forward.

template <int D, int BM>
constexpr size_t fwd_smem_fixed() {
  return static_cast<size_t>(BM + kBN) * (D + 8) * 2;
}
inline int64_t fwd_sld(int64_t t, int d) {  // fp32 row stride of the score block
  const int64_t cols = (t + kBN - 1) / kBN * kBN;
  return std::max<int64_t>(cols, d) + 4;
}

template <class T, int D, int BM>
__global__ void __launch_bounds__(BM * 2)
    attn_fwd_kernel(const T* qkv, T* y, float* lse, int64_t t, int heads, int sld, float scale,
                    DeviceMask mask) {
  constexpr int LD = D + 8;
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + BM * LD;
  float* ss = reinterpret_cast<float*>(ks + kBN * LD);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.x, b = bh / heads;
  const int h = static_cast<int>(bh % heads);
  const int64_t q0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * BM;  // long rows first
  const int64_t ld = 3LL * heads * D;
  const T* qg = qkv + b * t * ld + static_cast<int64_t>(h) * D;
  const T* kg = qg + static_cast<int64_t>(heads) * D;
  const T* vg = kg + static_cast<int64_t>(heads) * D;
  const int nkt = static_cast<int>(((t < q0 + BM ? t : q0 + BM) + kBN - 1) / kBN);

  load_tile<D>(qs, qg, ld, q0, t, BM);
  for (int kt = 0; kt < nkt; ++kt) {
    __syncthreads();
    load_tile<D>(ks, kg, ld, static_cast<int64_t>(kt) * kBN, t, kBN);
    __syncthreads();
    FragC acc[kBN / 16];
#pragma unroll
    for (int n = 0; n < kBN / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      FragA<T> a;
      wmma::load_matrix_sync(a, qs + warp * 16 * LD + kk * 16, LD);
#pragma unroll
      for (int n = 0; n < kBN / 16; ++n) {
        FragBT<T> bt;
        wmma::load_matrix_sync(bt, ks + n * 16 * LD + kk * 16, LD);
        wmma::mma_sync(acc[n], a, bt, acc[n]);
      }
    }
#pragma unroll
    for (int n = 0; n < kBN / 16; ++n)
      wmma::store_matrix_sync(ss + warp * 16 * sld + kt * kBN + n * 16, acc[n], sld,
                              wmma::mem_row_major);
  }
  __syncwarp();

  // Exact softmax of the warp's 16 rows; pd overwrites the row's scores in place (16-bit
  // entry j sits in the bytes of float j/2, read before: a warp reads a 256-column chunk
  // completely before it writes it).
  const int ncols = nkt * kBN;
  for (int r = 0; r < 16; ++r) {
    const int64_t i = q0 + warp * 16 + r;
    float* row = ss + (warp * 16 + r) * sld;
    T* prow = reinterpret_cast<T*>(row);
    const int valid = i < t ? static_cast<int>(i + 1) : 0;
    float mx = -INFINITY;
    for (int j = lane; j < valid; j += 32) mx = fmaxf(mx, row[j]);
    mx = warp_max(mx) * scale;
    float sum = 0.0f;
    for (int j = lane; j < valid; j += 32) sum += __expf(row[j] * scale - mx);
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    if (lane == 0 && i < t) lse[bh * t + i] = mx + logf(sum);
    const uint64_t e_row = (static_cast<uint64_t>(bh) * t + i) * t;
    for (int base = 0; base < ncols; base += 256) {
      const int c0 = base + lane * 8;
      const bool in = c0 < ncols;
      float v[8];
      if (in) {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = row[c0 + j];
      }
      __syncwarp();
      if (in) {
        float f[8] = {};
        if (c0 < valid) mask8(mask, e_row + c0, f);
#pragma unroll
        for (int j = 0; j < 8; ++j)
          v[j] = c0 + j < valid ? __expf(v[j] * scale - mx) * inv * f[j] : 0.0f;
        store_vec<8>(prow + c0, v);
      }
      __syncwarp();
    }
  }

  // O = pd·V over the same key tiles.
  FragC o[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(o[n], 0.0f);
  const T* prow0 = reinterpret_cast<const T*>(ss + warp * 16 * sld);
  for (int kt = 0; kt < nkt; ++kt) {
    __syncthreads();
    load_tile<D>(ks, vg, ld, static_cast<int64_t>(kt) * kBN, t, kBN);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      FragA<T> a;
      wmma::load_matrix_sync(a, prow0 + kt * kBN + kk * 16, 2 * sld);
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        FragB<T> bv;
        wmma::load_matrix_sync(bv, ks + kk * 16 * LD + n * 16, LD);
        wmma::mma_sync(o[n], a, bv, o[n]);
      }
    }
  }
  __syncwarp();
  // Stage through the warp's own score rows (sld ≥ D + 4 floats each).
  float* stage = ss + warp * 16 * sld - warp * 16 * (D + 4);
  store_rows<D>(o, 1.0f, stage, y + b * t * heads * D + static_cast<int64_t>(h) * D,
                static_cast<int64_t>(heads) * D, q0, t);
}

// ---------------------------------------------------------------------------------------
// Backward.

// dsum[bh·T + i] = dy_i · y_i over the head's D columns; one warp per (b, i, h).
template <class T, int D>
__global__ void __launch_bounds__(256)
    attn_rowdot_kernel(const T* y, const T* dy, float* dsum, int64_t rows, int64_t t, int heads) {
  const int64_t w = int64_t{blockIdx.x} * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows) return;  // w = (b·T + i)·H + h
  const int64_t h = w % heads, bi = w / heads, b = bi / t, i = bi % t;
  float acc = 0.0f;
#pragma unroll
  for (int c = lane; c < D; c += 32) acc += to_acc(y[w * D + c]) * to_acc(dy[w * D + c]);
  acc = warp_sum(acc);
  if (lane == 0) dsum[(b * heads + h) * t + i] = acc;
}

template <int D>
constexpr size_t bwd_smem() {
  // 4 operand tiles, two fp32 64×68 tiles, two 16-bit 64×72 tiles, lse and D.
  return 4 * static_cast<size_t>(64) * (D + 8) * 2 + 2 * 64 * 68 * 4 + 2 * 64 * 72 * 2 + 2 * 64 * 4;
}

// The elementwise middle of both backward kernels for 8 consecutive keys of one query:
// p, pd and ds from the fp32 scores s and dpd (both strided by `stride` floats).
struct Probs {
  float pd[8], ds[8];
};
__device__ __forceinline__ Probs probs8(const float* s, const float* dpd, int stride, int64_t qi,
                                        int64_t kj0, int64_t t, int64_t bh, float scale, float lse,
                                        float dsum, const DeviceMask& mask) {
  Probs out;
  float f[8] = {};
  if (qi < t && kj0 <= qi) mask8(mask, (static_cast<uint64_t>(bh) * t + qi) * t + kj0, f);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const bool ok = qi < t && kj0 + j <= qi;
    const float p = ok ? __expf(s[j * stride] * scale - lse) : 0.0f;
    out.pd[j] = ok ? p * f[j] : 0.0f;
    out.ds[j] = ok ? p * (dpd[j * stride] * f[j] - dsum) : 0.0f;
  }
  return out;
}

template <class T, int D>
__global__ void __launch_bounds__(128)
    attn_bwd_dkv_kernel(const T* qkv, const T* dy, const float* lse, const float* dsum, T* dqkv,
                        int64_t t, int heads, float scale, DeviceMask mask) {
  constexpr int BM = kBwdBM, LD = D + 8, SLD = BM + 4, PLD = BM + 8;
  extern __shared__ __align__(128) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + kBN * LD;
  T* qs = vs + kBN * LD;
  T* dos = qs + BM * LD;
  float* st = reinterpret_cast<float*>(dos + BM * LD);  // Sᵀ: [key][query]
  float* dpt = st + kBN * SLD;                          // dPdᵀ
  T* pt = reinterpret_cast<T*>(dpt + kBN * SLD);        // pdᵀ
  T* dst = pt + kBN * PLD;                              // dSᵀ
  float* lse_s = reinterpret_cast<float*>(dst + kBN * PLD);
  float* dsum_s = lse_s + BM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.x, b = bh / heads;
  const int h = static_cast<int>(bh % heads);
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * kBN;
  const int64_t ld = 3LL * heads * D, ldy = static_cast<int64_t>(heads) * D;
  const T* qg = qkv + b * t * ld + static_cast<int64_t>(h) * D;
  const T* kg = qg + ldy;
  const T* vg = kg + ldy;
  const T* dyg = dy + b * t * ldy + static_cast<int64_t>(h) * D;

  load_tile<D>(ks, kg, ld, k0, t, kBN);
  load_tile<D>(vs, vg, ld, k0, t, kBN);
  FragC dk[D / 16], dv[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  for (int64_t q0 = k0 / BM * BM; q0 < t; q0 += BM) {
    __syncthreads();
    load_tile<D>(qs, qg, ld, q0, t, BM);
    load_tile<D>(dos, dyg, ldy, q0, t, BM);
    for (int r = threadIdx.x; r < BM; r += blockDim.x) {
      lse_s[r] = q0 + r < t ? lse[bh * t + q0 + r] : 0.0f;
      dsum_s[r] = q0 + r < t ? dsum[bh * t + q0 + r] : 0.0f;
    }
    __syncthreads();
    {  // Sᵀ = K·Qᵀ and dPdᵀ = V·dYᵀ for the warp's 16 keys.
      FragC s[BM / 16], dp[BM / 16];
#pragma unroll
      for (int n = 0; n < BM / 16; ++n) {
        wmma::fill_fragment(s[n], 0.0f);
        wmma::fill_fragment(dp[n], 0.0f);
      }
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA<T> ak, av;
        wmma::load_matrix_sync(ak, ks + warp * 16 * LD + kk * 16, LD);
        wmma::load_matrix_sync(av, vs + warp * 16 * LD + kk * 16, LD);
#pragma unroll
        for (int n = 0; n < BM / 16; ++n) {
          FragBT<T> bq, bdo;
          wmma::load_matrix_sync(bq, qs + n * 16 * LD + kk * 16, LD);
          wmma::mma_sync(s[n], ak, bq, s[n]);
          wmma::load_matrix_sync(bdo, dos + n * 16 * LD + kk * 16, LD);
          wmma::mma_sync(dp[n], av, bdo, dp[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < BM / 16; ++n) {
        wmma::store_matrix_sync(st + warp * 16 * SLD + n * 16, s[n], SLD, wmma::mem_row_major);
        wmma::store_matrix_sync(dpt + warp * 16 * SLD + n * 16, dp[n], SLD, wmma::mem_row_major);
      }
    }
    __syncwarp();
    // Lane → (group of 8 keys, query): consecutive lanes take consecutive queries.
    for (int idx = lane; idx < 2 * BM; idx += 32) {
      const int g = idx / BM, r = idx % BM;
      const int kr = warp * 16 + g * 8;
      const Probs pr = probs8(st + kr * SLD + r, dpt + kr * SLD + r, SLD, q0 + r, k0 + kr, t, bh,
                              scale, lse_s[r], dsum_s[r], mask);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        pt[(kr + j) * PLD + r] = from_acc<T>(pr.pd[j]);
        dst[(kr + j) * PLD + r] = from_acc<T>(pr.ds[j]);
      }
    }
    __syncwarp();
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      FragA<T> ap, ads;
      wmma::load_matrix_sync(ap, pt + warp * 16 * PLD + kk * 16, PLD);
      wmma::load_matrix_sync(ads, dst + warp * 16 * PLD + kk * 16, PLD);
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        FragB<T> bdo, bq;
        wmma::load_matrix_sync(bdo, dos + kk * 16 * LD + n * 16, LD);
        wmma::mma_sync(dv[n], ap, bdo, dv[n]);
        wmma::load_matrix_sync(bq, qs + kk * 16 * LD + n * 16, LD);
        wmma::mma_sync(dk[n], ads, bq, dk[n]);
      }
    }
  }
  __syncthreads();  // the staging below spans st and dpt of every warp
  T* dqk = dqkv + b * t * ld + static_cast<int64_t>(heads + h) * D;
  store_rows<D>(dk, scale, st, dqk, ld, k0, t);
  __syncwarp();
  store_rows<D>(dv, 1.0f, st, dqk + ldy, ld, k0, t);
}

template <class T, int D>
__global__ void __launch_bounds__(128)
    attn_bwd_dq_kernel(const T* qkv, const T* dy, const float* lse, const float* dsum, T* dqkv,
                       int64_t t, int heads, float scale, DeviceMask mask) {
  constexpr int BM = kBwdBM, LD = D + 8, SLD = kBN + 4, PLD = kBN + 8;
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* dos = qs + BM * LD;
  T* ks = dos + BM * LD;
  T* vs = ks + kBN * LD;
  float* ss = reinterpret_cast<float*>(vs + kBN * LD);  // S: [query][key]
  float* dps = ss + BM * SLD;                           // dPd
  T* dss = reinterpret_cast<T*>(dps + BM * SLD);        // dS
  float* lse_s = reinterpret_cast<float*>(dss + BM * PLD);
  float* dsum_s = lse_s + BM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.x, b = bh / heads;
  const int h = static_cast<int>(bh % heads);
  const int64_t q0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * BM;  // long rows first
  const int64_t ld = 3LL * heads * D, ldy = static_cast<int64_t>(heads) * D;
  const T* qg = qkv + b * t * ld + static_cast<int64_t>(h) * D;
  const T* kg = qg + ldy;
  const T* vg = kg + ldy;
  const T* dyg = dy + b * t * ldy + static_cast<int64_t>(h) * D;
  const int nkt = static_cast<int>(((t < q0 + BM ? t : q0 + BM) + kBN - 1) / kBN);

  load_tile<D>(qs, qg, ld, q0, t, BM);
  load_tile<D>(dos, dyg, ldy, q0, t, BM);
  for (int r = threadIdx.x; r < BM; r += blockDim.x) {
    lse_s[r] = q0 + r < t ? lse[bh * t + q0 + r] : 0.0f;
    dsum_s[r] = q0 + r < t ? dsum[bh * t + q0 + r] : 0.0f;
  }
  FragC dq[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);
  for (int kt = 0; kt < nkt; ++kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * kBN;
    __syncthreads();
    load_tile<D>(ks, kg, ld, k0, t, kBN);
    load_tile<D>(vs, vg, ld, k0, t, kBN);
    __syncthreads();
    {  // S = Q·Kᵀ and dPd = dY·Vᵀ for the warp's 16 queries.
      FragC s[kBN / 16], dp[kBN / 16];
#pragma unroll
      for (int n = 0; n < kBN / 16; ++n) {
        wmma::fill_fragment(s[n], 0.0f);
        wmma::fill_fragment(dp[n], 0.0f);
      }
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA<T> aq, ado;
        wmma::load_matrix_sync(aq, qs + warp * 16 * LD + kk * 16, LD);
        wmma::load_matrix_sync(ado, dos + warp * 16 * LD + kk * 16, LD);
#pragma unroll
        for (int n = 0; n < kBN / 16; ++n) {
          FragBT<T> bk, bv;
          wmma::load_matrix_sync(bk, ks + n * 16 * LD + kk * 16, LD);
          wmma::mma_sync(s[n], aq, bk, s[n]);
          wmma::load_matrix_sync(bv, vs + n * 16 * LD + kk * 16, LD);
          wmma::mma_sync(dp[n], ado, bv, dp[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < kBN / 16; ++n) {
        wmma::store_matrix_sync(ss + warp * 16 * SLD + n * 16, s[n], SLD, wmma::mem_row_major);
        wmma::store_matrix_sync(dps + warp * 16 * SLD + n * 16, dp[n], SLD, wmma::mem_row_major);
      }
    }
    __syncwarp();
    // Lane → (query, group of 8 keys).
    for (int idx = lane; idx < 16 * (kBN / 8); idx += 32) {
      const int r = warp * 16 + idx / (kBN / 8), c = (idx % (kBN / 8)) * 8;
      // probs8 walks keys with a stride; here keys are adjacent (stride 1).
      const Probs pr = probs8(ss + r * SLD + c, dps + r * SLD + c, 1, q0 + r, k0 + c, t, bh, scale,
                              lse_s[r], dsum_s[r], mask);
      store_vec<8>(dss + r * PLD + c, pr.ds);
    }
    __syncwarp();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      FragA<T> ads;
      wmma::load_matrix_sync(ads, dss + warp * 16 * PLD + kk * 16, PLD);
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        FragB<T> bk;
        wmma::load_matrix_sync(bk, ks + kk * 16 * LD + n * 16, LD);
        wmma::mma_sync(dq[n], ads, bk, dq[n]);
      }
    }
  }
  __syncthreads();  // the staging below spans ss and dps of every warp
  store_rows<D>(dq, scale, ss, dqkv + b * t * ld + static_cast<int64_t>(h) * D, ld, q0, t);
}

template <int D>
constexpr size_t dq_smem() {
  // 4 operand tiles, two fp32 64×68 tiles, one 16-bit 64×72 tile, lse and D.
  return 4 * static_cast<size_t>(64) * (D + 8) * 2 + 2 * 64 * 68 * 4 + 64 * 72 * 2 + 2 * 64 * 4;
}

template <class F>
void with_head_dim(int64_t d, const F& f) {
  if (d == 32) return f.template operator()<32>();
  if (d == 64) return f.template operator()<64>();
  if (d == 128) return f.template operator()<128>();
  FFN_CHECK(false, "[fused_attention] head_dim ", d, " has no CUDA kernel");
}

template <class F>
void with_half(DType dt, const F& f) {
  if (dt == DType::bf16) return f.template operator()<bf16>();
  FFN_CHECK(dt == DType::f16, "[fused_attention] no CUDA kernel for ", dtype_name(dt));
  f.template operator()<f16>();
}

// Shared-memory opt-in for one kernel on the current device (raised only when needed; the
// kernels of one signature share a function type, so the record is keyed by address).
void allow_smem(const void* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return;
  static std::map<std::pair<const void*, int>, size_t> allowed;
  int dev = 0;
  FFN_CHECK_CUDA(cudaGetDevice(&dev));
  size_t& have = allowed[{kernel, dev}];
  if (bytes > have) {
    FFN_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
    have = bytes;
  }
}

// The current device's shared memory per block (with opt-in), per SM.
struct SmemLimits {
  size_t block = 0, sm = 0;
};
SmemLimits smem_limits() {
  int dev = 0, block = 0, sm = 0;
  FFN_CHECK_CUDA(cudaGetDevice(&dev));
  FFN_CHECK_CUDA(cudaDeviceGetAttribute(&block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  FFN_CHECK_CUDA(cudaDeviceGetAttribute(&sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  return {static_cast<size_t>(block), static_cast<size_t>(sm)};
}

size_t fwd_bytes(int bm, int64_t t, int d) {
  return static_cast<size_t>(bm) * 4 * static_cast<size_t>(fwd_sld(t, d)) +
         static_cast<size_t>(bm + kBN) * (d + 8) * 2;
}

// Query rows per forward block: 64 when two such blocks fit on an SM, else 32 when one
// block fits at all, else 0 (no kernel for this T).
int fwd_bm(int64_t t, int d) {
  const SmemLimits lim = smem_limits();
  if (fwd_bytes(64, t, d) <= std::min(lim.block, lim.sm / 2 - 1024)) return 64;
  return fwd_bytes(32, t, d) <= lim.block ? 32 : 0;
}

size_t bwd_bytes(int64_t d) {
  size_t out = 0;
  with_head_dim(d, [&]<int D>() { out = std::max(bwd_smem<D>(), dq_smem<D>()); });
  return out;
}

// 16-byte vector loads and stores need 16-byte aligned bases (rows are multiples of 8).
void check_aligned(std::initializer_list<const Tensor*> ts, const char* op) {
  for (const Tensor* t : ts)
    FFN_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, "[", op,
              "] CUDA kernel needs 16-byte aligned tensors; got ", t->desc());
}

bool fused_attention_supported_impl(DType dt, int64_t t, int64_t head_dim) {
  return (dt == DType::bf16 || dt == DType::f16) &&
         (head_dim == 32 || head_dim == 64 || head_dim == 128) && t > 0 && t <= 65535 * 32 &&
         fwd_bm(t, static_cast<int>(head_dim)) > 0 && bwd_bytes(head_dim) <= smem_limits().block;
}

}  // namespace

bool fused_attention_supported(DType dt, int64_t t, int64_t head_dim) {
  return fused_attention_supported_impl(dt, t, head_dim);
}

void fused_attention(const Tensor& qkv, int64_t heads, double scale, const DropoutSpec& d,
                     Tensor& y, Tensor& lse) {
  const int dev = qkv.device().index;
  DeviceGuard guard(dev);
  check_aligned({&qkv, &y}, "fused_attention");
  const int64_t b = qkv.size(0), t = qkv.size(1), hd = qkv.size(2) / (3 * heads);
  if (b == 0 || t == 0) return;
  const int bm = fwd_bm(t, static_cast<int>(hd));
  const int sld = static_cast<int>(fwd_sld(t, static_cast<int>(hd)));
  const DeviceMask mask = DeviceMask::from(d);
  with_half(qkv.dtype(), [&]<class H>() {
    using T = device_t<H>;
    with_head_dim(hd, [&]<int D>() {
      const dim3 grid(static_cast<unsigned>(b * heads), static_cast<unsigned>((t + bm - 1) / bm));
      auto launch = [&]<int BM>() {
        const size_t bytes = fwd_smem_fixed<D, BM>() + static_cast<size_t>(BM) * sld * 4;
        allow_smem(reinterpret_cast<const void*>(attn_fwd_kernel<T, D, BM>), bytes);
        attn_fwd_kernel<T, D, BM><<<grid, BM * 2, bytes, stream(dev)>>>(
            dptr<T>(qkv), dptr<T>(y), lse.data<float>(), t, static_cast<int>(heads), sld,
            static_cast<float>(scale), mask);
      };
      if (bm == 64)
        launch.template operator()<64>();
      else
        launch.template operator()<32>();
      FFN_CHECK_LAUNCH();
    });
  });
}

void fused_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& dy,
                              const Tensor& lse, int64_t heads, double scale, const DropoutSpec& d,
                              Tensor& dqkv) {
  const int dev = qkv.device().index;
  DeviceGuard guard(dev);
  check_aligned({&qkv, &y, &dy, &dqkv}, "fused_attention_backward");
  const int64_t b = qkv.size(0), t = qkv.size(1), hd = qkv.size(2) / (3 * heads);
  if (b == 0 || t == 0) return;
  const DeviceMask mask = DeviceMask::from(d);
  Tensor dsum = Tensor::empty({b * heads, t}, DType::f32, qkv.device());
  with_half(qkv.dtype(), [&]<class H>() {
    using T = device_t<H>;
    with_head_dim(hd, [&]<int D>() {
      const int64_t rows = b * t * heads;
      attn_rowdot_kernel<T, D><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream(dev)>>>(
          dptr<T>(y), dptr<T>(dy), dsum.data<float>(), rows, t, static_cast<int>(heads));
      FFN_CHECK_LAUNCH();
      const unsigned tiles = static_cast<unsigned>((t + 63) / 64);
      const dim3 grid(static_cast<unsigned>(b * heads), tiles);
      allow_smem(reinterpret_cast<const void*>(attn_bwd_dkv_kernel<T, D>), bwd_smem<D>());
      attn_bwd_dkv_kernel<T, D><<<grid, 128, bwd_smem<D>(), stream(dev)>>>(
          dptr<T>(qkv), dptr<T>(dy), lse.data<float>(), dsum.data<float>(), dptr<T>(dqkv), t,
          static_cast<int>(heads), static_cast<float>(scale), mask);
      FFN_CHECK_LAUNCH();
      allow_smem(reinterpret_cast<const void*>(attn_bwd_dq_kernel<T, D>), dq_smem<D>());
      attn_bwd_dq_kernel<T, D><<<grid, 128, dq_smem<D>(), stream(dev)>>>(
          dptr<T>(qkv), dptr<T>(dy), lse.data<float>(), dsum.data<float>(), dptr<T>(dqkv), t,
          static_cast<int>(heads), static_cast<float>(scale), mask);
      FFN_CHECK_LAUNCH();
    });
  });
}

}  // namespace ffn::cuda
