// kernels/cuda/gemm/mainloop.cuh — the Hopper GEMM's pipeline for C = A·B with A an M×K and
// B a K×N operand, each either K-major (rows of K elements: A [M, K] row-major, or B stored
// as [N, K], i.e. the Wᵀ of x·Wᵀ) or MN-major (rows of M or N elements: A stored as [K, M],
// i.e. the dyᵀ of dyᵀ·x; B stored [K, N], the W of dy·W). A ring of kStages shared-memory
// stages holds a 128×64 A tile and a BN×64 B tile each, written by TMA with 128-byte
// swizzling: a K-major tile as one box of 64-element rows, an MN-major one as boxes of 64 K
// rows × 64 M/N elements, 8 KiB apart (sm90.cuh's two descriptors).
//
// Note [Hopper GEMM pipeline]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Warpgroup 0 is the producer (one thread issues TMA loads; setmaxnreg gives its registers
// away), warpgroups 1 and 2 are consumers, each owning 64 rows of the 128-row tile with the
// accumulators of a 64×BN block in registers. Per stage s two mbarriers:
//   full[s]   count 1: the producer's arrive.expect_tx plus the TMA bytes complete it;
//   empty[s]  count 8: lane 0 of each consumer warp arrives once the wgmmas reading stage s
//             have completed (wgmma.wait_group), so the producer may overwrite it.
// Phases alternate; a fresh barrier's "previous" phase counts as complete, so the producer's
// first pass over the ring does not wait. Consumers keep one k-block of wgmmas in flight
// (wait_group 1) and release the stage before it. Both roles walk the same tile sequence
// (TileScheduler), so the producer runs ahead into the next tile while the consumers finish
// the epilogue of the current one. A unit (TileScheduler) is a tile or, with split-K, a
// range of its K blocks (Note [Split-K]); the consumers accumulate only that range.
//
// Note [Operand multicast]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A 128×128 tile reads 32 KiB of A and B per k-block (64 FLOP a byte); all SMs doing so at
// the tensor cores' rate ask L2 for ~14 TB/s. Per-tile timestamps of the activation GEMM
// (kernels/cuda/gemm/trace.cuh, H100, session 31) showed its k-blocks issued one every ~600
// cycles (85% of the tensor rate) and a stage's load taking ~3000 cycles from the producer's
// issue to the consumer's use: the ring's 5 stages (2560 cycles of MMAs) did not cover the
// latency under that traffic. With kCluster = 2 two CTAs of a cluster compute tiles (tm, 2q)
// and (tm, 2q + 1), which share A's rows: each loads one 64-row half of the A tile and
// multicasts it into both CTAs' stage (the same offsets, so the two halves make the same
// swizzled image as one 128-row box), and loads its own B; L2 serves 24 KiB a k-block
// instead of 32. Each CTA's full[s] still expects the whole stage (its own half, the
// partner's half and its B, in any order), and the partner writes into this CTA's stage s,
// so a stage is free only when both CTAs' consumers have read it: empty[s] counts the
// consumer warps of both (each lane 0 arrives on its own barrier and, across the cluster,
// on the partner's). Both CTAs walk the same units (TileScheduler::cluster) with the same
// k-blocks, so their rings stay in step. A (K-major here) must be loaded through a map of
// 64-row boxes; B is unchanged. The partner's arrive is at CTA scope like the local one: with
// .release.cluster each arriving lane stalled ~1000 cycles, and the kernels ran 1.6x slower
// than without multicast (session 31, call 3). Where it runs: the activation kernels as
// act_multicast (kernel.cuh) says, which has the measurements; the plain kernels wherever A is
// K-major and the column tiles pair up (launch_paired), where it made the ping-pong kernel
// 10-15% and the cooperative one 0-8% faster (ffn-bench --gemm, session 31).
// Sharing B (SHARE_B; TileScheduler::share_b): the cooperative kernel's 128×256 tile reads 16
// KiB of A and 32 of B a k-block, so sharing A left 40 KiB from L2 where sharing B leaves 32
// (cuBLASLt's kernels on the same shapes pair their CTAs along the larger operand the same
// way: nvjet ..._128x256_..._2x1_v, ..._256x128_..._1x2_h). The pair is then tiles (2p, tn)
// and (2p + 1, tn); each CTA loads its whole A tile and half of B's, K-major as one box of
// BN / 2 rows, MN-major as BN / 128 of its 64-column boxes (so not at BN = 192, whose three
// boxes do not halve), and multicasts that half. Any A layout: the weight gradients' MN-major
// A get clusters this way. Measured (H200, session 48, bench/RESULTS.md): L2 traffic 16% less
// (ncu lts__t_bytes, ffn_d1024's fc1 1.59 -> 1.34 GB, the LM head's forward 14.5-15.8 ->
// 13.2), the SM clock 2% higher and the kernels 2% shorter in isolation (ncu, clocks free);
// back to back 1-3% shorter at most products with K <= 1024, elsewhere within the noise (3%).
#pragma once

#include "kernels/cuda/gemm/sm90.cuh"
#include "kernels/cuda/gemm/tile_scheduler.cuh"
#include "kernels/cuda/gemm/trace.cuh"
#include "kernels/cuda/gemm/wgmma.cuh"

namespace ffn::cuda::gemm {

template <class T, int BN_, int STAGES, int ARRIVALS = 8, bool A_MN = false, bool B_MN = false,
          int CLUSTER = 1, bool SHARE_B = false>
struct Mainloop {
  static constexpr int BM = 128, BN = BN_, BK = 64, kStages = STAGES;
  // Note [Operand multicast]: 2 shares A's tile (SHARE_B: B's) between the cluster's two CTAs.
  static constexpr int kCluster = CLUSTER;
  static constexpr bool kShareB = SHARE_B;
  static_assert(kCluster == 1 || (kCluster == 2 && (kShareB || !A_MN)),
                "A multicast needs a K-major A");
  static_assert(!kShareB || (kCluster == 2 && (!B_MN || BN % 128 == 0)),
                "B is shared in clusters of two, an MN-major B in whole 64-column boxes each");
  static constexpr int kBoxBytes = 64 * BK * 2;  // one MN-major box: 64 K rows × 128 bytes
  // Descriptor increments (16-byte units) per 16 elements of K: 32 bytes along a K-major
  // row, 16 rows of 128 bytes in an MN-major box.
  static constexpr uint64_t kStepA = A_MN ? 128 : 2, kStepB = B_MN ? 128 : 2;
  static constexpr int kABytes = BM * BK * 2, kBBytes = BN * BK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kConsumerWarps = ARRIVALS;  // warps that release a stage
  // Shared memory: the stages (1024-byte aligned for the 128B swizzle), the epilogue's
  // scratch (1024-byte aligned too: TMA stores read swizzled boxes from it), the barriers.
  static constexpr int smem_bytes(int scratch) {
    return kStages * kStageBytes + scratch + (2 * kStages + 2) * 8 + 1024;
  }

  uint8_t* tiles;    // kStages × (A tile, B tile)
  uint8_t* scratch;  // the epilogue's
  uint64_t* full;
  uint64_t* empty;
  uint64_t* order;  // ping-pong: order[w] completes when warpgroup w's mainloop of a tile is done

  __device__ static Mainloop carve(uint8_t* smem_raw, int scratch_bytes) {
    Mainloop ml;
    const uint32_t base = smem_addr(smem_raw);
    ml.tiles = smem_raw + ((1024 - (base & 1023)) & 1023);
    ml.scratch = ml.tiles + kStages * kStageBytes;
    ml.full = reinterpret_cast<uint64_t*>(ml.scratch + scratch_bytes);
    ml.empty = ml.full + kStages;
    ml.order = ml.empty + kStages;
    return ml;
  }
  __device__ uint8_t* a_tile(int s) const { return tiles + s * kStageBytes; }
  __device__ uint8_t* b_tile(int s) const { return tiles + s * kStageBytes + kABytes; }
  // Rows [64h, 64h + 64) of stage s's A tile: 64 rows down a K-major tile, or its h-th box.
  __device__ uint64_t a_desc(int s, int h) const {
    if constexpr (A_MN)
      return smem_desc_mn128(a_tile(s) + h * kBoxBytes, kBoxBytes);
    else
      return smem_desc_k128(a_tile(s) + h * 64 * 128);
  }
  __device__ uint64_t b_desc(int s) const {
    if constexpr (B_MN)
      return smem_desc_mn128(b_tile(s), kBoxBytes);
    else
      return smem_desc_k128(b_tile(s));
  }
  // Note [Stage descriptors]: stage s's descriptors are stage 0's plus s·kStageStep. The
  // start-address field (bits 0-13, in 16-byte units) holds every shared-memory address
  // (< 256 KiB) without a carry into the next field, so the consumers build stage 0's once and
  // add a multiple per k-block, where they rebuilt them from the address (mask, shift, flags,
  // moves into uniform registers: ~30 of the 63 instructions a k-block and warp at gpt2's fc1,
  // ncu source page, session 37). Measured (H100, session 38, ncu, gpt2's fc1 forward): 15.27M
  // -> 11.37M warp instructions, 188.7k -> 189.7k cycles; the forward GEMM table and the
  // activation kernels the same within their 2-3% noise. The instructions were not the bound.
  static constexpr uint64_t kStageStep = kStageBytes >> 4;
  struct Descs {
    uint64_t a[2], b;  // stage 0's: A's 64-row halves and B
    __device__ uint64_t at(int s, int h) const { return a[h] + kStageStep * s; }
    __device__ uint64_t bt(int s) const { return b + kStageStep * s; }
  };
  __device__ Descs descs() const { return {{a_desc(0, 0), a_desc(0, 1)}, b_desc(0)}; }
  // One operand's tile for k-block kb: rows [r0, r0 + ROWS) of M or N.
  template <bool MN, int ROWS>
  __device__ static void load(uint8_t* dst, const CUtensorMap* map, uint64_t* bar, int kb, int r0) {
    if constexpr (MN) {
#pragma unroll
      for (int j = 0; j < ROWS / 64; ++j)
        tma_load_2d(dst + j * kBoxBytes, map, bar, r0 + 64 * j, kb * BK);
    } else {
      tma_load_2d(dst, map, bar, kb * BK, r0);
    }
  }

  __device__ void init_barriers() const {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps * kCluster);
    }
    mbar_init(&order[0], 1);
    mbar_init(&order[1], 1);
    fence_barrier_init();
  }

  // The producer thread: every k-block of every unit of this CTA, in order. glu_h > 0 (K-major
  // B with BN = 128, its map's box 64 rows; Note [GLU warpgroup]): column block tn's B tile is
  // rows [64tn, 64tn + 64) and glu_h + [64tn, 64tn + 64) of B.
  __device__ void produce(const CUtensorMap* ta, const CUtensorMap* tb, const TileScheduler& sched,
                          int glu_h = 0) const {
    int stage = 0;
    uint32_t phase = 0;
    for (int u = sched.first_unit(); u < sched.num_units(); u += sched.unit_stride())
      produce_unit(ta, tb, sched.unit(u), stage, phase, glu_h);
  }
  // Unit w's k-blocks, from ring position (stage, phase) on.
  __device__ void produce_unit(const CUtensorMap* ta, const CUtensorMap* tb, const Unit& w,
                               int& stage, uint32_t& phase, int glu_h = 0, int tj = -1) const {
    for (int kb = w.kb0; kb < w.kb0 + w.kbs; ++kb) {
      mbar_wait(&empty[stage], phase ^ 1);
      if (tj >= 0 && kb == w.kb0) trace::mark(14, tj);
      if (tj >= 0 && kb == w.kb0 + w.kbs - 1) trace::mark(15, tj);
      mbar_arrive_expect_tx(&full[stage], kStageBytes);
      if constexpr (kShareB) {  // all of its own A, and this CTA's half of B into both CTAs
        const int rank = static_cast<int>(cluster_ctarank());
        load<A_MN, BM>(a_tile(stage), ta, &full[stage], kb, w.tm * BM);
        if constexpr (B_MN) {
#pragma unroll
          for (int j = rank * (BN / 128); j < (rank + 1) * (BN / 128); ++j)  // BN / 128 boxes
            tma_load_2d_multicast(b_tile(stage) + j * kBoxBytes, tb, &full[stage],
                                  w.tn * BN + 64 * j, kb * BK, 0x3);
        } else {
          tma_load_2d_multicast(b_tile(stage) + rank * (BN / 2) * BK * 2, tb, &full[stage], kb * BK,
                                w.tn * BN + rank * (BN / 2), 0x3);
        }
        if (++stage == kStages) stage = 0, phase ^= 1;
        continue;
      }
      if constexpr (kCluster == 2) {  // this CTA's half of A, into both CTAs
        const uint32_t rank = cluster_ctarank();
        tma_load_2d_multicast(a_tile(stage) + rank * (BM / 2) * BK * 2, ta, &full[stage], kb * BK,
                              w.tm * BM + static_cast<int>(rank) * (BM / 2), 0x3);
      } else {
        load<A_MN, BM>(a_tile(stage), ta, &full[stage], kb, w.tm * BM);
      }
      if constexpr (!B_MN && BN == 128) {
        if (glu_h > 0) {
          tma_load_2d(b_tile(stage), tb, &full[stage], kb * BK, w.tn * 64);
          tma_load_2d(b_tile(stage) + 64 * BK * 2, tb, &full[stage], kb * BK, glu_h + w.tn * 64);
          if (++stage == kStages) stage = 0, phase ^= 1;
          continue;
        }
      }
      load<B_MN, BN>(b_tile(stage), tb, &full[stage], kb, w.tn * BN);
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
  }

  // A consumer warp's lane 0: the warp's MMAs have read stage s (with multicast, in both
  // CTAs' barriers: the partner loads into this CTA's stage too).
  __device__ __forceinline__ void release(int s) const {
    mbar_arrive(&empty[s]);
    if constexpr (kCluster == 2) mbar_arrive_cluster(&empty[s], cluster_ctarank() ^ 1u);
  }

  // One consumer warpgroup (c = 0 or 1) accumulates rows [64c, 64c + 64) of a tile.
  template <int R>
  __device__ void consume(float (&acc)[R], int c, int k_blocks, int& stage,
                          uint32_t& phase) const {
    using Mma = Wgmma<BN, T>;
    static_assert(Mma::kRegs == R, "accumulator size");
    const int lane = threadIdx.x % 32;
    // c broadcast from lane 0, so that ptxas may keep the descriptors in uniform registers.
    const int cu = __shfl_sync(0xffffffffu, c, 0);
    const uint64_t da0 = a_desc(0, cu), db0 = b_desc(0);
    int prev = -1;
    for (int kb = 0; kb < k_blocks; ++kb) {
      mbar_wait(&full[stage], phase);
      const uint64_t da = da0 + kStageStep * stage, db = db0 + kStageStep * stage;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
        Mma::template mma<A_MN, B_MN>(acc, da + kStepA * kk, db + kStepB * kk,
                                      (kb > 0 || kk > 0) ? 1 : 0);
      wgmma_commit();
      if (prev >= 0) {
        wgmma_wait<1>();
        if (lane == 0) release(prev);
      }
      prev = stage;
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    if (prev >= 0 && lane == 0) release(prev);
  }

  // Both 64-row halves' MMAs of stage s, interleaved a k16 step at a time (acc0: rows [0, 64),
  // acc1: [64, 128)); `first`: the tile's first k-block, whose first step overwrites them.
  template <int R>
  __device__ __forceinline__ void mma_both(float (&acc0)[R], float (&acc1)[R], const Descs& d,
                                           int s, bool first) const {
    using Mma = Wgmma<BN, T>;
    const uint64_t da0 = d.at(s, 0), da1 = d.at(s, 1), db = d.bt(s);
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      const int scale = (first && kk == 0) ? 0 : 1;
      Mma::template mma<A_MN, B_MN>(acc0, da0 + kStepA * kk, db + kStepB * kk, scale);
      Mma::template mma<A_MN, B_MN>(acc1, da1 + kStepA * kk, db + kStepB * kk, scale);
    }
  }

  // Ping-pong (Note [Hopper GEMM ping-pong]): one warpgroup accumulates a whole 128-row tile,
  // rows [0, 64) in acc0 and [64, 128) in acc1.
  template <int R>
  __device__ void consume_tile(float (&acc0)[R], float (&acc1)[R], int k_blocks, int& stage,
                               uint32_t& phase) const {
    using Mma = Wgmma<BN, T>;
    static_assert(Mma::kRegs == R, "accumulator size");
    const int lane = threadIdx.x % 32;
    const Descs d = descs();
    int prev = -1;
    for (int kb = 0; kb < k_blocks; ++kb) {
      mbar_wait(&full[stage], phase);
      wgmma_fence();
      mma_both(acc0, acc1, d, stage, kb == 0);
      wgmma_commit();
      if (prev >= 0) {
        wgmma_wait<1>();
        if (lane == 0) release(prev);
      }
      prev = stage;
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    wgmma_wait<0>();
    fence_accumulators(acc0);
    fence_accumulators(acc1);
    if (prev >= 0 && lane == 0) release(prev);
  }

  // Note [Overlapped tile boundary]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // The activation kernel's one consumer warpgroup (Note [Activation warpgroup]) owns both
  // 64-row halves of every tile. With consume_tile it drained all its MMAs at a tile's end
  // (wait_group 0), staged both halves and only then issued the next tile's first k-block:
  // the tensor cores idled for the drain, the staging and the first stage's wait, ~1300 of
  // the ~8800 cycles a 128×128 tile took at GPT-2's fc1 (K = 768, per-tile timestamps,
  // session 31). Here each tile's first and last k-blocks are committed as two groups, rows
  // [0, 64) (acc0) and then rows [64, 128) (acc1), so at a tile's end:
  //   wait_group 1       acc0's last MMAs are done, acc1's may still run;
  //   stage(0)           acc0 rounded into the staged tile while acc1's MMAs finish;
  //   next tile, acc0    its first k-block issued into acc0 (scale 0: no zeroing);
  //   wait_group 1       acc1's last MMAs are done (the new acc0 group may run);
  //   stage(1)           acc1 staged while the new acc0 group runs, then handed over;
  //   next tile, acc1    its first k-block issued into acc1.
  // The k-blocks in between are one group each, the halves interleaved as in consume_tile.
  // A stage is released once every group that reads it has completed: after the next
  // k-block's wait_group (1, or 2 behind a last k-block's pair), and a tile's last stage after
  // the acc1 wait above. wgmma.fence precedes each issue after the staging read the registers
  // (PTX: a register access between two wgmmas on the same registers needs one).
  // Measured (H100, session 33, ffn-bench --act-epilogues, 0.15 s windows, alternated twice,
  // ms before -> after, with the cheaper unit decode of tile_scheduler.cuh): gpt2's fc1
  // forward 0.171/0.173 -> 0.169/0.164, backward with db 0.233/0.234 -> 0.227/0.230;
  // ffn_d1024's forward 0.269/0.269 -> 0.257/0.261; geglu_d1024's 0.540/0.543 -> 0.522/0.518;
  // ffn_d4096's 1.96/1.95 -> 1.92/1.93. Less than the idle time predicted (the producer kept
  // loading during the pause), and a sixth ring stage gained nothing on top (session 33,
  // bench/RESULTS-2026-11-27-s33-34.md), so neither the boundary nor the ring's depth bounds
  // that forward now.
  // next_kbs(j): tile j's k-blocks, or -1 once there is none (called once per j, in order, as
  // a unit ring's reader must); stage(j, h, acc): stage half h of tile j (h = 0 first).
  template <int R, class NextKbs, class StageHalf>
  __device__ void consume_overlapped(float (&acc0)[R], float (&acc1)[R], NextKbs next_kbs,
                                     StageHalf stage_half) const {
    using Mma = Wgmma<BN, T>;
    static_assert(Mma::kRegs == R, "accumulator size");
    const int lane = threadIdx.x % 32;
    const Descs d = descs();
    // One 64-row half's MMAs of stage s (first: its k-block 0, which overwrites acc).
    const auto half = [&](float (&acc)[R], int h, int s, bool first) {
      const uint64_t da = d.at(s, h), db = d.bt(s);
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
        Mma::template mma<A_MN, B_MN>(acc, da + kStepA * kk, db + kStepB * kk,
                                      (first && kk == 0) ? 0 : 1);
    };
    int stage = 0;
    uint32_t phase = 0;
    const auto advance = [&] {
      if (++stage == kStages) stage = 0, phase ^= 1;
    };
    int kbs = next_kbs(0);
    if (kbs < 0) return;
    mbar_wait(&full[stage], phase);
    wgmma_fence();
    half(acc0, 0, stage, true);
    wgmma_commit();
    half(acc1, 1, stage, true);
    wgmma_commit();
    int held = stage;  // the latest k-block's stage, still read by its groups
    advance();
    for (int j = 0;; ++j) {
      if (j > 0 && threadIdx.x % 128 == 0) trace::mark(12, j);
      // The rest of the tile's k-blocks, its last one peeled: every path to the waits below
      // then ends in a pair of groups, which ptxas's analysis needs to keep the MMAs
      // asynchronous (with the loop running up to the last k-block it serialised them).
      if (kbs > 1) {
        for (int kb = 1; kb + 1 < kbs; ++kb) {  // the middle k-blocks: a group each
          mbar_wait(&full[stage], phase);
          wgmma_fence();
          mma_both(acc0, acc1, d, stage, false);
          wgmma_commit();
          wgmma_wait<1>();
          if (lane == 0) release(held);
          held = stage;
          advance();
        }
        mbar_wait(&full[stage], phase);  // the last k-block: a group per half
        wgmma_fence();
        half(acc0, 0, stage, false);
        wgmma_commit();
        half(acc1, 1, stage, false);
        wgmma_commit();
        wgmma_wait<2>();
        if (lane == 0) release(held);
        held = stage;
        advance();
      }
      if (threadIdx.x % 128 == 0) trace::mark(13, j);
      wgmma_wait<1>();
      fence_accumulators(acc0);
      stage_half(j, 0, acc0);
      kbs = next_kbs(j + 1);
      // One path to acc1's staging with or without a next tile: with a separate exit (wait 0,
      // stage, return) ptxas serialised the MMAs as well.
      const bool more = kbs >= 0;
      if (more) {  // the next tile's first k-block into acc0, beside acc1's last MMAs
        mbar_wait(&full[stage], phase);
        wgmma_fence();
        half(acc0, 0, stage, true);
        wgmma_commit();
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
      }
      fence_accumulators(acc1);
      if (lane == 0) release(held);
      stage_half(j, 1, acc1);
      if (!more) return;
      wgmma_fence();
      half(acc1, 1, stage, true);
      wgmma_commit();
      held = stage;
      advance();
    }
  }

  // The stages of a tile the other warpgroup consumes.
  __device__ static void skip(int k_blocks, int& stage, uint32_t& phase) {
    const int next = stage + k_blocks;
    phase ^= static_cast<uint32_t>((next / kStages) & 1);
    stage = next % kStages;
  }
};

}  // namespace ffn::cuda::gemm
