// kernels/cuda/gemm/act_warpgroup.cuh — the pieces of the Hopper GEMM whose activation
// epilogue runs on warpgroups of its own (Note [Activation warpgroup]): the shared-memory
// tiles and barriers that hand a tile from the consumer warpgroup to them (ActShared), the
// consumer's side (stage_block: the rounded accumulators into a staged tile) and the
// activation warpgroups' loop (ActWarpgroup). kernel.cuh composes them with the mainloop and
// the tile scheduler into gemm_act_kernel.
#pragma once

#include "core/cuda/types.cuh"
#include "kernels/activation.h"
#include "kernels/cuda/gemm/epilogue.cuh"  // stage_box
#include "kernels/cuda/gemm/sm90.cuh"
#include "kernels/cuda/gemm/tile_scheduler.cuh"
#include "kernels/cuda/gemm/trace.cuh"
#include "kernels/cuda/rowwise.cuh"  // DeviceMask

namespace ffn::cuda::gemm {

// Note [Activation warpgroup]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Note [Activation epilogues]' arithmetic (and the hidden dropout, below), moved off the
// warpgroup that runs the MMAs. At GPT-2's fc1 (K = 768) a 128×128 tile's mainloop is about
// 5 us, and the activation of its 16384 outputs (erf GELU: ~30 instructions an element, its
// derivative as well in the backward: ~46) did not fit behind the other warpgroup's
// mainloop when the ping-pong consumers ran it on their accumulators (ActTma: 1.04× GEMM +
// kernel forward, 1.74× backward), nor with one warpgroup of its own (ncu: it issued one
// instruction in three cycles, the consumers waited for its buffers). A CTA here has four
// warpgroups:
//   0  producer: TMA loads of the A/B ring; its thread takes each next unit (Note [Dynamic
//      unit order]) and hands it to the other warps;
//   1  the consumer: every tile's mainloop (128×128, both 64-row halves), then it only
//      rounds the accumulators to T (exactly the GEMM's stored output) into staged[j % 2],
//      in TMA's 64×64 swizzled boxes, and goes on to the next tile (each half is staged
//      beside the other half's or the next tile's MMAs: Note [Overlapped tile boundary]);
//   2, 3  activation warpgroups: warpgroup 2 + c owns the tile's column block c (64
//      columns, both row boxes). Per tile it reads its boxes of staged[j % 2] with 16-byte
//      accesses, computes the outputs, writes them back in place and stores them with TMA;
//      forward: z straight from staged (before hd overwrites a box, its z store has
//      finished reading it), then hd; backward: dz over the staged dhd and db's partial for
//      its 64 columns, with the saved z read from global memory into registers a box ahead
//      (prefetched into L2 two tiles ahead) and hd written from registers. The backward
//      first loaded z by TMA into two more tiles of shared memory; that left its ring 3
//      stages instead of 5, and ncu showed the consumer waiting on its A/B loads for about a
//      third of its time (backward with db1, that version → this one, session 14, separate
//      calls: ffn_d1024 0.367 → 0.351 ms, ffn_d4096 2.20 → 1.82, gpt2 0.231 → 0.237).
// Two warps of activation per SM sub-partition hide each other's latency (gpt2's fc1 on an
// H100, session 14: forward 0.167 ms against 0.192 for GEMM + kernel and 0.117 for the bare
// GEMM, backward with db1 0.237 against 0.285 and 0.117; ffn_d4096's backward 1.82 against
// 2.02 and 1.66; bench/RESULTS-2026-11-24-s14-16.md). At gpt2's K = 768 both directions are
// bound by the activation warpgroups' own work: with them only taking and returning each
// staged tile (a test switch, session 17) the forward and the backward ran at the bare GEMM's
// time (0.118 and 0.120 ms against 0.119 and 0.121), so the consumer's staging costs nothing.
// Handoffs:
//   staged[b] full   named barrier 4 + b over 384 threads: the consumer's threads arrive
//                    (bar.arrive, release) after writing and fencing the tile, the activation
//                    warpgroups sync on it before reading;
//   staged[b] empty  named barrier 6 + b: the activation warpgroups arrive once their
//                    stores have read the buffer (thread 0 of each waits for them, then its
//                    warpgroup syncs; done when tile j + 1 has been staged, so the stores
//                    drained meanwhile), the consumer syncs on it before staging tile j + 2;
//                    used only between two tiles of a buffer, so no arrival is left pending.
// Named barriers rather than mbarriers for the staged tiles: every thread's own arrive orders
// its shared-memory accesses (compute-sanitizer's racecheck follows that; with one thread's
// mbarrier arrive after a warpgroup barrier it reported hazards).
// Registers (setmaxnreg, 512 threads, 128 each at entry): producer 40, consumer 232 (its 128
// accumulators), activation 120. No local memory in any of these kernels (cuobjdump, session
// 16) since the outputs are rounded a pair at a time (pack2) and value_grad's sigmoid takes
// one reciprocal (div_shared); before, the f16 backward spilled 4 (erf) and 22 (tanh) bytes.
// That also drops a reciprocal an element (tanh GELU, SiLU) and some conversions; it
// measured no faster (act bench, session 16, calls 6 and 7: every row within ±5%, as the
// bare GEMMs). Producer 24 and activation 128 spilled nothing by ptxas's count, but
// cuobjdump found local loads/stores in 7 of the 12 kernels and they ran slower (session
// 15, call 2: the backward with dropout at ffn_d1024 0.505 against 0.420 ms, without it at
// gpt2 0.251 against 0.237).
// One exception: the bf16 backward has one 4-byte spill (a store and a load; gelu_erf since
// session 17 with z kept one box instead of two, which still measured 8% faster at gpt2's
// fc1; all three activations since the 16-bit pairs are unpacked with a shift or a mask,
// unpack in core/cuda/types.cuh, which measured 1.5% faster with db: 0.2194/0.2204 ->
// 0.2165/0.2162 ms at gpt2's fc1, H100, session 25). ptxas reports small spills in some
// backward kernels (session 30): in the static unit order 4 bytes in bf16 gelu_erf,
// gelu_tanh and silu, in the dynamic order (Note [Dynamic unit order]) 4 bytes in bf16
// gelu_erf and silu and 12 in f16 gelu_erf; none in the others. The backward's activation
// warps stall mostly on fixed-latency dependencies (ncu, session 17: stall_wait 32%, 46
// instructions an element at gpt2's fc1), so registers freed for more elements in flight
// pay: dz written at once and z one box ahead row by row made the backward at K <= 1024 1-4%
// and then 5-9% faster (bench/RESULTS-2026-11-24-s17-19.md, session 17).
// The hidden dropout: each thread's 16-byte chunk is 8 consecutive elements row·n + col ..
// + 7 with col % 8 == 0, i.e. one Philox block (Note [Dropout RNG]), drawn where the chunk is
// computed and kept as 8 bits; forward hd = act(z + b)·f, backward dz = (dhd·f)·act'(z + b) and
// hd = act(z + b)·f, bias_act_dropout's products in its order, so the same bits; without
// dropout the kernel runs a copy of the loop with neither the draws nor the products. The
// forward's draws made instead by warps 1-3 of the producer's warpgroup (idle but for thread
// 0), a box ahead, handed over as one 32-bit word a thread, measured 2-14% slower in every
// split tried (session 45, bench/RESULTS.md: ffn_d1024's fc1 0.295 -> 0.301-0.345 ms with p =
// 0.1): three warps, one on each of three sub-partitions, draw a tile's 2048 Philox blocks
// slower than the eight activation warps do beside their arithmetic.
// That arithmetic is not hidden behind the MMAs at any K: it slows the consumer's mainloop
// itself (per-tile trace, session 46, bench/RESULTS.md). With the activation warps only taking
// and returning tiles, ffn_d4096's fc1 mainloop takes 32.9k cycles a tile in either direction;
// with their work 33.9k forward and 37.2k backward (41.0k with p = 0.1), though they idle most
// of the tile, while the backward without its z loads and hd stores is within 1.3%. Fewer
// instructions an element is what shortens these kernels, not other warps or memory paths.
// Not all instructions alike: Philox's 32×32→64 products (IMAD.WIDE) are most of what the
// dropout costs the mainloop (session 47, bench/RESULTS.md). With them replaced by as many
// shifts, xors and adds (a diagnostic with wrong bits) ffn_d1024's fc1 forward at p = 0.1 took
// 10.9k cycles a tile instead of 13.1k (9.5k without dropout), though ncu shows the FMA-heavy
// pipe they issue to 19% busy. The same products on the FP64 pipe (two exact DFMAs each) ran
// 19% slower, and as IMAD.HI + IMAD 2% slower; what helped is fewer of them: 18 a block, not 20
// (Note [Philox prefix]: 0-5% on the dropout kernels).
// db: each tile's column sums of the rounded dz over its 128 rows go to a [tiles_m, n] fp32
// workspace in a fixed order (a thread's 8 rows of the two row boxes, lanes ^8 and ^16, then
// warps 0, 1, 2, 3), and reduce_partials (Note
// [Deterministic column sums], stage 2) sums the tile rows in a fixed order: deterministic
// and independent of the grid, no atomics. The outputs are bit-identical to the GEMM followed
// by bias_act_dropout(_backward) with the same DropoutSpec (and, without dropout, to the
// cooperative ActTma's).
// kGlu (backward): db's scratch holds a value and a gate half. Only the GLU's kernel has the
// second half: 1.5 KiB more in every backward left the plain one's ring 4 stages instead of 5
// (launch_act in kernel.cuh sizes the ring from kBytes).
template <bool kBackward, bool kGlu = false, bool kDynamic = true>
struct ActShared {
  static constexpr int kBoxBytes = 64 * 64 * 2;     // one 64×64 box of 16-bit elements
  static constexpr int kTileBytes = 4 * kBoxBytes;  // a 128×128 tile: boxes (rb, cb) at 2rb + cb
  static constexpr int kBuffers = 2;                // staged[2]
  // db: per activation warpgroup [halves][warps 1-3][64] floats, one half (the plain
  // backward) or a value and a gate half (the GLU's).
  static constexpr int kHalves = kGlu ? 2 : 1;
  static constexpr int kRedBytes = kBackward ? 2 * kHalves * 3 * 64 * 4 : 0;
  // Note [Dynamic unit order]: the ring's readers are the consumer's 128 threads and the
  // activation warpgroups' 256; without kDynamic the units come in the static order.
  using Ring = std::conditional_t<kDynamic, UnitRing<384>, StaticUnits>;
  static constexpr int kBytes = kBuffers * kTileBytes + kRedBytes + Ring::kBytes;
  static constexpr int kHandoff = 384;  // the consumer's and both activation warpgroups' threads

  uint8_t* base;  // staged[0], staged[1] (, red)
  // Named barrier ids (0 is __syncthreads): activation warpgroup c's own 2 + c, the handoffs
  // of buffer b 4 + b (full) and 6 + b (empty).
  __device__ static int act_barrier(int c) { return 2 + c; }
  __device__ static int full_barrier(int b) { return 4 + b; }
  __device__ static int empty_barrier(int b) { return 6 + b; }

  // p: kBytes of shared memory, 1024-byte aligned (TMA's 128-byte swizzle).
  __device__ static ActShared carve(uint8_t* p) {
    ActShared s;
    s.base = p;
    return s;
  }
  // Computed, not indexed (an indexed member array would live in local memory).
  __device__ uint8_t* staged(int b) const { return base + b * kTileBytes; }
  // Activation warpgroup c's db scratch: [kHalves][warps 1-3][64 columns] floats.
  __device__ float* red(int c) const {
    return reinterpret_cast<float*>(base + kBuffers * kTileBytes) + c * kHalves * 3 * 64;
  }
  __device__ Ring ring(const TileScheduler& sched) const {
    if constexpr (kDynamic)
      return Ring::carve(base + kBuffers * kTileBytes + kRedBytes);
    else
      return Ring{sched};
  }
};

// The consumer's 64-row block rb (0, 1) of a 128×128 tile, rounded to T, into the
// staged tile's two boxes (2rb, 2rb + 1) in TMA's 128-byte swizzle, with stmatrix (Note
// [Staging with stmatrix]). acc in wgmma.cuh's layout.
// kScale: the thread's rows r and r + 8 (stage_box) scaled by s0 and s1 on the way.
template <class T, int R, bool kScale = false>
__device__ __forceinline__ void stage_block(const float (&acc)[R], uint8_t* tile, int rb,
                                            int wg_thread, float s0 = 1.0f, float s1 = 1.0f) {
  static_assert(R == 64, "a 64×128 accumulator block");
  stage_box<T, R, kScale>(acc, 0, tile + (2 * rb) * (64 * 64 * 2), wg_thread, s0, s1);
  stage_box<T, R, kScale>(acc, 32, tile + (2 * rb + 1) * (64 * 64 * 2), wg_thread, s0, s1);
}

// The activation warpgroups (2 + c for column block c). out1 (TMA) is z (forward) or dz
// (backward); hd goes out through out2 (TMA, forward) or the hd pointer (backward); bias
// optional [n], n % 8 == 0. kGlu (Note [GLU warpgroup]): n is the GLU's output width h, z
// (and the backward's dz) [m, 2h] and bias [2h].
// kRowScale (the GLU's only): the row-scaled kernels (row_scale below), instantiated apart so
// that the others keep their code.
template <class T, Activation A, bool kBackward, bool kGlu = false, bool kDynamic = true,
          bool kRowScale = false>
struct ActWarpgroup {
  static_assert(!kRowScale || kGlu, "the row scale is the GLU kernels'");
  using Shared = ActShared<kBackward, kGlu, kDynamic>;
  const T* bias;
  int m, n;
  // Backward, optional: db's per-tile-row partials, [tiles_m, n] fp32 (Note [Activation
  // warpgroup]: column sums of the rounded dz over a tile's 128 rows).
  float* db_part = nullptr;
  // Backward: the saved z (read) and hd (written), contiguous [m, n] ([m, 2n] z for the GLU),
  // 16-byte aligned.
  const T* z = nullptr;
  T* hd = nullptr;
  // The GLU's backward: dz [m, 2n] ([d value | d gate]), written from registers.
  T* dz = nullptr;

  // The hidden dropout (Note [Activation warpgroup]): f the mask's factor of element
  // row·n + col (Note [Dropout RNG]). Inactive: no Philox and no multiply.
  DeviceMask mask{};
  // kRowScale, [m] (Note [RMSNorm folded into the FFN], layers/ffn_nodes.cpp): z =
  // diag(row_scale)·x·Wᵀ. Forward: the consumer scales each row of its accumulators as it
  // rounds them (gemm_act_kernel); backward: dz is stored scaled by its row's factor (the
  // gradient of x·Wᵀ), without db (sm90_gemm_nn_glu_backward rejects both together).
  const float* row_scale = nullptr;

  // Eight elements' biases from bias + skip + col (skip = n: the GLU's gate half); zeros past
  // n or without a bias.
  __device__ __forceinline__ void load_bias(int col, float (&bv)[8], int skip = 0) const {
    if (bias && col < n) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(bias + skip + col));
      const T* bt = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int e = 0; e < 8; ++e) bv[e] = to_acc(bt[e]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) bv[e] = 0.0f;
    }
  }

  // Bit e set when element i0 + e is kept (i0 % 8 == 0: one Philox block, Note [Dropout RNG]);
  // pre = philox_prefix(mask.keys, mask.off()), taken once a kernel (Note [Philox prefix]).
  __device__ __forceinline__ uint32_t keep_bits(const PhiloxPrefix& pre, int64_t i0) const {
    const U32x4 r = philox_block(mask.keys, pre, static_cast<uint64_t>(i0) >> 3);
    uint32_t keep = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e)
      keep |= static_cast<uint32_t>(((r.v[e >> 1] >> (16 * (e & 1))) & 0xffffu) >= mask.thr) << e;
    return keep;
  }

  // The backward's 16-byte chunk of z or hd at (row, col), or null outside [m, n) (n % 8 == 0).
  __device__ __forceinline__ int64_t chunk(int row, int col) const {
    return row < m && col < n ? static_cast<int64_t>(row) * n + col : -1;
  }

  // Backward: this thread's z chunks of row box rb of unit un's column block c (rows
  // r0 + 16i), zeros outside [m, n).
  __device__ __forceinline__ void load_z(const Unit& un, int c, int rb, int r0, int ch,
                                         uint4 (&zz)[4]) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t at = chunk(128 * un.tm + 64 * rb + r0 + 16 * i, 128 * un.tn + 64 * c + 8 * ch);
      zz[i] = at >= 0 ? __ldg(reinterpret_cast<const uint4*>(z + at)) : uint4{};
    }
  }

  // Activation warpgroup c (0, 1): for every tile of the CTA, its two boxes (rb = 0, 1; cb = c).
  // With or without dropout is decided once per kernel (a warp-uniform branch) between two
  // compiled copies of the loop, so a call without it runs no extra instruction.
  __device__ void run(int c, const Shared& sh, const TileScheduler& sched, const CUtensorMap* out1,
                      const CUtensorMap* out2) const {
    PhiloxPrefix pre{};
    if (mask.active) pre = philox_prefix(mask.keys, mask.off());
    if constexpr (kGlu && kBackward) {
      if (mask.active)
        run_glu_backward<true>(c, sh, sched, pre);
      else
        run_glu_backward<false>(c, sh, sched, pre);
    } else if constexpr (kGlu) {
      if (mask.active)
        run_glu<true>(c, sh, sched, out1, out2, pre);
      else
        run_glu<false>(c, sh, sched, out1, out2, pre);
    } else {
      if (mask.active)
        run_as<true>(c, sh, sched, out1, out2, pre);
      else
        run_as<false>(c, sh, sched, out1, out2, pre);
    }
  }

  // Note [GLU warpgroup]
  // ~~~~~~~~~~~~~~~~~~~~
  // The gated FFN's fc1 (GEGLU, SwiGLU) on the activation warpgroups: z = x·Wᵀ with W [2h, d]
  // ([value | gate] rows), out = dropout((z_v + b_v) ⊙ act(z_g + b_g)), bias_glu_dropout's
  // arithmetic in its order. Tile column block tn holds value columns [64tn, 64tn + 64) in
  // its first 64 columns and the matching gate columns h + [64tn, 64tn + 64) in the other 64:
  // the producer loads W's two 64-row boxes into the two halves of the B tile (the same
  // shared-memory image as one 128-row box, so the mainloop and the consumer are unchanged),
  // and the scheduler has h / 64 column blocks (h % 64 == 0). Activation warpgroup c takes
  // row box c: it stores the box's z value and gate halves with TMA (at columns 64tn and
  // h + 64tn of z), computes its 64 × 64 outputs from both, writes them over the value half
  // once the z stores have read it and stores that box to out at column 64tn. The mask of
  // out's element row·h + col is bias_glu_dropout's, so the outputs are bit-identical to the
  // GEMM followed by bias_glu_dropout.
  template <bool kDrop>
  __device__ __forceinline__ void run_glu(int c, const Shared& sh, const TileScheduler& sched,
                                          const CUtensorMap* zmap, const CUtensorMap* outmap,
                                          const PhiloxPrefix& pre) const {
    using SH = Shared;
    const int t = threadIdx.x % 128;
    const int ch = t % 8, r0 = t / 8;  // chunk ch of rows r0 + 16i of the box
    const int own = SH::act_barrier(c);
    const auto ring = sh.ring(sched);
    int u = ring.at(0);
    for (int j = 0; u >= 0; ++j) {
      const Unit un = sched.unit(u);
      const int next = ring.at(j + 1);  // -1: none
      const int b = j & 1;
      const int row = 128 * un.tm + 64 * c, col = 64 * un.tn;
      uint8_t* vbox = sh.staged(b) + (2 * c) * SH::kBoxBytes;  // value half of row box c
      uint8_t* gbox = vbox + SH::kBoxBytes;                    // gate half
      named_barrier_sync(SH::full_barrier(b), SH::kHandoff);
      if (j > 0) release(c, j - 1, next >= 0);
      if (t == 0) {  // z leaves as the GEMM rounded it
        tma_store_2d(zmap, vbox, col, row);
        tma_store_2d(zmap, gbox, n + col, row);
        tma_store_commit();
      }
      float bv[8], bg[8];
      load_bias(col + 8 * ch, bv);
      load_bias(col + 8 * ch, bg, n);
      uint4 o[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = r0 + 16 * i;
        const int off = r * 128 + ((ch ^ (r & 7)) << 4);
        const uint4 vraw = *reinterpret_cast<const uint4*>(vbox + off);
        const uint4 graw = *reinterpret_cast<const uint4*>(gbox + off);
        const uint32_t* v = reinterpret_cast<const uint32_t*>(&vraw);  // pairs (unpack)
        const uint32_t* g = reinterpret_cast<const uint32_t*>(&graw);
        uint32_t* out = reinterpret_cast<uint32_t*>(&o[i]);
        uint32_t keep = 0;
        if constexpr (kDrop)
          keep = keep_bits(pre, static_cast<int64_t>(row + r) * n + col + 8 * ch);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          float f2[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int e = 2 * q + h;
            f2[h] =
                (unpack<T>(v[q], h) + bv[e]) * act_math::value<T>(unpack<T>(g[q], h) + bg[e], A);
            if constexpr (kDrop) f2[h] *= (keep >> e) & 1u ? mask.scale : 0.0f;
          }
          out[q] = pack2<T>(f2[0], f2[1]);
        }
      }
      if (t == 0) tma_store_wait_read<0>();  // the z stores have read the value half
      named_barrier_sync(own, 128);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = r0 + 16 * i;
        *reinterpret_cast<uint4*>(vbox + r * 128 + ((ch ^ (r & 7)) << 4)) = o[i];
      }
      fence_proxy_async_smem();
      named_barrier_sync(own, 128);
      if (t == 0) {
        tma_store_2d(outmap, vbox, col, row);
        tma_store_commit();
      }
      u = next;
    }
    if (t == 0) tma_store_wait_all();
  }

  // Note [GLU warpgroup]'s backward: the dhd = dz2·W2 product's tile (128 rows × 128 of h's
  // columns, an ordinary tiling) staged as in the plain backward; activation warpgroup c takes
  // column block c of both row boxes and writes dz's two halves and the recomputed out (dW2's
  // input) from registers: dv = (dhd·f)·act(g), dg = ((dhd·f)·v)·act'(g), out = (v·act(g))·f
  // with v = z_v + b_v, g = z_g + b_g, bias_glu_dropout_backward's arithmetic in its order, so
  // the same bits. A thread's 8 rows go two at a time, the saved z's value and gate chunks
  // loaded two rows ahead (across tiles too; the tile after the next prefetched into L2): with
  // all of a box's z in registers, as the plain backward holds it, ptxas spilled 20-680 bytes.
  // db's partials cover both halves ([tiles_m, 2h], value columns then gate columns); their
  // scratch's gate half leaves this kernel's ring 4 stages, the plain backward's 5.
  // Where the time goes (H100, session 16, geglu_d1024's dhd: 0.457 ms against 0.225 for the
  // bare GEMM): with the z loads and the stores switched off it still took 0.34-0.37, so the
  // bound is the activation warps' arithmetic (ncu: ~64 instructions an element over all
  // warps, 2 activation warps per scheduler, 0.72 eligible warps per cycle, 39% of issue slots
  // busy) more than memory; rows one or four at a time, loads one row ahead and streaming
  // cache hints measured no better.
  // kRowScale: dv and dg of row r come out multiplied by row_scale[r], which is folded into s
  // (with dropout into the kept elements' factor: no multiply an element more), loaded with
  // the row's z chunks two rows ahead.
  template <bool kDrop>
  __device__ __forceinline__ void run_glu_backward(int c, const Shared& sh,
                                                   const TileScheduler& sched,
                                                   const PhiloxPrefix& pre) const {
    using SH = Shared;
    const int t = threadIdx.x % 128;
    const int ch = t % 8, r0 = t / 8;  // chunk ch of rows r0 + 16i of each box
    // z's value and gate chunks of the row computed next (c) and of the one after it (n1);
    // row k of a tile is row r0 + 64 (k / 4) + 16 (k % 4) of it.
    uint4 cv{}, cg{}, n1v{}, n1g{};
    float cs = 1.0f, n1s = 1.0f;  // kRowScale: the same rows' scales
    const auto ring = sh.ring(sched);
    int u = ring.at(0);
    if (u >= 0) {
      const Unit first = sched.unit(u);
      load_zglu(first, c, r0, ch, cv, cg);
      load_zglu(first, c, r0 + 16, ch, n1v, n1g);
      if constexpr (kRowScale) {
        cs = load_row_scale(first, r0);
        n1s = load_row_scale(first, r0 + 16);
      }
    }
    for (int j = 0; u >= 0; ++j) {
      const Unit un = sched.unit(u);
      const int b = j & 1;
      const int rows = 128 * un.tm, col = 128 * un.tn + 64 * c;  // the column block's
      const int next = ring.at(j + 1);  // -1: none
      const bool has_next = next >= 0;
      const Unit nun = has_next ? sched.unit(next) : un;
      const auto prefetch_ahead = [&] {  // the z tile after the next one into L2 (if taken
        const int ahead = has_next ? ring.peek(j + 2) : -1;  // yet): row t of both halves
        if (ahead >= 0) {
          const Unit far = sched.unit(ahead);
          const int64_t at = glu_chunk(128 * far.tm + t, 128 * far.tn + 64 * c);
          if (at >= 0) {
            asm volatile("prefetch.global.L2 [%0];" ::"l"(z + at));
            asm volatile("prefetch.global.L2 [%0];" ::"l"(z + at + n));
          }
        }
      };
      if constexpr (!kDynamic) prefetch_ahead();  // as run_as: before the wait when known
      named_barrier_sync(SH::full_barrier(b), SH::kHandoff);
      if constexpr (kDynamic) prefetch_ahead();
      if (j > 0) release(c, j - 1, has_next);
      float sv[8], sg[8];  // this thread's column sums of dv and dg
#pragma unroll
      for (int e = 0; e < 8; ++e) sv[e] = sg[e] = 0.0f;
      float bv[8], bg[8];
      load_bias(col + 8 * ch, bv);
      load_bias(col + 8 * ch, bg, n);
#pragma unroll 2
      for (int k = 0; k < 8; ++k) {  // row box k / 4, row r0 + 16 (k % 4) of it
        const int rb = k / 4, r = r0 + 16 * (k % 4), row = rows + 64 * rb + r;
        uint4 n2v{}, n2g{};  // two rows on: this tile's, else the next tile's first two
        float n2s = 1.0f;
        const int k2 = (k + 2) % 8;
        if (k < 6 || has_next) {
          load_zglu(k < 6 ? un : nun, c, r0 + 64 * (k2 / 4) + 16 * (k2 % 4), ch, n2v, n2g);
          if constexpr (kRowScale)
            n2s = load_row_scale(k < 6 ? un : nun, r0 + 64 * (k2 / 4) + 16 * (k2 % 4));
        }
        const uint8_t* box = sh.staged(b) + (2 * rb + c) * SH::kBoxBytes;
        const uint4 draw = *reinterpret_cast<const uint4*>(box + r * 128 + ((ch ^ (r & 7)) << 4));
        const uint32_t* dh = reinterpret_cast<const uint32_t*>(&draw);  // pairs (unpack)
        const uint32_t* v = reinterpret_cast<const uint32_t*>(&cv);
        const uint32_t* g = reinterpret_cast<const uint32_t*>(&cg);
        uint4 ov, og, oh;
        uint32_t* pv = reinterpret_cast<uint32_t*>(&ov);
        uint32_t* pg = reinterpret_cast<uint32_t*>(&og);
        uint32_t* ph = reinterpret_cast<uint32_t*>(&oh);
        uint32_t keep = 0;
        if constexpr (kDrop) keep = keep_bits(pre, static_cast<int64_t>(row) * n + col + 8 * ch);
        const float fs = kDrop ? mask.scale * cs : cs;  // kRowScale: a kept element's factor of s
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // element pairs: one packed rounding per output pair
          float fv[2], fg[2], fh[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int e = 2 * q + h;
            const float val = unpack<T>(v[q], h) + bv[e], gate = unpack<T>(g[q], h) + bg[e];
            float a, da, s = unpack<T>(dh[q], h), o;
            act_math::value_grad<T>(gate, A, a, da);
            o = val * a;
            if constexpr (kDrop) {
              const bool kept = (keep >> e) & 1u;
              const float f = kept ? mask.scale : 0.0f;
              s *= kRowScale ? (kept ? fs : 0.0f) : f;
              o *= f;
            } else if constexpr (kRowScale) {
              s *= fs;
            }
            fv[h] = s * a;
            fg[h] = s * val * da;
            fh[h] = o;
          }
          pv[q] = pack2<T>(fv[0], fv[1]);
          pg[q] = pack2<T>(fg[0], fg[1]);
          ph[q] = pack2<T>(fh[0], fh[1]);
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // db sums the rounded values
            sv[2 * q + h] += unpack<T>(pv[q], h);
            sg[2 * q + h] += unpack<T>(pg[q], h);
          }
        }
        const int64_t at = glu_chunk(row, col + 8 * ch);
        if (at >= 0) {
          *reinterpret_cast<uint4*>(dz + at) = ov;
          *reinterpret_cast<uint4*>(dz + at + n) = og;
          *reinterpret_cast<uint4*>(hd + (at - static_cast<int64_t>(row) * n)) = oh;
        }
        cv = n1v;
        cg = n1g;
        n1v = n2v;
        n1g = n2g;
        if constexpr (kRowScale) cs = n1s, n1s = n2s;
      }
      if (db_part) column_sums(c, sh, sv, sg, un.tm, col);
      u = next;
    }
  }

  // The GLU backward's 16-byte chunk of z's (and dz's) value half at (row, col), or -1 outside
  // [m, n); the gate half's is n further, out's (row·n + col) row·n less.
  __device__ __forceinline__ int64_t glu_chunk(int row, int col) const {
    return row < m && col < n ? static_cast<int64_t>(row) * 2 * n + col : -1;
  }

  // The GLU backward's row scale of row r (0-127) of unit un (0 past m).
  __device__ __forceinline__ float load_row_scale(const Unit& un, int r) const {
    const int row = 128 * un.tm + r;
    return row < m ? __ldg(row_scale + row) : 0.0f;
  }

  // The GLU backward: this thread's z value and gate chunks of row r (0-127) of unit un's
  // column block c, zeros outside [m, n).
  __device__ __forceinline__ void load_zglu(const Unit& un, int c, int r, int ch, uint4& zv,
                                            uint4& zg) const {
    const int64_t at = glu_chunk(128 * un.tm + r, 128 * un.tn + 64 * c + 8 * ch);
    zv = at >= 0 ? __ldg(reinterpret_cast<const uint4*>(z + at)) : uint4{};
    zg = at >= 0 ? __ldg(reinterpret_cast<const uint4*>(z + at + n)) : uint4{};
  }

  // The GLU backward's db partials of tile row tm for column block col's 64 columns: each
  // thread's sums over its rows, then over the lanes with the same chunk (lane ^ 8, ^ 16),
  // then warps 1-3 leave theirs in shared memory for warp 0, which adds them in warp order
  // and writes the value columns' sums at col and the gate columns' at n + col. The scratch
  // is next written after the next tile's release(), whose warpgroup barrier follows these
  // reads.
  __device__ __forceinline__ void column_sums(int c, const Shared& sh, float (&sv)[8],
                                              float (&sg)[8], int tm, int col) const {
    const int t = threadIdx.x % 128, ch = t % 8;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      sv[e] += __shfl_xor_sync(0xffffffffu, sv[e], 8);
      sv[e] += __shfl_xor_sync(0xffffffffu, sv[e], 16);
      sg[e] += __shfl_xor_sync(0xffffffffu, sg[e], 8);
      sg[e] += __shfl_xor_sync(0xffffffffu, sg[e], 16);
    }
    float* red = sh.red(c);
    if (t >= 32 && t % 32 < 8) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        red[(t / 32 - 1) * 64 + 8 * ch + e] = sv[e];
        red[192 + (t / 32 - 1) * 64 + 8 * ch + e] = sg[e];
      }
    }
    named_barrier_sync(Shared::act_barrier(c), 128);
    if (t < 8 && col + 8 * t < n) {
      const float* rv = red + 8 * t;
      const float* rg = red + 192 + 8 * t;
      float v[8], w[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        v[e] = ((sv[e] + rv[e]) + rv[64 + e]) + rv[128 + e];
        w[e] = ((sg[e] + rg[e]) + rg[64 + e]) + rg[128 + e];
      }
      float4* dv =
          reinterpret_cast<float4*>(db_part + static_cast<int64_t>(tm) * 2 * n + col + 8 * t);
      float4* dg = dv + n / 4;
      dv[0] = make_float4(v[0], v[1], v[2], v[3]);
      dv[1] = make_float4(v[4], v[5], v[6], v[7]);
      dg[0] = make_float4(w[0], w[1], w[2], w[3]);
      dg[1] = make_float4(w[4], w[5], w[6], w[7]);
    }
  }
  template <bool kDrop>
  __device__ __forceinline__ void run_as(int c, const Shared& sh, const TileScheduler& sched,
                                         const CUtensorMap* out1, const CUtensorMap* out2,
                                         const PhiloxPrefix& pre) const {
    using SH = Shared;
    const int t = threadIdx.x % 128;
    const int ch = t % 8, r0 = t / 8;  // chunk ch of rows r0 + 16i of each box
    const int own = SH::act_barrier(c);
    // Backward: z of the box being computed in registers, each row replaced by the same row
    // of the next box (box 1 of this tile, then box 0 of the next one) as soon as it is
    // computed, so each load has a box's work to land (the activation warpgroups are the
    // bound at small K, where a load waited for in place would add its whole latency to every
    // tile) while only one box's z is live (two boxes' until session 17: 16 more registers).
    uint4 zc[4];
    const auto ring = sh.ring(sched);
    int u = ring.at(0);
    if constexpr (kBackward) {
      if (u >= 0) load_z(sched.unit(u), c, 0, r0, ch, zc);
    }
    for (int j = 0; u >= 0; ++j) {
      const Unit un = sched.unit(u);
      const int next = ring.at(j + 1);  // -1: none
      const int b = j & 1;
      const int rows = 128 * un.tm, col = 128 * un.tn + 64 * c;  // the column block's
      uint8_t* st = sh.staged(b);
      const auto prefetch_ahead = [&] {
        if constexpr (kBackward) {  // the z tile after the next one into L2, a row per thread
          const int ahead = next >= 0 ? ring.peek(j + 2) : -1;
          if (ahead >= 0) {
            const Unit far = sched.unit(ahead);
            const int64_t at = chunk(128 * far.tm + t, 128 * far.tn + 64 * c);
            if (at >= 0) asm volatile("prefetch.global.L2 [%0];" ::"l"(z + at));
          }
        }
      };
      // The static order knows the tile ahead at once: its prefetch goes out before the wait
      // for the staged tile. The ring's entry is normally there once the tile is staged (the
      // producer takes each unit before loading the one before).
      if constexpr (!kDynamic) prefetch_ahead();
      if (t == 0) trace::mark(4 + 4 * c, j);
      named_barrier_sync(SH::full_barrier(b), SH::kHandoff);
      if (t == 0) trace::mark(5 + 4 * c, j);
      if constexpr (kDynamic) prefetch_ahead();
      if (j > 0) release(c, j - 1, next >= 0);
      if (t == 0) trace::mark(6 + 4 * c, j);
      if (!kBackward && t == 0) {  // z leaves as the GEMM rounded it, one group per box
#pragma unroll
        for (int rb = 0; rb < 2; ++rb) {
          tma_store_2d(out1, st + (2 * rb + c) * SH::kBoxBytes, col, rows + 64 * rb);
          tma_store_commit();
        }
      }
      float bv[8];
      load_bias(col + 8 * ch, bv);
      float dsum[8];  // backward: this thread's column sums over the block's rows
#pragma unroll
      for (int e = 0; e < 8; ++e) dsum[e] = 0.0f;
#pragma unroll 1
      for (int rb = 0; rb < 2; ++rb) {
        uint8_t* box = st + (2 * rb + c) * SH::kBoxBytes;
        uint4 o1[4], o2[4];
        // Backward: the box whose z replaces this one's, row by row (its row i at zrow + 16i).
        const bool znext = rb == 0 || next >= 0;
        const Unit zun = rb == 0 || !znext ? un : sched.unit(next);
        const int zrow = 128 * zun.tm + 64 * (rb ^ 1) + r0, zcol = 128 * zun.tn + 64 * c + 8 * ch;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = r0 + 16 * i;
          const int off = r * 128 + ((ch ^ (r & 7)) << 4);
          const uint4 graw = *reinterpret_cast<const uint4*>(box + off);
          const uint32_t* g = reinterpret_cast<const uint32_t*>(&graw);  // pairs (unpack)
          uint32_t* p1 = reinterpret_cast<uint32_t*>(&o1[i]);
          uint32_t* p2 = reinterpret_cast<uint32_t*>(&o2[i]);
          // The mask's eight keep bits (one register, not eight float factors, which made the
          // f16 backward spill more); the factor is scale or 0, as DeviceMask::factors has it.
          uint32_t keep = 0;
          if constexpr (kDrop)
            keep = keep_bits(pre, static_cast<int64_t>(rows + 64 * rb + r) * n + col + 8 * ch);
          if constexpr (kBackward) {
            const uint4 zraw = zc[i];
            if (znext) {
              const int64_t zat = chunk(zrow + 16 * i, zcol);
              zc[i] = zat >= 0 ? __ldg(reinterpret_cast<const uint4*>(z + zat)) : uint4{};
            }
            const uint32_t* zt = reinterpret_cast<const uint32_t*>(&zraw);
#pragma unroll
            for (int q = 0; q < 4; ++q) {  // element pairs: one packed rounding per output pair
              float f1[2], f2[2];
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const int e = 2 * q + h;
                float val, d, gf = unpack<T>(g[q], h);
                act_math::value_grad<T>(unpack<T>(zt[q], h) + bv[e], A, val, d);
                if constexpr (kDrop) {  // bias_act_dropout_backward's (g·f)·d and val·f
                  const float f = (keep >> e) & 1u ? mask.scale : 0.0f;
                  gf *= f;
                  val *= f;
                }
                f1[h] = gf * d;
                f2[h] = val;
              }
              p1[q] = pack2<T>(f1[0], f1[1]);
              p2[q] = pack2<T>(f2[0], f2[1]);
              dsum[2 * q] += unpack<T>(p1[q], 0);  // db sums the rounded values
              dsum[2 * q + 1] += unpack<T>(p1[q], 1);
            }
            const int64_t at = chunk(rows + 64 * rb + r, col + 8 * ch);
            if (at >= 0) *reinterpret_cast<uint4*>(hd + at) = o2[i];  // hd straight to memory
            // dz over the dhd chunk only this thread has read, at once: the four rows' dz no
            // longer stay live across the loop, which leaves registers for more elements in
            // flight (the backward at K <= 1024 1-4% faster, session 17).
            *reinterpret_cast<uint4*>(box + off) = o1[i];
          } else {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              float f2[2];
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const int e = 2 * q + h;
                f2[h] = act_math::value<T>(unpack<T>(g[q], h) + bv[e], A);
                if constexpr (kDrop) f2[h] *= (keep >> e) & 1u ? mask.scale : 0.0f;
              }
              p2[q] = pack2<T>(f2[0], f2[1]);
            }
          }
        }
        if constexpr (!kBackward) {
          // Box rb's z store has read it: of the groups committed so far (z of rows 0 and 64,
          // then hd of rows 0 when rb = 1) at most the one after it may be pending.
          if (t == 0) tma_store_wait_read<1>();
          named_barrier_sync(own, 128);
        } else if (db_part && rb == 1) {
          // The block's sums: over the lanes with the same chunk (lane ^ 8, ^ 16: rows r0 of
          // the warp), then warps 1-3 leave theirs in shared memory for warp 0, which adds
          // them after the barrier below, always in warp order.
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            dsum[e] += __shfl_xor_sync(0xffffffffu, dsum[e], 8);
            dsum[e] += __shfl_xor_sync(0xffffffffu, dsum[e], 16);
          }
          if (t >= 32 && t % 32 < 8) {
#pragma unroll
            for (int e = 0; e < 8; ++e) sh.red(c)[(t / 32 - 1) * 64 + 8 * ch + e] = dsum[e];
          }
        }
        if constexpr (!kBackward) {  // hd over the staged z, now that z's store has read it
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int r = r0 + 16 * i;
            *reinterpret_cast<uint4*>(box + r * 128 + ((ch ^ (r & 7)) << 4)) = o2[i];
          }
        }
        fence_proxy_async_smem();
        named_barrier_sync(own, 128);
        if (kBackward && db_part && rb == 1 && t < 8 && col + 8 * t < n) {
          const float* red = sh.red(c) + 8 * t;
          float v[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) v[e] = ((dsum[e] + red[e]) + red[64 + e]) + red[128 + e];
          float4* dst =
              reinterpret_cast<float4*>(db_part + static_cast<int64_t>(un.tm) * n + col + 8 * t);
          dst[0] = make_float4(v[0], v[1], v[2], v[3]);
          dst[1] = make_float4(v[4], v[5], v[6], v[7]);
        }
        if (t == 0) {
          if constexpr (kBackward) {
            tma_store_2d(out1, box, col, rows + 64 * rb);
          } else {
            tma_store_2d(out2, box, col, rows + 64 * rb);
          }
          tma_store_commit();
        }
      }
      if (t == 0) trace::mark(7 + 4 * c, j);
      u = next;
    }
    if (threadIdx.x % 128 == 0) tma_store_wait_all();
  }

  // Tile j's buffers go back once its stores have read them. Called when tile j + 1 has been
  // staged: the stores had the wait for it to drain, and the consumer needs the buffer only
  // for tile j + 2, if there is one (more: tile j + 2 exists).
  __device__ void release(int c, int j, bool more) const {
    using SH = Shared;
    const int b = j & 1;
    if (threadIdx.x % 128 == 0) tma_store_wait_read<0>();
    named_barrier_sync(SH::act_barrier(c), 128);
    if (more) named_barrier_arrive(SH::empty_barrier(b), SH::kHandoff);  // staging j + 2 there
  }
};

}  // namespace ffn::cuda::gemm
