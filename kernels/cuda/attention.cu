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
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <class T>
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 8 floats at a 16-byte aligned address.
__device__ __forceinline__ void load8f(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
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

// Asynchronous 16-byte global → shared copies (cp.async, sm_80+); a copy with valid =
// false writes zeros. Tiles are double-buffered: the next tile's copies are in flight
// while the current one is used.
__device__ __forceinline__ void cp_async16(void* sm, const void* g, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(sm));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(g),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Starts copying a rows×D tile of a row-major matrix (row stride ld), rows [r0, r0+rows),
// into shared memory with row stride D+8; rows ≥ t become zeros.
template <int D, class T>
__device__ __forceinline__ void load_tile(T* sm, const T* g, int64_t ld, int64_t r0, int64_t t,
                                          int rows) {
  constexpr int V = D / 8;
  for (int idx = threadIdx.x; idx < rows * V; idx += blockDim.x) {
    const int r = idx / V, c = (idx % V) * 8;
    const bool ok = r0 + r < t;
    cp_async16(sm + r * (D + 8) + c, ok ? g + (r0 + r) * ld + c : g, ok);
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
constexpr size_t fwd_smem_fixed() {  // Q and two K/V tiles
  return static_cast<size_t>(BM + 2 * kBN) * (D + 8) * 2;
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
  T* kv[2] = {qs + BM * LD, qs + (BM + kBN) * LD};  // K tiles, then V tiles
  float* ss = reinterpret_cast<float*>(qs + (BM + 2 * kBN) * LD);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.x, b = bh / heads;
  const int h = static_cast<int>(bh % heads);
  const int64_t q0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * BM;  // long rows first
  const int64_t ld = 3LL * heads * D;
  const T* qg = qkv + b * t * ld + static_cast<int64_t>(h) * D;
  const T* kg = qg + static_cast<int64_t>(heads) * D;
  const T* vg = kg + static_cast<int64_t>(heads) * D;
  const int nkt = static_cast<int>(((t < q0 + BM ? t : q0 + BM) + kBN - 1) / kBN);
  // Tile u of the stream K_0 … K_{n-1}, V_0 … V_{n-1} goes to kv[u % 2].
  auto fetch = [&](int u) {
    if (u < 2 * nkt)
      load_tile<D>(kv[u & 1], u < nkt ? kg : vg, ld, static_cast<int64_t>(u % nkt) * kBN, t, kBN);
    cp_commit();
  };

  load_tile<D>(qs, qg, ld, q0, t, BM);
  fetch(0);
  for (int kt = 0; kt < nkt; ++kt) {
    fetch(kt + 1);
    cp_wait<1>();
    __syncthreads();
    const T* ks = kv[kt & 1];
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
    __syncthreads();  // kv[kt % 2] is refilled next iteration
  }

  // Exact softmax of the warp's 16 rows, two lanes per row (lane r and r+16 take alternate
  // 8-column groups); pd overwrites the row's scores in place: 16-bit column j lies in the
  // bytes of float j/2, and a step writes only floats that every lane has read already
  // (step k reads floats ≥ 16k, writes floats < 8k + 8; __syncwarp between).
  {
    const int r = lane & 15, hf = lane >> 4;
    const int64_t i = q0 + warp * 16 + r;
    float* row = ss + (warp * 16 + r) * sld;
    T* prow = reinterpret_cast<T*>(row);
    const int valid = i < t ? static_cast<int>(i + 1) : 0;
    const int ncols = nkt * kBN;
    float mx = -INFINITY;
    for (int c0 = 8 * hf; c0 < valid; c0 += 16) {
      float v[8];
      load8f(row + c0, v);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (c0 + j < valid) mx = fmaxf(mx, v[j]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16)) * scale;
    float sum = 0.0f;
    for (int c0 = 8 * hf; c0 < valid; c0 += 16) {
      float v[8];
      load8f(row + c0, v);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (c0 + j < valid) sum += __expf(v[j] * scale - mx);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 16);
    const float inv = 1.0f / sum;
    if (hf == 0 && i < t) lse[bh * t + i] = mx + logf(sum);
    const uint64_t e_row = (static_cast<uint64_t>(bh) * t + i) * t;
    for (int c0 = 8 * hf; c0 < ncols; c0 += 16) {  // the same trip count in every lane
      float v[8], f[8] = {};
      load8f(row + c0, v);
      __syncwarp();
      if (c0 < valid) mask8(mask, e_row + c0, f);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        v[j] = c0 + j < valid ? __expf(v[j] * scale - mx) * inv * f[j] : 0.0f;
      store_vec<8>(prow + c0, v);
    }
  }
  __syncwarp();

  // O = pd·V over the same key tiles (V_0 has been in flight during the softmax).
  FragC o[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(o[n], 0.0f);
  const T* prow0 = reinterpret_cast<const T*>(ss + warp * 16 * sld);
  for (int kt = 0; kt < nkt; ++kt) {
    fetch(nkt + kt + 1);
    cp_wait<1>();
    __syncthreads();
    const T* vs = kv[(nkt + kt) & 1];
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      FragA<T> a;
      wmma::load_matrix_sync(a, prow0 + kt * kBN + kk * 16, 2 * sld);
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        FragB<T> bv;
        wmma::load_matrix_sync(bv, vs + kk * 16 * LD + n * 16, LD);
        wmma::mma_sync(o[n], a, bv, o[n]);
      }
    }
    __syncthreads();
  }
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
  // 6 operand tiles (2 fixed, 2 double-buffered), two fp32 64×68 tiles, two 16-bit 64×72
  // tiles, lse and D (double-buffered).
  return 6 * static_cast<size_t>(64) * (D + 8) * 2 + 2 * 64 * 68 * 4 + 2 * 64 * 72 * 2 +
         4 * 64 * 4;
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

// lse and D of query rows [q0, q0+64) into shared memory (zeros past T).
__device__ __forceinline__ void load_row_stats(float* lse_s, float* dsum_s, const float* lse,
                                               const float* dsum, int64_t bh, int64_t q0,
                                               int64_t t) {
  for (int r = threadIdx.x; r < kBwdBM; r += blockDim.x) {
    lse_s[r] = q0 + r < t ? lse[bh * t + q0 + r] : 0.0f;
    dsum_s[r] = q0 + r < t ? dsum[bh * t + q0 + r] : 0.0f;
  }
}

// The first product stage of both backward kernels, for one warp: o1 = a1·b1ᵀ and
// o2 = a2·b2ᵀ, where a1, a2 are the warp's 16 rows (row stride D+8), b1, b2 are 64-row
// tiles (row stride D+8), and o1, o2 receive 16×64 fp32 (row stride 68).
template <int D, class T>
__device__ __forceinline__ void two_products_nt(const T* a1, const T* a2, const T* b1,
                                                const T* b2, float* o1, float* o2) {
  constexpr int LD = D + 8, N = 64 / 16, OLD = 64 + 4;
  FragC c1[N], c2[N];
#pragma unroll
  for (int n = 0; n < N; ++n) {
    wmma::fill_fragment(c1[n], 0.0f);
    wmma::fill_fragment(c2[n], 0.0f);
  }
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    FragA<T> f1, f2;
    wmma::load_matrix_sync(f1, a1 + kk * 16, LD);
    wmma::load_matrix_sync(f2, a2 + kk * 16, LD);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      FragBT<T> g1, g2;
      wmma::load_matrix_sync(g1, b1 + n * 16 * LD + kk * 16, LD);
      wmma::mma_sync(c1[n], f1, g1, c1[n]);
      wmma::load_matrix_sync(g2, b2 + n * 16 * LD + kk * 16, LD);
      wmma::mma_sync(c2[n], f2, g2, c2[n]);
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    wmma::store_matrix_sync(o1 + n * 16, c1[n], OLD, wmma::mem_row_major);
    wmma::store_matrix_sync(o2 + n * 16, c2[n], OLD, wmma::mem_row_major);
  }
}

template <class T, int D>
__global__ void __launch_bounds__(128)
    attn_bwd_dkv_kernel(const T* qkv, const T* dy, const float* lse, const float* dsum, T* dqkv,
                        int64_t t, int heads, float scale, DeviceMask mask) {
  constexpr int BM = kBwdBM, LD = D + 8, SLD = BM + 4, PLD = BM + 8;  // SLD: two_products_nt
  extern __shared__ __align__(128) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + kBN * LD;
  T* qbuf = vs + kBN * LD;           // Q tiles, double-buffered
  T* dobuf = qbuf + 2 * BM * LD;     // dY tiles, double-buffered
  float* st = reinterpret_cast<float*>(dobuf + 2 * BM * LD);  // Sᵀ: [key][query]
  float* dpt = st + kBN * SLD;                                 // dPdᵀ
  T* pt = reinterpret_cast<T*>(dpt + kBN * SLD);               // pdᵀ
  T* dst = pt + kBN * PLD;                                     // dSᵀ
  float* stats = reinterpret_cast<float*>(dst + kBN * PLD);    // [2][lse | D]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.x, b = bh / heads;
  const int h = static_cast<int>(bh % heads);
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * kBN;
  const int64_t ld = 3LL * heads * D, ldy = static_cast<int64_t>(heads) * D;
  const T* qg = qkv + b * t * ld + static_cast<int64_t>(h) * D;
  const T* kg = qg + ldy;
  const T* vg = kg + ldy;
  const T* dyg = dy + b * t * ldy + static_cast<int64_t>(h) * D;
  const int64_t qfirst = k0 / BM * BM;
  auto fetch = [&](int it) {  // query tile `it` (from qfirst) into buffer it % 2
    const int64_t q0 = qfirst + static_cast<int64_t>(it) * BM;
    if (q0 < t) {
      const int nb = it & 1;
      load_tile<D>(qbuf + nb * BM * LD, qg, ld, q0, t, BM);
      load_tile<D>(dobuf + nb * BM * LD, dyg, ldy, q0, t, BM);
      load_row_stats(stats + nb * 2 * BM, stats + nb * 2 * BM + BM, lse, dsum, bh, q0, t);
    }
    cp_commit();
  };

  load_tile<D>(ks, kg, ld, k0, t, kBN);
  load_tile<D>(vs, vg, ld, k0, t, kBN);
  fetch(0);
  FragC dk[D / 16], dv[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  for (int it = 0; qfirst + static_cast<int64_t>(it) * BM < t; ++it) {
    const int64_t q0 = qfirst + static_cast<int64_t>(it) * BM;
    fetch(it + 1);
    cp_wait<1>();
    __syncthreads();
    const T* qs = qbuf + (it & 1) * BM * LD;
    const T* dos = dobuf + (it & 1) * BM * LD;
    const float* lse_s = stats + (it & 1) * 2 * BM;
    const float* dsum_s = lse_s + BM;
    // Sᵀ = K·Qᵀ and dPdᵀ = V·dYᵀ for the warp's 16 keys.
    two_products_nt<D>(ks + warp * 16 * LD, vs + warp * 16 * LD, qs, dos, st + warp * 16 * SLD,
                       dpt + warp * 16 * SLD);
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
    __syncthreads();  // this buffer is refilled next iteration
  }
  cp_wait<0>();
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
  constexpr int BM = kBwdBM, LD = D + 8, SLD = kBN + 4, PLD = kBN + 8;  // SLD: two_products_nt
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* dos = qs + BM * LD;
  T* kbuf = dos + BM * LD;          // K tiles, double-buffered
  T* vbuf = kbuf + 2 * kBN * LD;    // V tiles, double-buffered
  float* ss = reinterpret_cast<float*>(vbuf + 2 * kBN * LD);  // S: [query][key]
  float* dps = ss + BM * SLD;                                  // dPd
  T* dss = reinterpret_cast<T*>(dps + BM * SLD);               // dS
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
  auto fetch = [&](int kt) {  // key tile kt into buffer kt % 2
    if (kt < nkt) {
      load_tile<D>(kbuf + (kt & 1) * kBN * LD, kg, ld, static_cast<int64_t>(kt) * kBN, t, kBN);
      load_tile<D>(vbuf + (kt & 1) * kBN * LD, vg, ld, static_cast<int64_t>(kt) * kBN, t, kBN);
    }
    cp_commit();
  };

  load_tile<D>(qs, qg, ld, q0, t, BM);
  load_tile<D>(dos, dyg, ldy, q0, t, BM);
  load_row_stats(lse_s, dsum_s, lse, dsum, bh, q0, t);
  fetch(0);
  FragC dq[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);
  for (int kt = 0; kt < nkt; ++kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * kBN;
    fetch(kt + 1);
    cp_wait<1>();
    __syncthreads();
    const T* ks = kbuf + (kt & 1) * kBN * LD;
    const T* vs = vbuf + (kt & 1) * kBN * LD;
    // S = Q·Kᵀ and dPd = dY·Vᵀ for the warp's 16 queries.
    two_products_nt<D>(qs + warp * 16 * LD, dos + warp * 16 * LD, ks, vs, ss + warp * 16 * SLD,
                       dps + warp * 16 * SLD);
    __syncwarp();
    // Lane → (query, group of 8 keys).
    for (int idx = lane; idx < 16 * (kBN / 8); idx += 32) {
      const int r = warp * 16 + idx / (kBN / 8), c = (idx % (kBN / 8)) * 8;
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
    __syncthreads();  // this buffer is refilled next iteration
  }
  cp_wait<0>();
  __syncthreads();  // the staging below spans ss and dps of every warp
  store_rows<D>(dq, scale, ss, dqkv + b * t * ld + static_cast<int64_t>(h) * D, ld, q0, t);
}

template <int D>
constexpr size_t dq_smem() {
  // 6 operand tiles (Q, dY, and K, V double-buffered), two fp32 64×68 tiles, one 16-bit
  // 64×72 tile, lse and D.
  return 6 * static_cast<size_t>(64) * (D + 8) * 2 + 2 * 64 * 68 * 4 + 64 * 72 * 2 + 2 * 64 * 4;
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
// kernels of one signature share a function type, so the record is keyed by address). Not
// thread-safe: one host thread drives a device (Note [One compute stream]).
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

// The current device's shared memory per block (with opt-in), per SM; read once per device
// (the layer asks at every forward).
struct SmemLimits {
  size_t block = 0, sm = 0;
};
SmemLimits smem_limits() {
  static std::map<int, SmemLimits> known;
  int dev = 0;
  FFN_CHECK_CUDA(cudaGetDevice(&dev));
  const auto it = known.find(dev);
  if (it != known.end()) return it->second;
  int block = 0, sm = 0;
  FFN_CHECK_CUDA(cudaDeviceGetAttribute(&block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  FFN_CHECK_CUDA(cudaDeviceGetAttribute(&sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  return known[dev] = {static_cast<size_t>(block), static_cast<size_t>(sm)};
}

size_t fwd_bytes(int bm, int64_t t, int d) {
  return static_cast<size_t>(bm) * 4 * static_cast<size_t>(fwd_sld(t, d)) +
         static_cast<size_t>(bm + 2 * kBN) * (d + 8) * 2;
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

bool fused_attention_preferred(DType dt, int64_t t, int64_t head_dim) {
  return fused_attention_supported_impl(dt, t, head_dim) &&
         fwd_bm(t, static_cast<int>(head_dim)) == 64;
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
