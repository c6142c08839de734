// kernels/cuda/attention.cu — fused causal attention (kernels/attention.h) on tensor cores,
// FlashAttention-2 style: mma.sync m16n8k16 (16-bit inputs, fp32 accumulation) with ldmatrix
// operand loads from shared memory; scores and probabilities stay in registers.
//
// Every kernel runs 4 warps on a 64-row block of one head (bh = b·H + h); a warp owns 16
// rows, holding its 16×64 score tile and its 16×D accumulator as mma fragments.
// Forward, one block per 64 queries: walks the key tiles up to the diagonal with an online
//   softmax (running row max and sum, in log2 units), drops in registers, accumulates
//   O += pd·V, and ends with y = O/sum and lse = max + log(sum).
// Backward, two kernels, no atomics (deterministic):
//   dq:  one block per 64 queries. First D_i = dy_i·y_i (written out for dkv); then walks
//        the key tiles up to the diagonal: S = Q·Kᵀ, dPd = dY·Vᵀ → dS → dQ += dS·K.
//   dkv: one block per 64 keys (launched after dq). Walks the query tiles from the
//        diagonal on: Sᵀ = K·Qᵀ, dPdᵀ = V·dYᵀ → pdᵀ, dSᵀ → dV += pdᵀ·dY, dK += dSᵀ·Q.
// The streamed tiles (K/V in forward and dq, Q/dY in dkv) are double-buffered with cp.async.
// No limit on T beyond the grid (64·65535 rows). On Hopper with head_dim 64 the entry points
// hand over to the wgmma kernels of attention_sm90_*.cu (Note [Hopper attention]).
//
// Note [Attention mask draws]: element (bh, i, j) uses draw (bh·T + i)·T + j. Before the
// probabilities of a tile, a warp draws its tile's keep bits into shared memory, one byte
// per (query, 8 consecutive keys) — one Philox call when T % 8 == 0, so no draw is made
// twice — and each lane then picks the bits of its fragment elements.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/attention.h"
#include "kernels/bias_act_dropout.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_sm90.h"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/rowwise.cuh"
#include "kernels/scale.h"

namespace ffn::cuda {

namespace {

using namespace attn;  // pack2, ex2, draw_bytes (attention.cuh)
constexpr int kTile = 64;   // rows per block, keys or queries per streamed tile
constexpr int kWarps = 4;   // 16 rows each

// ---------------------------------------------------------------------------------------
// Memory movement.

// Asynchronous 16-byte global → shared copies (cp.async, sm_80+); a copy with valid =
// false writes zeros.
__device__ __forceinline__ void cp_async16(void* sm, const void* g, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(sm));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(g),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

// Starts copying a 64×D tile of a row-major matrix (row stride ld), rows [r0, r0+64), into
// shared memory with row stride D+8 (so ldmatrix's 8 row addresses hit 8 distinct 16-byte
// bank groups); rows ≥ t become zeros.
template <int D, class T>
__device__ __forceinline__ void load_tile(T* sm, const T* g, int64_t ld, int64_t r0, int64_t t) {
  constexpr int V = D / 8;
  for (int idx = threadIdx.x; idx < kTile * V; idx += blockDim.x) {
    const int r = idx / V, c = (idx % V) * 8;
    const bool ok = r0 + r < t;
    cp_async16(sm + r * (D + 8) + c, ok ? g + (r0 + r) * ld + c : g, ok);
  }
}

// ---------------------------------------------------------------------------------------
// Fragments. A lane (g = lane/4, c = lane%4) holds C elements (g, 2c), (g, 2c+1),
// (g+8, 2c), (g+8, 2c+1) of each 16×8 tile: acc[n][0..3] in that order.

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm4(u32 (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm4_t(u32 (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The A fragments of rows [0, 16) × k-columns [16kk, 16kk+16) of a row-major 16-bit tile
// (row stride LD) at a.
template <int LD, class T>
__device__ __forceinline__ void load_a(u32 (&af)[4], const T* a, int kk, int lane) {
  ldsm4(af, a + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8);
}

// acc (16×64, 8 n-tiles) += A·Bᵀ over k-columns [16kk, 16kk+16): af is A's fragment, b a
// 64-row 16-bit tile (row stride LD) whose rows are the 64 output columns.
template <int LD, class T>
__device__ __forceinline__ void mma_abt_k(float (&acc)[8][4], const u32 (&af)[4], const T* b,
                                          int kk, int lane) {
#pragma unroll
  for (int np = 0; np < 4; ++np) {
    u32 bf[4];
    ldsm4(bf, b + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
    mma16816<T>(acc[2 * np], af, bf[0], bf[1]);
    mma16816<T>(acc[2 * np + 1], af, bf[2], bf[3]);
  }
}

// acc (16×64) = A·Bᵀ over all D columns, A the warp's 16 rows at a.
template <int D, class T>
__device__ __forceinline__ void mma_abt(float (&acc)[8][4], const T* a, const T* b, int lane) {
  constexpr int LD = D + 8;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    u32 af[4];
    load_a<LD>(af, a, kk, lane);
    mma_abt_k<LD>(acc, af, b, kk, lane);
  }
}

// The C fragments of a 16×64 fp32 tile as A fragments of a 16-bit one (k = 64).
template <class T>
__device__ __forceinline__ void to_a(const float (&s)[8][4], u32 (&pf)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    pf[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    pf[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    pf[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pf[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// acc (16×D, D/8 n-tiles) += P·B: P is a 16×64 tile as A fragments, B a 64×D row-major
// 16-bit tile at b (row stride D+8), read transposed by ldmatrix.
template <int D, class T>
__device__ __forceinline__ void mma_pb(float (&acc)[D / 8][4], const u32 (&pf)[4][4], const T* b,
                                       int lane) {
  constexpr int LD = D + 8;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      u32 bf[4];
      ldsm4_t(bf, b + (kk * 16 + (lane & 15)) * LD + dp * 16 + (lane >> 4) * 8);
      mma16816<T>(acc[2 * dp], pf[kk], bf[0], bf[1]);
      mma16816<T>(acc[2 * dp + 1], pf[kk], bf[2], bf[3]);
    }
}

// Writes a warp's 16×D accumulator times `mul` to rows [r0, r0+16) of a row-major 16-bit
// matrix (row stride ld); rows ≥ t are skipped. rope (optional, rope_table's [t, D/2]): each
// row rotated back by its position's angles first (Note [Fused rotary embeddings]); the
// lane's column 8n + 2c + e (n < D/16) pairs with n + D/16's.
template <int D, class T>
__device__ __forceinline__ void store_acc(const float (&acc)[D / 8][4], float mul0, float mul1,
                                          T* g, int64_t ld, int64_t r0, int64_t t, int lane,
                                          const float2* rope = nullptr) {
  const int gr = lane >> 2, c = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = r0 + gr + 8 * half;
    if (row >= t) continue;
    const float mul = half ? mul1 : mul0;
    float v[D / 4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      v[2 * n] = acc[n][2 * half] * mul, v[2 * n + 1] = acc[n][2 * half + 1] * mul;
    if (rope) {
      const float2* cs = rope + row * (D / 2) + 2 * c;
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(cs + 8 * n));
        rope_rotate(v[2 * n], v[2 * n + D / 8], a.x, a.y, -1.0f);
        rope_rotate(v[2 * n + 1], v[2 * n + 1 + D / 8], a.z, a.w, -1.0f);
      }
    }
    u32* out = reinterpret_cast<u32*>(g + row * ld + 2 * c);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) out[4 * n] = pack2<T>(v[2 * n], v[2 * n + 1]);
  }
}

// ---------------------------------------------------------------------------------------
// Forward.

template <int D>
constexpr size_t fwd_smem() {  // Q, two K and two V tiles, mask bytes
  return 5 * static_cast<size_t>(kTile) * (D + 8) * 2 + kWarps * 128;
}

template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32)
    attn_fwd_kernel(const T* qkv, T* y, float* lse, int64_t t, int heads, float scale,
                    DeviceMask mask) {
  constexpr int LD = D + 8, TS = kTile * LD;
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* kbuf = qs + TS;         // [2] K tiles
  T* vbuf = kbuf + 2 * TS;   // [2] V tiles
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane >> 2, c = lane & 3;
  uint8_t* mb = reinterpret_cast<uint8_t*>(vbuf + 2 * TS) + warp * 128;
  const int64_t bh = blockIdx.x, b = bh / heads;
  const int h = static_cast<int>(bh % heads);
  const int64_t q0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * kTile;  // long rows first
  const int64_t qw = q0 + warp * 16;  // the warp's first query
  const int64_t ld = 3LL * heads * D;
  const T* qg = qkv + b * t * ld + static_cast<int64_t>(h) * D;
  const T* kg = qg + static_cast<int64_t>(heads) * D;
  const T* vg = kg + static_cast<int64_t>(heads) * D;
  const int nkt = static_cast<int>(q0 / kTile) + 1;  // key tiles up to the diagonal
  const float sl2 = scale * kLog2e;

  load_tile<D>(qs, qg, ld, q0, t);
  load_tile<D>(kbuf, kg, ld, 0, t);
  load_tile<D>(vbuf, vg, ld, 0, t);
  cp_commit();
  u32 qa[D / 16][4];
  float o[D / 8][4] = {};
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};  // log2 units; lane partials
  for (int kt = 0; kt < nkt; ++kt) {
    cp_wait_all();
    __syncthreads();  // tile kt landed; every warp is done with tile kt−1's buffers
    if (kt + 1 < nkt) {
      const int nb = (kt + 1) & 1;
      load_tile<D>(kbuf + nb * TS, kg, ld, static_cast<int64_t>(kt + 1) * kTile, t);
      load_tile<D>(vbuf + nb * TS, vg, ld, static_cast<int64_t>(kt + 1) * kTile, t);
    }
    cp_commit();
    if (kt == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) load_a<LD>(qa[kk], qs + warp * 16 * LD, kk, lane);
    }
    const T* ks = kbuf + (kt & 1) * TS;
    const T* vs = vbuf + (kt & 1) * TS;
    const int64_t k0 = static_cast<int64_t>(kt) * kTile;
    float s[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) mma_abt_k<LD>(s, qa[kk], ks, kk, lane);
    const bool diag = kt == nkt - 1;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t i = qw + gr + 8 * (e >> 1), j = k0 + 8 * n + 2 * c + (e & 1);
        const float v = diag && j > i ? -INFINITY : s[n][e] * sl2;
        s[n][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mnew = fmaxf(mrow[r], mx[r]);  // finite: key k0 ≤ every query of the block
      alpha[r] = ex2(mrow[r] - mnew);
      mrow[r] = mnew;
      lrow[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] *= alpha[e >> 1];
    if (mask.active)
      draw_bytes<4>(mb, mask, bh, t, lane, [&](int idx) {
        return QueryKeys{qw + (idx >> 3), k0 + 8 * (idx & 7)};
      });
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = ex2(s[n][e] - mrow[e >> 1]);
        lrow[e >> 1] += p;
        float f = 1.0f;
        if (mask.active) {
          const int bits = mb[(gr + 8 * (e >> 1)) * 8 + n];
          f = (bits >> (2 * c + (e & 1))) & 1 ? mask.scale : 0.0f;
        }
        s[n][e] = p * f;
      }
    u32 pf[4][4];
    to_a<T>(s, pf);
    mma_pb<D>(o, pf, vs, lane);
  }
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
    inv[r] = 1.0f / lrow[r];
    const int64_t i = qw + gr + 8 * r;
    if (c == 0 && i < t) lse[bh * t + i] = (mrow[r] + __log2f(lrow[r])) / kLog2e;
  }
  store_acc<D>(o, inv[0], inv[1], y + b * t * heads * D + static_cast<int64_t>(h) * D,
               static_cast<int64_t>(heads) * D, qw, t, lane);
}

// ---------------------------------------------------------------------------------------
// Backward.

template <int D>
constexpr size_t dq_smem() {  // Q, dY, two K and two V tiles, D of the rows, mask bytes
  return 6 * static_cast<size_t>(kTile) * (D + 8) * 2 + kTile * 4 + kWarps * 128;
}
template <int D>
constexpr size_t dkv_smem() {  // K, V, two Q and two dY tiles, [2] lse and D, mask bytes
  return 6 * static_cast<size_t>(kTile) * (D + 8) * 2 + 2 * 2 * kTile * 4 + kWarps * 128;
}

// dq kernel; also writes dsum[bh·T + i] = D_i = dy_i·y_i for dkv.
template <class T, int D, bool ROPE>
__global__ void __launch_bounds__(kWarps * 32)
    attn_bwd_dq_kernel(const T* qkv, const T* y, const T* dy, const float* lse, float* dsum,
                       T* dqkv, int64_t t, int heads, float scale, DeviceMask mask,
                       const float2* rope) {
  constexpr int LD = D + 8, TS = kTile * LD;
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* dos = qs + TS;
  T* kbuf = dos + TS;        // [2] K tiles
  T* vbuf = kbuf + 2 * TS;   // [2] V tiles
  float* dsum_s = reinterpret_cast<float*>(vbuf + 2 * TS);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane >> 2, c = lane & 3;
  uint8_t* mb = reinterpret_cast<uint8_t*>(dsum_s + kTile) + warp * 128;
  const int64_t bh = blockIdx.x, b = bh / heads;
  const int h = static_cast<int>(bh % heads);
  const int64_t q0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * kTile;  // long rows first
  const int64_t qw = q0 + warp * 16;
  const int64_t ld = 3LL * heads * D, ldy = static_cast<int64_t>(heads) * D;
  const T* qg = qkv + b * t * ld + static_cast<int64_t>(h) * D;
  const T* kg = qg + ldy;
  const T* vg = kg + ldy;
  const T* dyg = dy + b * t * ldy + static_cast<int64_t>(h) * D;
  const T* yg = y + b * t * ldy + static_cast<int64_t>(h) * D;
  const int nkt = static_cast<int>(q0 / kTile) + 1;
  const float sl2 = scale * kLog2e;

  load_tile<D>(qs, qg, ld, q0, t);
  load_tile<D>(dos, dyg, ldy, q0, t);
  load_tile<D>(kbuf, kg, ld, 0, t);
  load_tile<D>(vbuf, vg, ld, 0, t);
  cp_commit();
  {  // D_i, two lanes per row (half the columns each), while the tiles are in flight
    const int r = threadIdx.x >> 1, part = threadIdx.x & 1;
    const int64_t i = q0 + r;
    float acc = 0.0f;
    if (i < t) {
#pragma unroll
      for (int c0 = part * (D / 2); c0 < (part + 1) * (D / 2); c0 += 8) {
        float a[8], g8[8];
        load_vec<8>(yg + i * ldy + c0, a);
        load_vec<8>(dyg + i * ldy + c0, g8);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc += a[j] * g8[j];
      }
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    if (part == 0) {
      dsum_s[r] = acc;
      if (i < t) dsum[bh * t + i] = acc;
    }
  }
  float l2[2], dr[2] = {};  // the lane's two rows: lse in log2 units, and D (after the sync)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = qw + gr + 8 * r;
    l2[r] = i < t ? lse[bh * t + i] * kLog2e : 0.0f;
  }
  float dq[D / 8][4] = {};
  for (int kt = 0; kt < nkt; ++kt) {
    cp_wait_all();
    __syncthreads();
    if (kt == 0) {
      dr[0] = dsum_s[warp * 16 + gr];
      dr[1] = dsum_s[warp * 16 + gr + 8];
    }
    if (kt + 1 < nkt) {
      const int nb = (kt + 1) & 1;
      load_tile<D>(kbuf + nb * TS, kg, ld, static_cast<int64_t>(kt + 1) * kTile, t);
      load_tile<D>(vbuf + nb * TS, vg, ld, static_cast<int64_t>(kt + 1) * kTile, t);
    }
    cp_commit();
    const T* ks = kbuf + (kt & 1) * TS;
    const T* vs = vbuf + (kt & 1) * TS;
    const int64_t k0 = static_cast<int64_t>(kt) * kTile;
    float s[8][4], dp[8][4];
    mma_abt<D>(s, qs + warp * 16 * LD, ks, lane);
    mma_abt<D>(dp, dos + warp * 16 * LD, vs, lane);
    if (mask.active)
      draw_bytes<4>(mb, mask, bh, t, lane, [&](int idx) {
        return QueryKeys{qw + (idx >> 3), k0 + 8 * (idx & 7)};
      });
    const bool diag = kt == nkt - 1;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int64_t i = qw + gr + 8 * r, j = k0 + 8 * n + 2 * c + (e & 1);
        const float p = diag && j > i ? 0.0f : ex2(s[n][e] * sl2 - l2[r]);
        float f = 1.0f;
        if (mask.active) {
          const int bits = mb[(gr + 8 * r) * 8 + n];
          f = (bits >> (2 * c + (e & 1))) & 1 ? mask.scale : 0.0f;
        }
        s[n][e] = p * (dp[n][e] * f - dr[r]);
      }
    u32 pf[4][4];
    to_a<T>(s, pf);
    mma_pb<D>(dq, pf, ks, lane);
  }
  store_acc<D>(dq, scale, scale, dqkv + b * t * ld + static_cast<int64_t>(h) * D, ld, qw, t, lane,
               ROPE ? rope : nullptr);
}

template <class T, int D, bool ROPE>
__global__ void __launch_bounds__(kWarps * 32)
    attn_bwd_dkv_kernel(const T* qkv, const T* dy, const float* lse, const float* dsum, T* dqkv,
                        int64_t t, int heads, float scale, DeviceMask mask, const float2* rope) {
  constexpr int LD = D + 8, TS = kTile * LD;
  extern __shared__ __align__(128) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + TS;
  T* qbuf = vs + TS;           // [2] Q tiles
  T* dobuf = qbuf + 2 * TS;    // [2] dY tiles
  float* stats = reinterpret_cast<float*>(dobuf + 2 * TS);  // [2][lse·log2e | D]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane >> 2, c = lane & 3;
  uint8_t* mb = reinterpret_cast<uint8_t*>(stats + 4 * kTile) + warp * 128;
  const int64_t bh = blockIdx.x, b = bh / heads;
  const int h = static_cast<int>(bh % heads);
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t kw = k0 + warp * 16;  // the warp's first key
  const int64_t ld = 3LL * heads * D, ldy = static_cast<int64_t>(heads) * D;
  const T* qg = qkv + b * t * ld + static_cast<int64_t>(h) * D;
  const T* kg = qg + ldy;
  const T* vg = kg + ldy;
  const T* dyg = dy + b * t * ldy + static_cast<int64_t>(h) * D;
  const float sl2 = scale * kLog2e;
  // Query tile `it` (from the diagonal tile, q0 = k0) into buffer it % 2; the row stats
  // with plain stores (read after the next __syncthreads, like the copies).
  auto fetch = [&](int it) {
    const int64_t q0 = k0 + static_cast<int64_t>(it) * kTile;
    if (q0 < t) {
      const int nb = it & 1;
      load_tile<D>(qbuf + nb * TS, qg, ld, q0, t);
      load_tile<D>(dobuf + nb * TS, dyg, ldy, q0, t);
      for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
        const bool ok = q0 + r < t;
        stats[nb * 2 * kTile + r] = ok ? lse[bh * t + q0 + r] * kLog2e : 0.0f;
        stats[nb * 2 * kTile + kTile + r] = ok ? dsum[bh * t + q0 + r] : 0.0f;
      }
    }
    cp_commit();
  };

  load_tile<D>(ks, kg, ld, k0, t);
  load_tile<D>(vs, vg, ld, k0, t);
  fetch(0);
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  for (int it = 0; k0 + static_cast<int64_t>(it) * kTile < t; ++it) {
    const int64_t q0 = k0 + static_cast<int64_t>(it) * kTile;
    cp_wait_all();
    __syncthreads();
    fetch(it + 1);
    const T* qs = qbuf + (it & 1) * TS;
    const T* dos = dobuf + (it & 1) * TS;
    const float* l2 = stats + (it & 1) * 2 * kTile;
    const float* dsm = l2 + kTile;
    float st[8][4], dpt[8][4];  // rows: the warp's 16 keys; columns: the tile's 64 queries
    mma_abt<D>(st, ks + warp * 16 * LD, qs, lane);
    mma_abt<D>(dpt, vs + warp * 16 * LD, dos, lane);
    if (mask.active)  // byte idx: query q0 + idx % 64, keys kw + 8·(idx / 64) …
      draw_bytes<4>(mb, mask, bh, t, lane, [&](int idx) {
        return QueryKeys{q0 + (idx & 63), kw + 8 * (idx >> 6)};
      });
    const bool diag = it == 0;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * n + 2 * c + (e & 1);
        const int64_t i = q0 + col, j = kw + gr + 8 * (e >> 1);
        const bool ok = i < t && !(diag && j > i);
        const float p = ok ? ex2(st[n][e] * sl2 - l2[col]) : 0.0f;
        float f = 1.0f;
        if (mask.active) f = (mb[(e >> 1) * 64 + col] >> gr) & 1 ? mask.scale : 0.0f;
        st[n][e] = p * f;
        dpt[n][e] = p * (dpt[n][e] * f - dsm[col]);
      }
    u32 pf[4][4];
    to_a<T>(st, pf);
    mma_pb<D>(dv, pf, dos, lane);
    to_a<T>(dpt, pf);
    mma_pb<D>(dk, pf, qs, lane);
  }
  cp_wait_all();
  T* dkg = dqkv + b * t * ld + static_cast<int64_t>(heads + h) * D;
  store_acc<D>(dk, scale, scale, dkg, ld, kw, t, lane, ROPE ? rope : nullptr);
  store_acc<D>(dv, 1.0f, 1.0f, dkg + ldy, ld, kw, t, lane);
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

// The current device's shared memory per block (with opt-in); read once per device (the
// layer asks at every forward).
size_t smem_per_block() {
  static std::map<int, size_t> known;
  int dev = 0;
  FFN_CHECK_CUDA(cudaGetDevice(&dev));
  const auto it = known.find(dev);
  if (it != known.end()) return it->second;
  int block = 0;
  FFN_CHECK_CUDA(cudaDeviceGetAttribute(&block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return known[dev] = static_cast<size_t>(block);
}

size_t max_smem(int64_t d) {
  size_t out = 0;
  with_head_dim(d, [&]<int D>() { out = std::max({fwd_smem<D>(), dq_smem<D>(), dkv_smem<D>()}); });
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
         (head_dim == 32 || head_dim == 64 || head_dim == 128) && t > 0 &&
         t <= int64_t{65535} * kTile && max_smem(head_dim) <= smem_per_block();
}

}  // namespace

bool fused_attention_supported(DType dt, int64_t t, int64_t head_dim) {
  return fused_attention_supported_impl(dt, t, head_dim);
}

bool fused_attention_preferred(DType dt, int64_t t, int64_t head_dim) {
  return fused_attention_supported_impl(dt, t, head_dim);
}

namespace {
// The Hopper kernels where asked for or, automatically, where they apply.
// automatic can be overridden for A/B runs of whole programs with FFN_ATTENTION_KERNEL =
// mma_sync | sm90 (read once).
AttentionKernel from_environment() {
  static const AttentionKernel k = [] {
    const char* v = std::getenv("FFN_ATTENTION_KERNEL");
    if (!v || !*v || std::string(v) == "auto") return AttentionKernel::automatic;
    if (std::string(v) == "mma_sync") return AttentionKernel::mma_sync;
    FFN_CHECK(std::string(v) == "sm90", "[fused_attention] FFN_ATTENTION_KERNEL must be auto, ",
              "mma_sync or sm90, got '", v, "'");
    return AttentionKernel::sm90;
  }();
  return k;
}

// automatic: the Hopper kernels from T = 256 on. Measured on the H100 (ffn-bench --attention,
// head 64): at T = 1024 they take 0.098 / 0.354 ms forward / backward against mma.sync's 0.171
// / 0.514 (bench/RESULTS-2026-11-23.md, session 10); at T = 256 (shakespeare_char's shape)
// 0.033 / 0.113 against 0.042 / 0.116 without dropout (session 10), and, since session 22's
// one-pass backward, 0.057 / 0.124 against 0.051 / 0.135 with p = 0.2 and 0.059 / 0.126
// against 0.054 / 0.137 with p = 0.3 (session 23; before it, T = 256 with dropout stayed on
// mma.sync). Shorter sequences are unmeasured and stay on mma.sync.
constexpr int64_t kSm90MinT = 256;

bool use_sm90(const Tensor& qkv, int64_t heads, AttentionKernel kernel, const char* op) {
  if (kernel == AttentionKernel::automatic) {
    kernel = from_environment();
    if (kernel == AttentionKernel::automatic && qkv.size(1) < kSm90MinT) return false;
  }
  if (kernel == AttentionKernel::mma_sync) return false;
  const bool ok = sm90_attention_supported(qkv, heads);
  FFN_CHECK(ok || kernel == AttentionKernel::automatic, "[", op,
            "] the Hopper kernels were asked for but cannot run ", qkv.desc(), " with ", heads,
            " heads (they need an sm_90a build on a Hopper GPU and head_dim 64)");
  return ok;
}
}  // namespace

void fused_attention(const Tensor& qkv, int64_t heads, double scale, const DropoutSpec& d,
                     Tensor& y, Tensor& lse, AttentionKernel kernel) {
  if (use_sm90(qkv, heads, kernel, "fused_attention"))
    return sm90_attention_forward(qkv, heads, static_cast<float>(scale), d, y, lse);
  const int dev = qkv.device().index;
  DeviceGuard guard(dev);
  check_aligned({&qkv, &y}, "fused_attention");
  const int64_t b = qkv.size(0), t = qkv.size(1), hd = qkv.size(2) / (3 * heads);
  if (b == 0 || t == 0) return;
  const DeviceMask mask = DeviceMask::from(d);
  with_half(qkv.dtype(), [&]<class H>() {
    using T = device_t<H>;
    with_head_dim(hd, [&]<int D>() {
      const dim3 grid(static_cast<unsigned>(b * heads), static_cast<unsigned>((t + kTile - 1) / kTile));
      allow_dynamic_smem(reinterpret_cast<const void*>(attn_fwd_kernel<T, D>), fwd_smem<D>());
      attn_fwd_kernel<T, D><<<grid, kWarps * 32, fwd_smem<D>(), stream(dev)>>>(
          dptr<T>(qkv), dptr<T>(y), lse.data<float>(), t, static_cast<int>(heads),
          static_cast<float>(scale), mask);
      FFN_CHECK_LAUNCH();
    });
  });
}

void fused_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& dy,
                              const Tensor& lse, int64_t heads, double scale, const DropoutSpec& d,
                              Tensor& dqkv, double rope_base, AttentionKernel kernel,
                              Tensor* dqkv_sum, const Tensor& row_scale) {
  if (use_sm90(qkv, heads, kernel, "fused_attention_backward"))
    return sm90_attention_backward(qkv, y, dy, lse, heads, static_cast<float>(scale), d, dqkv,
                                   rope_base, dqkv_sum, row_scale);
  const int dev = qkv.device().index;
  DeviceGuard guard(dev);
  check_aligned({&qkv, &y, &dy, &dqkv}, "fused_attention_backward");
  const int64_t b = qkv.size(0), t = qkv.size(1), hd = qkv.size(2) / (3 * heads);
  if (b == 0 || t == 0) {  // nothing to compute; an empty column sum is zeros
    if (dqkv_sum) ffn::bias_grad(dqkv.view_2d(), *dqkv_sum);
    return;
  }
  const DeviceMask mask = DeviceMask::from(d);
  Tensor dsum = Tensor::empty({b * heads, t}, DType::f32, qkv.device());
  const float2* rope =
      rope_base > 0 ? static_cast<const float2*>(rope_table(dev, t, hd, rope_base).data_ptr())
                    : nullptr;
  with_half(qkv.dtype(), [&]<class H>() {
    using T = device_t<H>;
    // The rotation is a template argument: the kernels without it carry none of its code.
    auto launch = [&]<int D, bool ROPE>() {
      const dim3 grid(static_cast<unsigned>(b * heads), static_cast<unsigned>((t + kTile - 1) / kTile));
      allow_dynamic_smem(reinterpret_cast<const void*>(attn_bwd_dq_kernel<T, D, ROPE>),
                         dq_smem<D>());
      attn_bwd_dq_kernel<T, D, ROPE><<<grid, kWarps * 32, dq_smem<D>(), stream(dev)>>>(
          dptr<T>(qkv), dptr<T>(y), dptr<T>(dy), lse.data<float>(), dsum.data<float>(),
          dptr<T>(dqkv), t, static_cast<int>(heads), static_cast<float>(scale), mask, rope);
      FFN_CHECK_LAUNCH();
      allow_dynamic_smem(reinterpret_cast<const void*>(attn_bwd_dkv_kernel<T, D, ROPE>),
                         dkv_smem<D>());
      attn_bwd_dkv_kernel<T, D, ROPE><<<grid, kWarps * 32, dkv_smem<D>(), stream(dev)>>>(
          dptr<T>(qkv), dptr<T>(dy), lse.data<float>(), dsum.data<float>(), dptr<T>(dqkv), t,
          static_cast<int>(heads), static_cast<float>(scale), mask, rope);
      FFN_CHECK_LAUNCH();
    };
    with_head_dim(hd, [&]<int D>() {
      if (rope)
        launch.template operator()<D, true>();
      else
        launch.template operator()<D, false>();
    });
  });
  if (dqkv_sum) {
    const Tensor d2 = dqkv.view_2d();
    ffn::bias_grad(d2, *dqkv_sum);
  }
  if (row_scale.defined()) {  // the mma.sync kernels store unscaled: a pass of its own
    Tensor d2 = dqkv.view_2d();
    cuda::scale_rows(d2, row_scale, d2);
  }
}

}  // namespace ffn::cuda
