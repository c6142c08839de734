// kernels/cuda/attention_sm90.cu — the fused causal attention (kernels/attention.h) on Hopper:
// wgmma tensor-core MMAs fed by TMA, head size 64 (kernels/cuda/attention_sm90.h).
//
// Note [Hopper attention]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Three kernels with the same math and the same split as the mma.sync ones (attention.cu):
// forward; backward dq (also writes D_i = dy_i·y_i); backward dk/dv (launched after dq). Each
// is a persistent grid of one CTA per SM walking units (a head's 128-row block), the longest
// first (Units). A CTA is 384 threads: warpgroup 0 is the producer (one thread issues TMA
// loads; setmaxnreg gives its registers away), warpgroups 1 and 2 are consumers owning 64
// rows each of the unit's block. The block's own tiles ("resident": Q in forward, Q and dY
// in dq, K and V in dk/dv) are loaded once per unit into one of two slots, so the next
// unit's load overlaps this one's end; the other side's tiles ("streamed") pass through a
// ring of shared-memory stages that carries over between units, with full/empty mbarriers
// (Note [Hopper GEMM pipeline]'s protocol: full completes on the TMA bytes, empty on one
// arrival per consumer warp; the resident slots have the same pair).
//
// Per streamed tile, each consumer warpgroup issues the score products with A and B from
// shared memory (S = Q·Kᵀ, and dP = dY·Vᵀ in backward; Sᵀ = K·Qᵀ, dPᵀ = V·dYᵀ in dk/dv),
// works on them in registers (wgmma's accumulator layout is mma.sync's C fragment layout, 16
// rows per warp, so the softmax, masking and dropout code reads like attention.cu's), packs
// the probabilities or dS to 16 bits, which is the A-operand register layout, and issues the
// second products with A from registers and B the streamed tile read N-major: O += P·V;
// dQ += dS·K; dV += Pdᵀ·dY, dK += dSᵀ·Q. The second products of tile k − 1 are issued right
// after the score products of tile k, so they run on the tensor cores while the CUDA cores
// work on tile k's scores (FlashAttention-3's intra-warpgroup overlap; fwd_consume says
// which register writes must wait for which wgmmas).
//
// Tiles are 64 columns (the head) by 64 or 128 rows, 128-byte rows swizzled by TMA as the
// wgmma descriptors expect (sm90.cuh). Loads go through 3-D tensor maps over [B, T, columns],
// so rows past T (the last block of a sequence) load as zeros and never read the next
// sequence; those rows are masked (keys) or not stored (queries). Sizes: forward streams
// 128-key tiles (S is 64×128 per warpgroup); the backward kernels stream 64-row tiles, which
// keeps S, dP, the packed operands and both accumulators of dk/dv within the consumers' 240
// registers without spilling.
//
// Same results as attention.cu up to fp32 summation order (the reference tests hold both to
// the same bound); deterministic (no atomics, fixed order); mask bits from
// Note [Attention mask draws], so both kernels drop the same entries.
#include "kernels/cuda/attention_sm90.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <utility>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/gemm/sm90.cuh"
#include "kernels/cuda/gemm/tensor_map.h"
#include "kernels/cuda/gemm/wgmma.cuh"
#include "kernels/cuda/rowwise.cuh"

namespace ffn::cuda {

namespace attn90 {

// The persistent grid's units: (bh, block) pairs, the longest blocks first (for the forward
// and dq the last query blocks, for dk/dv the first key blocks), CTA x taking units x,
// x + gridDim.x, …
struct Units {  // (outside the anonymous namespace: the compute_80 pass never calls it)
  int64_t bh_count;
  int blocks;
  __device__ int64_t count() const { return bh_count * blocks; }
  __device__ int64_t bh(int64_t u) const { return u % bh_count; }
  __device__ int rank(int64_t u) const { return static_cast<int>(u / bh_count); }
};

namespace {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FFN_ATTN_SM90_CODE 1
#else
#define FFN_ATTN_SM90_CODE 0
#endif

using attn::ex2;
using attn::kLog2e;
using attn::pack2;
using attn::QueryKeys;
using attn::u32;
using namespace gemm;  // mbarriers, TMA, wgmma descriptors and instructions

constexpr int kD = 64;          // head size
constexpr int kRowBytes = 128;  // one 64-element row of a tile
constexpr int kThreads = 384;   // producer warpgroup + two consumer warpgroups
[[maybe_unused]] constexpr uint32_t kBox64 = 64 * kRowBytes;  // one 64-row tile's bytes

// Shared memory of one CTA: two slots of two resident 128-row tiles, STAGES stages of two
// streamed SROWS-row tiles (all 1024-byte aligned for the 128-byte swizzle), the warps' mask
// bytes, the consumers' row statistics, the barriers.
template <int SROWS, int STAGES>
struct Pipe {
  static constexpr int kResBytes = 128 * kRowBytes;
  static constexpr int kTileBytes = SROWS * kRowBytes;
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kMaskBytes = 8 * 256;       // 8 consumer warps × 256 bytes
  static constexpr int kStatFloats = 2 * 2 * 128;  // 2 warpgroups × 2 buffers × 128
  static constexpr int kSmem = 1024 + 4 * kResBytes + STAGES * kStageBytes + kMaskBytes +
                               kStatFloats * 4 + (2 * STAGES + 4) * 8;

  uint8_t* tiles;
  uint8_t* mask;
  float* stats;
  uint64_t* full;
  uint64_t* empty;
  uint64_t* res_full;   // [2] a slot of resident tiles has landed
  uint64_t* res_empty;  // [2] its unit is done with it (one arrival per consumer warp)

  __device__ static Pipe carve(uint8_t* raw) {
    Pipe p;
    p.tiles = raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);
    p.mask = p.tiles + 4 * kResBytes + STAGES * kStageBytes;
    p.stats = reinterpret_cast<float*>(p.mask + kMaskBytes);
    p.full = reinterpret_cast<uint64_t*>(p.stats + kStatFloats);
    p.empty = p.full + STAGES;
    p.res_full = p.empty + STAGES;
    p.res_empty = p.res_full + 2;
    return p;
  }
  // Resident tile i of slot `slot` (units alternate between two slots, so the producer
  // loads the next unit's while the consumers finish this one).
  __device__ uint8_t* resident(int slot, int i) const {
    return tiles + (2 * slot + i) * kResBytes;
  }
  __device__ uint8_t* tile(int s, int i) const {
    return tiles + 4 * kResBytes + s * kStageBytes + i * kTileBytes;
  }
  __device__ void init() const {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);
    }
    for (int slot = 0; slot < 2; ++slot) {
      mbar_init(&res_full[slot], 1);
      mbar_init(&res_empty[slot], 8);
    }
    fence_barrier_init();
  }
};

// One tile load: a tensor map and the column of the head's slice in it.
struct Load {
  const CUtensorMap* map;
  int col;
};

// The producer thread, one unit (the CTA's j-th): its resident tiles at row res_row into slot
// j % 2 (r1.map may be null), then n streamed pairs at rows srow0, srow0 + SROWS, … of
// sequence b into the ring, whose position (stage, phase) carries over between units.
struct RingPos {
  int stage = 0;
  uint32_t phase = 0;
};
template <int SROWS, int STAGES>
__device__ void produce(const Pipe<SROWS, STAGES>& p, RingPos& at, int j, Load r0, Load r1,
                        int res_row, Load s0, Load s1, int srow0, int n, int b) {
  using P = Pipe<SROWS, STAGES>;
  const int slot = j & 1;
  mbar_wait(&p.res_empty[slot], ((j >> 1) & 1) ^ 1);
  mbar_arrive_expect_tx(&p.res_full[slot], (r1.map ? 2 : 1) * P::kResBytes);
  tma_load_3d(p.resident(slot, 0), r0.map, &p.res_full[slot], r0.col, res_row, b);
  if (r1.map) tma_load_3d(p.resident(slot, 1), r1.map, &p.res_full[slot], r1.col, res_row, b);
  for (int i = 0; i < n; ++i) {
    mbar_wait(&p.empty[at.stage], at.phase ^ 1);
    mbar_arrive_expect_tx(&p.full[at.stage], P::kStageBytes);
    const int row = srow0 + i * SROWS;
    tma_load_3d(p.tile(at.stage, 0), s0.map, &p.full[at.stage], s0.col, row, b);
    tma_load_3d(p.tile(at.stage, 1), s1.map, &p.full[at.stage], s1.col, row, b);
    if (++at.stage == STAGES) at.stage = 0, at.phase ^= 1;
  }
}

// The roles of a persistent kernel over its CTA's units (x, x + gridDim.x, …): thread 0 of
// warpgroup 0 calls produce_unit(j, u) for the j-th; the consumer warpgroups call
// consume_unit(j, u, base), which returns the unit's streamed tiles, base counting those
// before it (the ring position). Each role is one branch, as setmaxnreg needs (HOPPER.md).
template <class Produce, class Consume>
__device__ __forceinline__ void run_units(const Units& units, const Produce& produce_unit,
                                          const Consume& consume_unit) {
  if (threadIdx.x < 128) {
    regs_dealloc<24>();
    if (threadIdx.x == 0) {
      int j = 0;
      for (int64_t u = blockIdx.x; u < units.count(); u += gridDim.x, ++j) produce_unit(j, u);
    }
  } else {
    regs_alloc<240>();
    int j = 0, base = 0;
    for (int64_t u = blockIdx.x; u < units.count(); u += gridDim.x, ++j)
      base += consume_unit(j, u, base);
  }
}

// Keeps the compiler from reusing A-operand registers before the wgmmas reading them are done.
template <int K>
__device__ __forceinline__ void fence_operands(u32 (&a)[K][4]) {
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[k][j])::"memory");
}

// An accumulator tile (N columns, wgmma layout: element 4n+e is row g + 8(e/2), column
// 8n + 2(l%4) + e%2) as A fragments of N/16 k-steps.
template <class T, int N>
__device__ __forceinline__ void to_a(const float (&s)[N / 2], u32 (&a)[N / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    a[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
    a[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
    a[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
    a[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// Writes a warp's 16 rows × 64 columns (acc × mul) to rows r0 + g (+8) of a row-major
// 16-bit matrix at g (row stride ld); rows ≥ t are skipped.
template <class T>
__device__ __forceinline__ void store_rows(const float (&acc)[32], float mul0, float mul1, T* g,
                                           int64_t ld, int64_t r0, int64_t t, int lane) {
  const int gr = lane >> 2, c = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = r0 + gr + 8 * half;
    if (row >= t) continue;
    const float mul = half ? mul1 : mul0;
    u32* out = reinterpret_cast<u32*>(g + row * ld + 2 * c);
#pragma unroll
    for (int n = 0; n < 8; ++n)
      out[4 * n] = pack2<T>(acc[4 * n + 2 * half] * mul, acc[4 * n + 2 * half + 1] * mul);
  }
}

// S (64×N) = A·Bᵀ over the head, A and B K-major tiles at descriptors da, db.
template <int N, class T>
__device__ __forceinline__ void mma_scores(float (&s)[N / 2], uint64_t da, uint64_t db) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
    Wgmma<N, T>::template mma<0, 0>(s, da + 2 * kk, db + 2 * kk, kk);
}
// acc (64×64) += A·B, A as K/16 register fragments, B a K-row tile read N-major at db.
template <int K, class T>
__device__ __forceinline__ void mma_rows(float (&acc)[32], const u32 (&a)[K / 16][4], uint64_t db) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    WgmmaRegA<64, T>::template mma<1>(acc, a[kk], db + (kk * 16 * kRowBytes >> 4), 1);
}

struct Geometry {
  int64_t t;
  int heads;
  float scale;
};

// ---------------------------------------------------------------------------------------
// Forward: 128 queries per CTA, 128-key tiles.

constexpr int kFwdRows = 128, kFwdStages = 4;
using FwdPipe = Pipe<kFwdRows, kFwdStages>;

// Stage and phase of streamed tile k in the ring.
template <int STAGES>
struct Slot {
  int stage;
  uint32_t phase;
  __device__ explicit Slot(int k)
      : stage(k % STAGES), phase(static_cast<uint32_t>(k / STAGES) & 1) {}
};

// Per key tile kt ≥ 1 (FlashAttention-3's intra-warpgroup overlap): issue S = Q·Kᵀ of tile
// kt, then O += P·V of tile kt − 1 (P packed at the end of the previous tile); wait for S
// only and run the softmax of tile kt on the CUDA cores while the tensor cores finish P·V;
// then wait for P·V, release tile kt − 1's stage, rescale O and pack P of tile kt. Every
// non-wgmma write of O and of P's registers happens with no wgmma in flight, which is what
// lets ptxas keep the wgmmas asynchronous (it serializes them otherwise, warning C7515).
template <class T, bool DROP>
__device__ void fwd_consume(const FwdPipe& p, const Geometry& g, int c, int j, int base,
                            int64_t bh, T* y, float* lse, int64_t q0, int nkt,
                            const DeviceMask& mask) {
  const int tid = threadIdx.x - 128 * (c + 1), warp = tid / 32, lane = tid % 32;
  const int gr = lane >> 2, cq = lane & 3;
  const int64_t t = g.t, qw = q0 + 64 * c + 16 * warp;
  uint8_t* mb = p.mask + (4 * c + warp) * 256;
  const float sl2 = g.scale * kLog2e;
  float o[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = 0.0f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
  float s[64];
  u32 pa[8][4];
  mbar_wait(&p.res_full[j & 1], (j >> 1) & 1);
  const uint64_t dq = smem_desc_k128(p.resident(j & 1, 0) + c * 64 * kRowBytes);
  auto issue_scores = [&](int kt) {
    const Slot<kFwdStages> at(base + kt);
    mbar_wait(&p.full[at.stage], at.phase);
    wgmma_fence();  // orders the registers written since the last wgmmas (s, O, P) before them
    mma_scores<128, T>(s, dq, smem_desc_k128(p.tile(at.stage, 0)));
    wgmma_commit();
  };
  auto issue_pv = [&](int kt) {
    mma_rows<128, T>(o, pa, smem_desc_mn128(p.tile(Slot<kFwdStages>(base + kt).stage, 1), kBox64));
    wgmma_commit();
  };
  // The softmax of tile kt's scores in s: the running max and sum (log2 units), P (dropped)
  // in s, and the factor alpha by which O must be rescaled. Trimmed to the few instructions
  // per score that bound this kernel (Note [Hopper attention]): the causal test only on the
  // diagonal tile, in 32-bit offsets; the max on the raw scores (scale > 0); one FFMA before
  // each exp2; the dropout code only in the DROP kernels.
  auto softmax = [&](int kt, float(&alpha)[2]) {
    const int64_t k0 = 128LL * kt;
    float mx[2] = {-INFINITY, -INFINITY};
    auto scan = [&]<bool DIAG>() {
      // Key j = k0 + 8n + 2cq + (e&1) is after query i = qw + gr + 8(e/2) when rel + 8n +
      // (e&1) − 8(e/2) > 0 (|rel| < 256 on the diagonal tile).
      const int rel = DIAG ? static_cast<int>(k0 - qw) - gr + 2 * cq : 0;
#pragma unroll
      for (int n = 0; n < 16; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (DIAG)
            if (rel + 8 * n + (e & 1) - 8 * (e >> 1) > 0) s[4 * n + e] = -INFINITY;
          mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * n + e]);
        }
    };
    if (kt == nkt - 1)
      scan.template operator()<true>();
    else
      scan.template operator()<false>();
    float nm[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mnew = fmaxf(mrow[r], mx[r] * sl2);  // finite: key k0 ≤ every query
      alpha[r] = ex2(mrow[r] - mnew);
      mrow[r] = mnew;
      nm[r] = -mnew;
      lrow[r] *= alpha[r];
    }
    if constexpr (DROP)
      attn::draw_bytes<8>(mb, mask, bh, t, lane, [&](int idx) {
        return QueryKeys{qw + (idx >> 4), k0 + 8 * (idx & 15)};
      });
#pragma unroll
    for (int n = 0; n < 16; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float pr = ex2(fmaf(s[4 * n + e], sl2, nm[e >> 1]));
        lrow[e >> 1] += pr;
        if constexpr (DROP) {
          const int bits = mb[(gr + 8 * (e >> 1)) * 16 + n];
          pr = (bits >> (2 * cq + (e & 1))) & 1 ? pr * mask.scale : 0.0f;
        }
        s[4 * n + e] = pr;
      }
  };
  float alpha[2];
  issue_scores(0);
  wgmma_wait<0>();
  fence_accumulators(s);
  softmax(0, alpha);  // O is still zero: no rescale
  to_a<T, 128>(s, pa);
  for (int kt = 1; kt < nkt; ++kt) {
    issue_scores(kt);
    issue_pv(kt - 1);
    wgmma_wait<1>();  // S of tile kt
    fence_accumulators(s);
    softmax(kt, alpha);
    wgmma_wait<0>();  // P·V of tile kt − 1
    fence_accumulators(o);
    fence_operands(pa);
    if (lane == 0) mbar_arrive(&p.empty[Slot<kFwdStages>(base + kt - 1).stage]);
#pragma unroll
    for (int i = 0; i < 32; ++i) o[i] *= alpha[(i >> 1) & 1];
    to_a<T, 128>(s, pa);
  }
  wgmma_fence();
  issue_pv(nkt - 1);
  wgmma_wait<0>();
  fence_accumulators(o);
  fence_operands(pa);
  if (lane == 0) {
    mbar_arrive(&p.empty[Slot<kFwdStages>(base + nkt - 1).stage]);
    mbar_arrive(&p.res_empty[j & 1]);
  }
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
    inv[r] = 1.0f / lrow[r];
    const int64_t i = qw + gr + 8 * r;
    if (cq == 0 && i < t) lse[bh * t + i] = (mrow[r] + __log2f(lrow[r])) / kLog2e;
  }
  const int64_t b = bh / g.heads, h = bh % g.heads, ldy = static_cast<int64_t>(g.heads) * kD;
  store_rows<T>(o, inv[0], inv[1], y + b * t * ldy + h * kD, ldy, qw, t, lane);
}

template <class T, bool DROP>
__global__ void __launch_bounds__(kThreads, 1)
    fwd_kernel(const __grid_constant__ CUtensorMap qkv128, T* y, float* lse, Geometry g,
               Units units, DeviceMask mask) {
#if FFN_ATTN_SM90_CODE
  extern __shared__ uint8_t smem_raw[];
  const FwdPipe p = FwdPipe::carve(smem_raw);
  if (threadIdx.x == 0) {
    prefetch_tensor_map(&qkv128);
    p.init();
  }
  __syncthreads();
  // Unit u: query block qt of head bh, the last blocks (most key tiles) first.
  auto unit = [&](int64_t u, int64_t& bh, int& qt) {
    bh = units.bh(u);
    qt = units.blocks - 1 - units.rank(u);
  };
  RingPos at;
  run_units(
      units,
      [&](int j, int64_t u) {
        int64_t bh;
        int qt;
        unit(u, bh, qt);
        const int b = static_cast<int>(bh / g.heads), h = static_cast<int>(bh % g.heads);
        produce(p, at, j, Load{&qkv128, h * kD}, Load{nullptr, 0}, 128 * qt,
                Load{&qkv128, (g.heads + h) * kD}, Load{&qkv128, (2 * g.heads + h) * kD}, 0,
                qt + 1, b);
      },
      [&](int j, int64_t u, int base) {
        int64_t bh;
        int qt;
        unit(u, bh, qt);
        fwd_consume<T, DROP>(p, g, threadIdx.x / 128 - 1, j, base, bh, y, lse, 128LL * qt, qt + 1,
                             mask);
        return qt + 1;
      });
#endif
}

// ---------------------------------------------------------------------------------------
// Backward dq: 128 queries per CTA, 64-key tiles; writes dsum = D for dk/dv.

constexpr int kBwdRows = 64, kBwdStages = 6;
using BwdPipe = Pipe<kBwdRows, kBwdStages>;

template <class T, bool DROP>
__device__ void dq_consume(const BwdPipe& p, const Geometry& g, int c, int j, int base,
                           int64_t bh, const T* y, const T* dy, const float* lse, float* dsum,
                           T* dqkv, int64_t q0, int nkt, const DeviceMask& mask) {
  const int tid = threadIdx.x - 128 * (c + 1), warp = tid / 32, lane = tid % 32;
  const int gr = lane >> 2, cq = lane & 3;
  const int64_t t = g.t, qw = q0 + 64 * c + 16 * warp;
  const int64_t b = bh / g.heads, h = bh % g.heads, ldy = static_cast<int64_t>(g.heads) * kD;
  uint8_t* mb = p.mask + (4 * c + warp) * 256;
  float* dsum_s = p.stats + c * 256 + (j & 1) * 128;  // by unit parity: the next unit's
                                                      // barrier orders reuse after reads
  const float sl2 = g.scale * kLog2e;
  {  // D_i = dy_i·y_i of the warpgroup's 64 rows, two threads per row (32 columns each)
    const int r = tid >> 1, part = tid & 1;
    const int64_t i = q0 + 64 * c + r;
    float acc = 0.0f;
    if (i < t) {
      const T* yr = y + (b * t + i) * ldy + h * kD + part * 32;
      const T* dyr = dy + (b * t + i) * ldy + h * kD + part * 32;
#pragma unroll
      for (int c0 = 0; c0 < 32; c0 += 8) {
        float a[8], d8[8];
        load_vec<8>(yr + c0, a);
        load_vec<8>(dyr + c0, d8);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc += a[j] * d8[j];
      }
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    if (part == 0) {
      dsum_s[r] = acc;
      if (i < t) dsum[bh * t + i] = acc;
    }
  }
  named_barrier_sync(1 + c, 128);
  float nl2[2], dr[2];  // −lse in log2 units, and D, of the lane's two rows
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = qw + gr + 8 * r;
    nl2[r] = i < t ? -lse[bh * t + i] * kLog2e : 0.0f;
    dr[r] = dsum_s[16 * warp + gr + 8 * r];
  }
  float dq[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) dq[i] = 0.0f;
  mbar_wait(&p.res_full[j & 1], (j >> 1) & 1);
  const uint64_t dqd = smem_desc_k128(p.resident(j & 1, 0) + c * 64 * kRowBytes);
  const uint64_t dyd = smem_desc_k128(p.resident(j & 1, 1) + c * 64 * kRowBytes);
  float s[32], dp[32];
  u32 da[4][4];
  // Tile kt's S and dP; dQ += dS·K of tile kt − 1 runs while tile kt's dS is computed (the
  // forward's overlap, fwd_consume).
  auto issue_scores = [&](int kt) {
    const Slot<kBwdStages> at(base + kt);
    mbar_wait(&p.full[at.stage], at.phase);
    wgmma_fence();
    mma_scores<64, T>(s, dqd, smem_desc_k128(p.tile(at.stage, 0)));
    mma_scores<64, T>(dp, dyd, smem_desc_k128(p.tile(at.stage, 1)));
    wgmma_commit();
  };
  auto issue_dq = [&](int kt) {
    mma_rows<64, T>(dq, da, smem_desc_mn128(p.tile(Slot<kBwdStages>(base + kt).stage, 0), kBox64));
    wgmma_commit();
  };
  auto ds = [&](int kt) {  // dS of tile kt into s (trimmed as the forward's softmax)
    const int64_t k0 = 64LL * kt;
    if constexpr (DROP)
      attn::draw_bytes<4>(mb, mask, bh, t, lane, [&](int idx) {
        return QueryKeys{qw + (idx >> 3), k0 + 8 * (idx & 7)};
      });
    auto run = [&]<bool NEAR>() {
      // Key j = k0 + 8n + 2cq + (e&1) is after query i = qw + gr + 8(e/2) when rel + 8n +
      // (e&1) − 8(e/2) > 0.
      const int rel = NEAR ? static_cast<int>(k0 - qw) - gr + 2 * cq : 0;
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          float pr = ex2(fmaf(s[4 * n + e], sl2, nl2[r]));
          if constexpr (NEAR)
            if (rel + 8 * n + (e & 1) - 8 * r > 0) pr = 0.0f;
          float dpv = dp[4 * n + e];
          if constexpr (DROP) {
            const int bits = mb[(gr + 8 * r) * 8 + n];
            dpv = (bits >> (2 * cq + (e & 1))) & 1 ? dpv * mask.scale : 0.0f;
          }
          s[4 * n + e] = pr * (dpv - dr[r]);
        }
    };
    if (k0 + 63 > q0 + 64 * c)  // some key of the tile is after a query
      run.template operator()<true>();
    else
      run.template operator()<false>();
  };
  issue_scores(0);
  wgmma_wait<0>();
  fence_accumulators(s);
  fence_accumulators(dp);
  ds(0);
  to_a<T, 64>(s, da);
  for (int kt = 1; kt < nkt; ++kt) {
    issue_scores(kt);
    issue_dq(kt - 1);
    wgmma_wait<1>();  // S and dP of tile kt
    fence_accumulators(s);
    fence_accumulators(dp);
    ds(kt);
    wgmma_wait<0>();  // dQ of tile kt − 1
    fence_accumulators(dq);
    fence_operands(da);
    if (lane == 0) mbar_arrive(&p.empty[Slot<kBwdStages>(base + kt - 1).stage]);
    to_a<T, 64>(s, da);
  }
  wgmma_fence();
  issue_dq(nkt - 1);
  wgmma_wait<0>();
  fence_accumulators(dq);
  fence_operands(da);
  if (lane == 0) {
    mbar_arrive(&p.empty[Slot<kBwdStages>(base + nkt - 1).stage]);
    mbar_arrive(&p.res_empty[j & 1]);
  }
  const int64_t ld = 3 * ldy;
  store_rows<T>(dq, g.scale, g.scale, dqkv + b * t * ld + h * kD, ld, qw, t, lane);
}

template <class T, bool DROP>
__global__ void __launch_bounds__(kThreads, 1)
    dq_kernel(const __grid_constant__ CUtensorMap qkv128, const __grid_constant__ CUtensorMap qkv64,
              const __grid_constant__ CUtensorMap dy128, const T* y, const T* dy, const float* lse,
              float* dsum, T* dqkv, Geometry g, Units units, DeviceMask mask) {
#if FFN_ATTN_SM90_CODE
  extern __shared__ uint8_t smem_raw[];
  const BwdPipe p = BwdPipe::carve(smem_raw);
  if (threadIdx.x == 0) {
    prefetch_tensor_map(&qkv128);
    prefetch_tensor_map(&qkv64);
    prefetch_tensor_map(&dy128);
    p.init();
  }
  __syncthreads();
  // Unit u: query block q0 of head bh (the last blocks first) and its key tiles [0, nkt).
  auto unit = [&](int64_t u, int64_t& bh, int64_t& q0, int& nkt) {
    bh = units.bh(u);
    q0 = 128LL * (units.blocks - 1 - units.rank(u));
    const int64_t kend = q0 + 128 < g.t ? q0 + 128 : g.t;  // keys [0, kend)
    nkt = static_cast<int>((kend + 63) / 64);
  };
  RingPos at;
  run_units(
      units,
      [&](int j, int64_t u) {
        int64_t bh, q0;
        int nkt;
        unit(u, bh, q0, nkt);
        const int b = static_cast<int>(bh / g.heads), h = static_cast<int>(bh % g.heads);
        produce(p, at, j, Load{&qkv128, h * kD}, Load{&dy128, h * kD}, static_cast<int>(q0),
                Load{&qkv64, (g.heads + h) * kD}, Load{&qkv64, (2 * g.heads + h) * kD}, 0, nkt, b);
      },
      [&](int j, int64_t u, int base) {
        int64_t bh, q0;
        int nkt;
        unit(u, bh, q0, nkt);
        dq_consume<T, DROP>(p, g, threadIdx.x / 128 - 1, j, base, bh, y, dy, lse, dsum, dqkv, q0,
                            nkt, mask);
        return nkt;
      });
#endif
}

// ---------------------------------------------------------------------------------------
// Backward dk/dv: 128 keys per CTA, 64-query tiles from the diagonal on.

template <class T, bool DROP>
__device__ void dkv_consume(const BwdPipe& p, const Geometry& g, int c, int j, int base,
                            int64_t bh, const float* lse, const float* dsum, T* dqkv, int64_t k0,
                            int nit, const DeviceMask& mask) {
  const int tid = threadIdx.x - 128 * (c + 1), warp = tid / 32, lane = tid % 32;
  const int gr = lane >> 2, cq = lane & 3;
  const int64_t t = g.t, kw = k0 + 64 * c + 16 * warp;  // the warp's first key
  uint8_t* mb = p.mask + (4 * c + warp) * 256;
  const float sl2 = g.scale * kLog2e;
  float dk[32], dv[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) dk[i] = dv[i] = 0.0f;
  mbar_wait(&p.res_full[j & 1], (j >> 1) & 1);
  const uint64_t kd = smem_desc_k128(p.resident(j & 1, 0) + c * 64 * kRowBytes);
  const uint64_t vd = smem_desc_k128(p.resident(j & 1, 1) + c * 64 * kRowBytes);
  float s[32], dp[32];  // rows: the warp's 16 keys; columns: the tile's 64 queries
  u32 pa[4][4], da[4][4];
  // Query tile it's Sᵀ and dPᵀ; dV and dK of tile it − 1 run while tile it's Pdᵀ and dSᵀ are
  // computed (the forward's overlap, fwd_consume).
  auto issue_scores = [&](int it) {
    // The tile's row statistics (lse in log2 units, D), double-buffered per warpgroup: the
    // barrier orders this write after every read of the buffer two tiles ago.
    const int64_t q0 = k0 + 64LL * it;
    float* st = p.stats + c * 256 + ((base + it) & 1) * 128;
    if (tid < 64) {
      const int64_t i = q0 + tid;
      st[tid] = i < t ? lse[bh * t + i] * kLog2e : 0.0f;
      st[64 + tid] = i < t ? dsum[bh * t + i] : 0.0f;
    }
    named_barrier_sync(1 + c, 128);
    const Slot<kBwdStages> at(base + it);
    mbar_wait(&p.full[at.stage], at.phase);
    wgmma_fence();
    mma_scores<64, T>(s, kd, smem_desc_k128(p.tile(at.stage, 0)));
    mma_scores<64, T>(dp, vd, smem_desc_k128(p.tile(at.stage, 1)));
    wgmma_commit();
  };
  auto issue_dkv = [&](int it) {
    const int stage = Slot<kBwdStages>(base + it).stage;
    mma_rows<64, T>(dv, pa, smem_desc_mn128(p.tile(stage, 1), kBox64));
    mma_rows<64, T>(dk, da, smem_desc_mn128(p.tile(stage, 0), kBox64));
    wgmma_commit();
  };
  auto grads = [&](int it) {  // Pdᵀ into s, dSᵀ into dp (trimmed as the forward's softmax)
    const int64_t q0 = k0 + 64LL * it;
    const float* st = p.stats + c * 256 + ((base + it) & 1) * 128;
    if constexpr (DROP)  // byte idx: query q0 + idx % 64, keys kw + 8·(idx / 64) …
      attn::draw_bytes<4>(mb, mask, bh, t, lane, [&](int idx) {
        return QueryKeys{q0 + (idx & 63), kw + 8 * (idx >> 6)};
      });
    auto run = [&]<bool EDGE>() {
      // Key j = kw + gr + 8(e/2) is after query i = q0 + col when rel + 8(e/2) − col > 0;
      // queries col ≥ last are past T.
      const int rel = EDGE ? static_cast<int>(kw - q0) + gr : 0;
      const int last = EDGE ? static_cast<int>(t - q0 < 64 ? t - q0 : 64) : 64;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const int c0 = 8 * n + 2 * cq;
        const float2 l2 = *reinterpret_cast<const float2*>(st + c0);
        const float2 dd = *reinterpret_cast<const float2*>(st + 64 + c0);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = c0 + (e & 1);
          float pr = ex2(fmaf(s[4 * n + e], sl2, -((e & 1) ? l2.y : l2.x)));
          if constexpr (EDGE)
            if (col >= last || rel + 8 * (e >> 1) - col > 0) pr = 0.0f;
          const float d = (e & 1) ? dd.y : dd.x;
          if constexpr (DROP) {  // Pd = P·f and dS = P·(dPd·f − D), f = mask/(1−p)
            const float f = (mb[(e >> 1) * 64 + col] >> gr) & 1 ? mask.scale : 0.0f;
            s[4 * n + e] = pr * f;
            dp[4 * n + e] = pr * (dp[4 * n + e] * f - d);
          } else {
            s[4 * n + e] = pr;
            dp[4 * n + e] = pr * (dp[4 * n + e] - d);
          }
        }
      }
    };
    // Some query of the tile is before a key of the warpgroup's, or past T.
    if (q0 < k0 + 64 * c + 63 || q0 + 64 > t)
      run.template operator()<true>();
    else
      run.template operator()<false>();
  };
  issue_scores(0);
  wgmma_wait<0>();
  fence_accumulators(s);
  fence_accumulators(dp);
  grads(0);
  to_a<T, 64>(s, pa);
  to_a<T, 64>(dp, da);
  for (int it = 1; it < nit; ++it) {
    issue_scores(it);
    issue_dkv(it - 1);
    wgmma_wait<1>();  // Sᵀ and dPᵀ of tile it
    fence_accumulators(s);
    fence_accumulators(dp);
    grads(it);
    wgmma_wait<0>();  // dV and dK of tile it − 1
    fence_accumulators(dv);
    fence_accumulators(dk);
    fence_operands(pa);
    fence_operands(da);
    if (lane == 0) mbar_arrive(&p.empty[Slot<kBwdStages>(base + it - 1).stage]);
    to_a<T, 64>(s, pa);
    to_a<T, 64>(dp, da);
  }
  wgmma_fence();
  issue_dkv(nit - 1);
  wgmma_wait<0>();
  fence_accumulators(dv);
  fence_accumulators(dk);
  fence_operands(pa);
  fence_operands(da);
  if (lane == 0) {
    mbar_arrive(&p.empty[Slot<kBwdStages>(base + nit - 1).stage]);
    mbar_arrive(&p.res_empty[j & 1]);
  }
  const int64_t b = bh / g.heads, h = bh % g.heads, ld = 3LL * g.heads * kD;
  T* dkg = dqkv + b * t * ld + (g.heads + h) * kD;
  store_rows<T>(dk, g.scale, g.scale, dkg, ld, kw, t, lane);
  store_rows<T>(dv, 1.0f, 1.0f, dkg + static_cast<int64_t>(g.heads) * kD, ld, kw, t, lane);
}

template <class T, bool DROP>
__global__ void __launch_bounds__(kThreads, 1)
    dkv_kernel(const __grid_constant__ CUtensorMap qkv128,
               const __grid_constant__ CUtensorMap qkv64,
               const __grid_constant__ CUtensorMap dy64, const float* lse, const float* dsum,
               T* dqkv, Geometry g, Units units, DeviceMask mask) {
#if FFN_ATTN_SM90_CODE
  extern __shared__ uint8_t smem_raw[];
  const BwdPipe p = BwdPipe::carve(smem_raw);
  if (threadIdx.x == 0) {
    prefetch_tensor_map(&qkv128);
    prefetch_tensor_map(&qkv64);
    prefetch_tensor_map(&dy64);
    p.init();
  }
  __syncthreads();
  // Unit u: key block k0 of head bh (the first blocks, most query tiles, first) and its
  // query tiles from the diagonal on.
  auto unit = [&](int64_t u, int64_t& bh, int64_t& k0, int& nit) {
    bh = units.bh(u);
    k0 = 128LL * units.rank(u);
    nit = static_cast<int>((g.t - k0 + 63) / 64);
  };
  RingPos at;
  run_units(
      units,
      [&](int j, int64_t u) {
        int64_t bh, k0;
        int nit;
        unit(u, bh, k0, nit);
        const int b = static_cast<int>(bh / g.heads), h = static_cast<int>(bh % g.heads);
        produce(p, at, j, Load{&qkv128, (g.heads + h) * kD}, Load{&qkv128, (2 * g.heads + h) * kD},
                static_cast<int>(k0), Load{&qkv64, h * kD}, Load{&dy64, h * kD},
                static_cast<int>(k0), nit, b);
      },
      [&](int j, int64_t u, int base) {
        int64_t bh, k0;
        int nit;
        unit(u, bh, k0, nit);
        dkv_consume<T, DROP>(p, g, threadIdx.x / 128 - 1, j, base, bh, lse, dsum, dqkv, k0, nit,
                             mask);
        return nit;
      });
#endif
}

// ---------------------------------------------------------------------------------------
// Host side.

// The [B, T, cols] activations as 3-D TMA maps with boxes of `rows` rows × 64 columns.
CUtensorMap rows_map(const Tensor& x, int rows, const char* op) {
  const uint64_t cols = static_cast<uint64_t>(x.size(2)), t = static_cast<uint64_t>(x.size(1));
  return tensor_map_3d(x.data_ptr(), x.dtype(), {cols, t, static_cast<uint64_t>(x.size(0))},
                       {cols, cols * t}, rows, op);
}

// Raises a kernel's dynamic shared-memory limit once per (kernel, device).
void allow_smem(const void* kernel, int bytes) {
  static std::map<std::pair<const void*, int>, bool> done;
  int dev = 0;
  FFN_CHECK_CUDA(cudaGetDevice(&dev));
  bool& d = done[{kernel, dev}];
  if (!d) {
    FFN_CHECK_CUDA(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    d = true;
  }
}

// f.template operator()<T, DROP>() for the dtype and whether dropout is on (the kernels
// without it carry no mask code).
template <class F>
void with_half_drop(DType dt, bool drop, const F& f) {
  auto by_drop = [&]<class T>() {
    if (drop)
      f.template operator()<T, true>();
    else
      f.template operator()<T, false>();
  };
  if (dt == DType::bf16)
    by_drop.template operator()<__nv_bfloat16>();
  else
    by_drop.template operator()<__half>();
}

// One CTA per SM (each takes one: 384 threads, the consumers at 240 registers), none idle.
unsigned persistent_grid(const Units& u, int dev) {
  const int64_t sms = properties(dev).multiProcessorCount;
  return static_cast<unsigned>(std::min<int64_t>(u.bh_count * u.blocks, sms));
}

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

}  // namespace
}  // namespace attn90

bool sm90_attention_supported(const Tensor& qkv, int64_t heads) {
  if (!qkv.defined() || !qkv.is_cuda() || qkv.dim() != 3 || heads <= 0) return false;
  if (qkv.dtype() != DType::bf16 && qkv.dtype() != DType::f16) return false;
  if (qkv.size(2) != 3 * heads * attn90::kD || !attn90::aligned16(qkv)) return false;
  const int64_t b = qkv.size(0), t = qkv.size(1);
  if (t <= 0 || t >= (int64_t{1} << 31) || (t + 127) / 128 > 65535) return false;
  if (b * heads >= (int64_t{1} << 31)) return false;
  return gemm::sm90a_code_on(qkv.device().index);  // Note [sm_90a code]
}

void sm90_attention_forward(const Tensor& qkv, int64_t heads, float scale, const DropoutSpec& d,
                            Tensor& y, Tensor& lse) {
  using namespace attn90;
  const char* op = "fused_attention";
  FFN_CHECK(sm90_attention_supported(qkv, heads) && aligned16(y), "[", op,
            "] the Hopper kernel cannot run ", qkv.desc(), " with ", heads, " heads");
  const int dev = qkv.device().index;
  DeviceGuard guard(dev);
  const int64_t b = qkv.size(0), t = qkv.size(1);
  const Geometry g{t, static_cast<int>(heads), scale};
  const CUtensorMap m128 = rows_map(qkv, 128, op);
  const Units units{b * heads, static_cast<int>((t + 127) / 128)};
  const unsigned grid = persistent_grid(units, dev);
  with_half_drop(qkv.dtype(), d.active(), [&]<class T, bool DROP>() {
    allow_smem(reinterpret_cast<const void*>(fwd_kernel<T, DROP>), FwdPipe::kSmem);
    fwd_kernel<T, DROP><<<grid, kThreads, FwdPipe::kSmem, stream(dev)>>>(
        m128, static_cast<T*>(y.data_ptr()), lse.data<float>(), g, units, DeviceMask::from(d));
    FFN_CHECK_LAUNCH();
  });
}

void sm90_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& dy,
                             const Tensor& lse, int64_t heads, float scale, const DropoutSpec& d,
                             Tensor& dqkv) {
  using namespace attn90;
  const char* op = "fused_attention_backward";
  FFN_CHECK(sm90_attention_supported(qkv, heads) && aligned16(y) && aligned16(dy) &&
                aligned16(dqkv),
            "[", op, "] the Hopper kernel cannot run ", qkv.desc(), " with ", heads, " heads");
  const int dev = qkv.device().index;
  DeviceGuard guard(dev);
  const int64_t b = qkv.size(0), t = qkv.size(1);
  const Geometry g{t, static_cast<int>(heads), scale};
  const DeviceMask mask = DeviceMask::from(d);
  const CUtensorMap q128 = rows_map(qkv, 128, op), q64 = rows_map(qkv, 64, op);
  const CUtensorMap dy128 = rows_map(dy, 128, op), dy64 = rows_map(dy, 64, op);
  Tensor dsum = Tensor::empty({b * heads, t}, DType::f32, qkv.device());
  const Units units{b * heads, static_cast<int>((t + 127) / 128)};
  const unsigned grid = persistent_grid(units, dev);
  with_half_drop(qkv.dtype(), d.active(), [&]<class T, bool DROP>() {
    allow_smem(reinterpret_cast<const void*>(dq_kernel<T, DROP>), BwdPipe::kSmem);
    dq_kernel<T, DROP><<<grid, kThreads, BwdPipe::kSmem, stream(dev)>>>(
        q128, q64, dy128, static_cast<const T*>(y.data_ptr()), static_cast<const T*>(dy.data_ptr()),
        lse.data<float>(), dsum.data<float>(), static_cast<T*>(dqkv.data_ptr()), g, units, mask);
    FFN_CHECK_LAUNCH();
    allow_smem(reinterpret_cast<const void*>(dkv_kernel<T, DROP>), BwdPipe::kSmem);
    dkv_kernel<T, DROP><<<grid, kThreads, BwdPipe::kSmem, stream(dev)>>>(
        q128, q64, dy64, lse.data<float>(), dsum.data<float>(), static_cast<T*>(dqkv.data_ptr()),
        g, units, mask);
    FFN_CHECK_LAUNCH();
  });
}

}  // namespace ffn::cuda
