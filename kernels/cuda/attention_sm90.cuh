// kernels/cuda/attention_sm90.cuh — the pieces the Hopper attention kernels share
// (attention_sm90_fwd.cu, attention_sm90_bwd.cu; entry points in attention_sm90.h): the
// shared-memory pipeline (resident slots and the streamed ring, their mbarriers), the
// producer, the persistent unit loop, the register-fragment helpers around wgmma, and the
// host side's tensor maps and launch helpers.
//
// Note [Hopper attention]
// ~~~~~~~~~~~~~~~~~~~~~~~
// The same math as the mma.sync kernels (attention.cu) in two persistent kernels: forward,
// and a backward dk/dv that also computes dQ (Note [Attention backward in one pass],
// attention_sm90_bwd.cu, beside a small row kernel for D_i = dy_i·y_i). Each is a
// persistent grid of one CTA per SM walking units (a head's block of 64 rows per consumer
// warpgroup), the longest first (Units). Warpgroup 0 is the producer (one thread issues TMA
// loads; setmaxnreg gives its registers away), the others are consumers owning 64 rows each
// of the unit's block: two in dk/dv (128-row blocks, 384 threads), two or three in forward
// (Note [Forward block rows], attention_sm90_fwd.cu). The block's own tiles ("resident": Q
// in forward, K and V in dk/dv) are loaded once per unit into one of two slots, so the next
// unit's load overlaps this one's end; the other side's tiles ("streamed") pass through a
// ring of shared-memory stages that carries over between units, with full/empty mbarriers
// (Note [Hopper GEMM pipeline]'s protocol: full completes on the TMA bytes, empty on one
// arrival per consumer warp; the resident slots have the same pair).
//
// Per streamed tile, each consumer warpgroup issues the score products with A and B from
// shared memory (S = Q·Kᵀ in forward; Sᵀ = K·Qᵀ, dPᵀ = V·dYᵀ in dk/dv),
// works on them in registers (wgmma's accumulator layout is mma.sync's C fragment layout, 16
// rows per warp, so the softmax, masking and dropout code reads like attention.cu's), packs
// the probabilities or dS to 16 bits, which is the A-operand register layout, and issues the
// second products with A from registers and B the streamed tile read N-major: O += P·V;
// dV += Pdᵀ·dY, dK += dSᵀ·Q. The second products of tile k − 1 are issued right
// after the score products of tile k, so they run on the tensor cores while the CUDA cores
// work on tile k's scores (FlashAttention-3's intra-warpgroup overlap; fwd_consume says
// which register writes must wait for which wgmmas).
//
// Tiles are 64 columns (the head) by 64 or 128 rows, 128-byte rows swizzled by TMA as the
// wgmma descriptors expect (sm90.cuh). Loads go through 3-D tensor maps over [B, T, columns],
// so rows past T (the last block of a sequence) load as zeros and never read the next
// sequence; those rows are masked (keys) or not stored (queries). Sizes: forward streams
// 128-key tiles (S is 64×128 per warpgroup); the backward streams 64-row tiles, which keeps
// S, dP, the packed operands and both accumulators of dk/dv within the consumers' registers
// (240 in the forward's 128-row blocks, 160 in its 192-row ones, 232 in backward) without
// spilling where there is no dropout (with it, the backward spills 12 bytes).
//
// Same results as attention.cu up to fp32 summation order (the reference tests hold both to
// the same bound); deterministic (dQ's partial sums are added in a fixed order); mask bits from
// Note [Attention mask draws], so both kernels drop the same entries.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_sm90.h"
#include "kernels/cuda/gemm/sm90.cuh"
#include "kernels/cuda/gemm/tensor_map.h"
#include "kernels/cuda/gemm/wgmma.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/rowwise.cuh"

namespace ffn::cuda {

namespace attn90 {

// Note [Unit order]
// ~~~~~~~~~~~~~~~~~
// The persistent grid's units are (bh, block) pairs, the longest blocks first (for the
// forward the last query blocks, for dk/dv the first key blocks): unit u is block rank(u) of
// head bh(u). CTA x of a grid of G takes one unit of each round of G units, round k's units
// kG .. kG + G − 1: unit kG + x in every round (strided), or, with `alternate`, kG + G − 1 − x
// in odd rounds. With unit lengths falling round after round, striding gives CTA 0 the
// longest unit of every round: at gpt2_small's shape (192 heads × 8 blocks on 132 SMs) the
// forward's most loaded CTA has 56 key blocks against a mean of 52.4, dk/dv's 112 query tiles
// against 104.7; alternating brings both to 53 and 106, as a greedy dynamic scheduler would.
// Measured (H100, ffn-bench --attention, session 23): the forward 0.099–0.101 → 0.094–0.096
// ms, so it alternates; dk/dv 0.349–0.350 → 0.355–0.357 ms, slower against the prediction (not
// understood; its units also wait on each other's dQ sums), so it keeps striding. Either way
// a CTA's units come in increasing index order, which is all Note [Attention backward in one
// pass] needs for its waits to be deadlock-free.
// Groups (session 29): where the heads outnumber the CTAs and the per-head data that every
// block of a head touches again (dk/dv: the head's fp32 dQ sums, 64 floats a query row; the
// forward: its K and V, 128 16-bit values a key row) is more than half of L2 for all heads
// together, the heads go in groups of the grid's size, each group's units (longest first, as
// above) before the next group's: round k of a full group is block k of each of its heads, one
// a CTA, so a head's blocks still run one after another (dk/dv's waits stay short) while only
// the group's data is live in L2. Block k − 1 of a head is in its group and comes first, so
// the waits stay deadlock-free. Measured (H100, ffn-bench --attention, alternated three
// times, same binary): gpt2_small dk/dv's DRAM traffic 559 → 433 MB and L2 hit rate 55 → 65%
// (ncu), the backward 0.353–0.360 → 0.341–0.345 ms, the forward 0.098–0.100 → 0.096–0.098;
// gpt2_t512 (384 heads) backward 0.258–0.260 → 0.223–0.228, forward 0.073–0.075 → 0.072–0.073;
// shakespeare_char (24 MiB of dQ sums, under the threshold) forward 0.034 → 0.036 when grouped,
// so it is not. With attention dropout (p = 0.2; the mask draws, not memory, set the pace)
// dk/dv grouped measured 0.446 → 0.451–0.454 ms at gpt2_small's shape and 0.302–0.304 →
// 0.294–0.296 at gpt2_t512's (call 6, two runs each): its dropout variant keeps one group.
// gpt2_small's training step did not resolve the change (31.93/32.11 → 31.97/31.89 ms/iter,
// median of iterations 21–80, alternated; ~0.2 ms expected from the kernel rows).
struct Units {  // (outside the anonymous namespace: the compute_80 pass never calls it)
  int64_t bh_count;
  int blocks;
  bool alternate;  // the order of odd rounds: reversed (true) or not
  int64_t group;   // heads per group: a group's units (all its blocks) before the next group's
  __device__ int64_t count() const { return bh_count * blocks; }
  // Unit u is block rank of head bh: groups of `group` heads, block-major inside a group.
  // 32-bit arithmetic (count() < 2^31: sm90_attention_supported), which also keeps the
  // consumers of the dropout backward from spilling more.
  __device__ void split32(int u, int& bh, int& rank) const {
    const int grp = static_cast<int>(group), per = grp * blocks, g = u / per, r = u - g * per;
    const int left = static_cast<int>(bh_count) - g * grp, n = left < grp ? left : grp;
    rank = r / n;
    bh = g * grp + r % n;
  }
  // CTA x's k-th unit in a grid of g (≥ count() once the CTA has none left).
  __device__ int64_t at(int64_t k, int64_t x, int64_t g) const {
    return k * g + (alternate && (k & 1) ? g - 1 - x : x);
  }
};

// sm90_attention_force_unit_group's and sm90_attention_force_grid's values
// (attention_sm90_fwd.cu); 0: automatic.
extern std::atomic<int64_t> forced_unit_group;
extern std::atomic<int64_t> forced_grid;
extern std::atomic<int64_t> forced_forward_rows;

namespace {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FFN_ATTN_SM90_CODE 1
#else
#define FFN_ATTN_SM90_CODE 0
#endif

using attn::ex2;
using attn::kLog2e;
using attn::QueryKeys;
using attn::u32;
using namespace gemm;  // mbarriers, TMA, wgmma descriptors and instructions

constexpr int kD = 64;          // head size
constexpr int kRowBytes = 128;  // one 64-element row of a tile
// Threads of a CTA with NC consumer warpgroups (and the producer warpgroup).
template <int NC = 2>
constexpr int kThreads = 128 * (NC + 1);
[[maybe_unused]] constexpr uint32_t kBox64 = 64 * kRowBytes;  // one 64-row tile's bytes

// Shared memory of one CTA with NC consumer warpgroups: two slots of RES resident tiles of
// 64·NC rows, STAGES stages of two streamed SROWS-row tiles, EXTRA bytes of the kernel's own
// (all 1024-byte aligned for the 128-byte swizzle), the warps' mask bytes, the consumers' row
// statistics, the barriers (the ring's and the slots', and 4 more the kernel may use for its
// extra area).
template <int SROWS, int STAGES, int EXTRA = 0, int NC = 2, int RES = 2>
struct Pipe {
  static_assert(EXTRA % 1024 == 0);
  static constexpr int kConsumerWarps = 4 * NC;
  static constexpr int kResBytes = 64 * NC * kRowBytes;
  static constexpr int kTileBytes = SROWS * kRowBytes;
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kMaskBytes = kConsumerWarps * 256;  // 256 bytes a consumer warp
  static constexpr int kStatFloats = NC * 2 * 128;         // 2 buffers × 128 a warpgroup
  static constexpr int kSmem = 1024 + 2 * RES * kResBytes + STAGES * kStageBytes + EXTRA +
                               kMaskBytes + kStatFloats * 4 + (2 * STAGES + 8) * 8;
  static_assert(kSmem <= 227 * 1024, "over the dynamic shared memory of one sm_90 CTA");

  uint8_t* tiles;
  uint8_t* extra;
  uint8_t* mask;
  float* stats;
  uint64_t* full;
  uint64_t* empty;
  uint64_t* res_full;   // [2] a slot of resident tiles has landed
  uint64_t* res_empty;  // [2] its unit is done with it (one arrival per consumer warp)
  uint64_t* aux;        // [4] the kernel's (initialised by it)

  __device__ static Pipe carve(uint8_t* raw) {
    Pipe p;
    p.tiles = raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);
    p.extra = p.tiles + 2 * RES * kResBytes + STAGES * kStageBytes;
    p.mask = p.extra + EXTRA;
    p.stats = reinterpret_cast<float*>(p.mask + kMaskBytes);
    p.full = reinterpret_cast<uint64_t*>(p.stats + kStatFloats);
    p.empty = p.full + STAGES;
    p.res_full = p.empty + STAGES;
    p.res_empty = p.res_full + 2;
    p.aux = p.res_empty + 2;
    return p;
  }
  // Resident tile i of slot `slot` (units alternate between two slots, so the producer
  // loads the next unit's while the consumers finish this one).
  __device__ uint8_t* resident(int slot, int i) const {
    return tiles + (RES * slot + i) * kResBytes;
  }
  __device__ uint8_t* tile(int s, int i) const {
    return tiles + 2 * RES * kResBytes + s * kStageBytes + i * kTileBytes;
  }
  __device__ void init() const {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps);
    }
    for (int slot = 0; slot < 2; ++slot) {
      mbar_init(&res_full[slot], 1);
      mbar_init(&res_empty[slot], kConsumerWarps);
    }
    for (int i = 0; i < 4; ++i) mbar_init(&aux[i], 1);
    fence_barrier_init();
  }
};

// One tile load: a tensor map and the column of the head's slice in it.
struct Load {
  const CUtensorMap* map;
  int col;
};

// The producer thread, one unit (the CTA's j-th): its resident tiles at row res_row into slot
// j % 2 (r1.map may be null, and is ignored where a slot holds one tile), then n streamed
// pairs at rows srow0, srow0 + SROWS, … of sequence b into the ring, whose position (stage,
// phase) carries over between units.
struct RingPos {
  int stage = 0;
  uint32_t phase = 0;
};
template <int SROWS, int STAGES, int EXTRA, int NC, int RES>
__device__ void produce(const Pipe<SROWS, STAGES, EXTRA, NC, RES>& p, RingPos& at, int j,
                        Load r0, Load r1, int res_row, Load s0, Load s1, int srow0, int n, int b) {
  using P = Pipe<SROWS, STAGES, EXTRA, NC, RES>;
  const bool two = RES > 1 && r1.map;  // a slot of one tile holds r0 only
  const int slot = j & 1;
  mbar_wait_idle(&p.res_empty[slot], ((j >> 1) & 1) ^ 1);  // Note [Idle waits]
  mbar_arrive_expect_tx(&p.res_full[slot], (two ? 2 : 1) * P::kResBytes);
  tma_load_3d(p.resident(slot, 0), r0.map, &p.res_full[slot], r0.col, res_row, b);
  if (two) tma_load_3d(p.resident(slot, 1), r1.map, &p.res_full[slot], r1.col, res_row, b);
  for (int i = 0; i < n; ++i) {
    mbar_wait_idle(&p.empty[at.stage], at.phase ^ 1);
    mbar_arrive_expect_tx(&p.full[at.stage], P::kStageBytes);
    const int row = srow0 + i * SROWS;
    tma_load_3d(p.tile(at.stage, 0), s0.map, &p.full[at.stage], s0.col, row, b);
    tma_load_3d(p.tile(at.stage, 1), s1.map, &p.full[at.stage], s1.col, row, b);
    if (++at.stage == STAGES) at.stage = 0, at.phase ^= 1;
  }
}

// The roles of a persistent kernel over its CTA's units (Note [Unit order]): thread 0 of
// warpgroup 0 calls produce_unit(j, u) for the j-th; the consumer warpgroups call
// consume_unit(j, u, base), which returns the unit's streamed tiles, base counting those
// before it (the ring position); thread 32 (warpgroup 0's second warp) calls side() once,
// where the kernel has a third role. Each warpgroup's role is one branch, as setmaxnreg needs
// (HOPPER.md).
struct NoSide {
  __device__ void operator()() const {}
};
template <int PRODUCER_REGS = 24, int CONSUMER_REGS = 240, int NC = 2, class Produce,
          class Consume, class Side = NoSide>
__device__ __forceinline__ void run_units(const Units& units, const Produce& produce_unit,
                                          const Consume& consume_unit, const Side& side = {}) {
  // setmaxnreg.inc waits for registers the other warpgroups released: the kernel starts
  // with the register file split evenly (one CTA an SM: 168 a thread for 384 threads, 128
  // for 512), so the total has to stay within that.
  constexpr int kLaunchRegs = 65536 / kThreads<NC> / 8 * 8;
  static_assert(128 * PRODUCER_REGS + 128 * NC * CONSUMER_REGS <= kThreads<NC> * kLaunchRegs);
  if (threadIdx.x < 128) {
    regs_dealloc<PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      for (int j = 0;; ++j) {
        const int64_t u = units.at(j, blockIdx.x, gridDim.x);
        if (u >= units.count()) break;
        produce_unit(j, u);
      }
    } else if (threadIdx.x == 32) {
      side();
    }
  } else {
    regs_alloc<CONSUMER_REGS>();
    int base = 0;
    for (int j = 0;; ++j) {
      const int64_t u = units.at(j, blockIdx.x, gridDim.x);
      if (u >= units.count()) break;
      base += consume_unit(j, u, base);
    }
  }
}

// Carves the CTA's shared memory; thread 0 prefetches the kernel's tensor maps and sets up
// the barriers before any thread uses them.
template <class P, class... Maps>
__device__ __forceinline__ P begin_cta(const Maps*... maps) {
  extern __shared__ uint8_t smem_raw[];
  const P p = P::carve(smem_raw);
  if (threadIdx.x == 0) {
    (prefetch_tensor_map(maps), ...);
    p.init();
  }
  __syncthreads();
  return p;
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
// 16-bit matrix at g (row stride ld); rows ≥ t are skipped. rope (optional, rope_table's
// [t, 32]): each row rotated back by its position's angles first (Note [Fused rotary
// embeddings]); the lane's column 8n + 2(lane % 4) + e (n < 4) pairs with n + 4's.
// sums (optional): the thread's column sums of what it stores, added to sums[2n + e] for its
// column 8n + 2(lane % 4) + e (n < 8), the 16-bit values as stored (Note [QKV bias gradient
// in the attention backward], attention_sm90_bwd.cu). rs (optional): row r0 + g (+8) also
// times rs[that row], loaded here (Note [RMSNorm folded into the QKV GEMM]).
template <class T>
__device__ __forceinline__ void store_rows(const float (&acc)[32], float mul0, float mul1, T* g,
                                           int64_t ld, int64_t r0, int64_t t, int lane,
                                           const float2* rope = nullptr, float* sums = nullptr,
                                           const float* rs = nullptr) {
  const int gr = lane >> 2, c = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = r0 + gr + 8 * half;
    if (row >= t) continue;
    const float mul = (half ? mul1 : mul0) * (rs ? __ldg(rs + row) : 1.0f);
    float v[16];
#pragma unroll
    for (int n = 0; n < 8; ++n)
      v[2 * n] = acc[4 * n + 2 * half] * mul, v[2 * n + 1] = acc[4 * n + 2 * half + 1] * mul;
    if (rope) {
      const float2* cs = rope + row * 32 + 2 * c;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(cs + 8 * n));
        rope_rotate(v[2 * n], v[2 * n + 8], a.x, a.y, -1.0f);
        rope_rotate(v[2 * n + 1], v[2 * n + 9], a.z, a.w, -1.0f);
      }
    }
    u32* out = reinterpret_cast<u32*>(g + row * ld + 2 * c);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const u32 packed = pack2<T>(v[2 * n], v[2 * n + 1]);
      out[4 * n] = packed;
      if (sums) {
        sums[2 * n] += unpack<T>(packed, 0);
        sums[2 * n + 1] += unpack<T>(packed, 1);
      }
    }
  }
}

// Note [QKV bias gradient in the attention backward]: a warpgroup's column sums of the
// 16-bit values it stored (each thread's `sums` from store_rows over its 16 rows × 16
// columns), reduced over the lanes of a column (lane ^ 4, ^ 8, ^ 16), then over the four
// warps in warp order through red ([4][64] floats of shared memory) by threads tid < 64 of
// the warpgroup (barrier: the warpgroup's own, 128 threads), which write column tid to out
// when out is not null. The caller orders the next use of red after this one's reads.
__device__ __forceinline__ void warpgroup_column_sums(float (&sums)[16], float* red, int tid,
                                                      int barrier, float* out) {
  const int warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    sums[i] += __shfl_xor_sync(0xffffffffu, sums[i], 4);
    sums[i] += __shfl_xor_sync(0xffffffffu, sums[i], 8);
    sums[i] += __shfl_xor_sync(0xffffffffu, sums[i], 16);
  }
  if (lane < 4) {
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      red[warp * 64 + 8 * n + 2 * lane] = sums[2 * n];
      red[warp * 64 + 8 * n + 2 * lane + 1] = sums[2 * n + 1];
    }
  }
  named_barrier_sync(barrier, 128);
  if (tid < 64 && out) out[tid] = ((red[tid] + red[64 + tid]) + red[128 + tid]) + red[192 + tid];
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
  // The backward's optional row scale of dqkv, [B·T] (Note [RMSNorm folded into the QKV GEMM]
  // in layers/attention.cpp): row r of sequence b stored times row_scale[b·T + r].
  const float* row_scale = nullptr;
};


// Stage and phase of streamed tile k in the ring.
template <int STAGES>
struct Slot {
  int stage;
  uint32_t phase;
  __device__ explicit Slot(int k)
      : stage(k % STAGES), phase(static_cast<uint32_t>(k / STAGES) & 1) {}
};

// ---------------------------------------------------------------------------------------
// Host side.

// The [B, T, cols] activations as 3-D TMA maps with boxes of `rows` rows × 64 columns.
CUtensorMap rows_map(const Tensor& x, int rows, const char* op) {
  const uint64_t cols = static_cast<uint64_t>(x.size(2)), t = static_cast<uint64_t>(x.size(1));
  return tensor_map_3d(x.data_ptr(), x.dtype(), {cols, t, static_cast<uint64_t>(x.size(0))},
                       {cols, cols * t}, rows, op);
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

// One CTA per SM (each takes one: the consumers hold most of the register file), none idle;
// fewer where a test forces it.
unsigned persistent_grid(const Units& u, int dev) {
  int64_t ctas = properties(dev).multiProcessorCount;
  if (const int64_t forced = forced_grid.load(); forced > 0) ctas = std::min(ctas, forced);
  return static_cast<unsigned>(std::min<int64_t>(u.bh_count * u.blocks, ctas));
}

// Note [Unit order]'s groups: heads per group for units over t rows of each head (256 bytes a
// row of the data the blocks of a head share) on a grid of `grid` CTAs; `allowed` = false
// keeps one group unless a test forces them.
int64_t unit_group(const Units& u, unsigned grid, int64_t t, int dev, bool allowed = true) {
  if (const int64_t forced = forced_unit_group.load(); forced > 0)
    return std::min(forced, u.bh_count);
  const double shared = static_cast<double>(u.bh_count) * static_cast<double>(t) * 256.0;
  const bool group = allowed && u.bh_count > grid && 2.0 * shared > properties(dev).l2CacheSize;
  return group ? static_cast<int64_t>(grid) : u.bh_count;
}

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

}  // namespace
}  // namespace attn90
}  // namespace ffn::cuda
