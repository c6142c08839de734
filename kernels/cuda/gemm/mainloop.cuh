// kernels/cuda/gemm/mainloop.cuh — the Hopper GEMM's pipeline for C = A·Bᵀ with A [M, K] and
// B [N, K] both K-major (row-major x·Wᵀ): a ring of kStages shared-memory stages, each
// holding a 128×64 A tile and a BN×64 B tile written by TMA with 128-byte swizzling.
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
// the epilogue of the current one.
#pragma once

#include "kernels/cuda/gemm/sm90.cuh"
#include "kernels/cuda/gemm/tile_scheduler.cuh"
#include "kernels/cuda/gemm/wgmma.cuh"

namespace ffn::cuda::gemm {

template <class T, int BN_, int STAGES, int ARRIVALS = 8>
struct Mainloop {
  static constexpr int BM = 128, BN = BN_, BK = 64, kStages = STAGES;
  static constexpr int kABytes = BM * BK * 2, kBBytes = BN * BK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kConsumerWarps = ARRIVALS;  // warps that release a stage
  // Shared memory: the stages (1024-byte aligned for the 128B swizzle), then the barriers.
  static constexpr int kSmemBytes = kStages * kStageBytes + (2 * kStages + 2) * 8 + 1024;

  uint8_t* tiles;  // kStages × (A tile, B tile)
  uint64_t* full;
  uint64_t* empty;
  uint64_t* order;  // ping-pong: order[w] completes when warpgroup w's mainloop of a tile is done

  __device__ static Mainloop carve(uint8_t* smem_raw) {
    Mainloop ml;
    const uint32_t base = smem_addr(smem_raw);
    ml.tiles = smem_raw + ((1024 - (base & 1023)) & 1023);
    ml.full = reinterpret_cast<uint64_t*>(ml.tiles + kStages * kStageBytes);
    ml.empty = ml.full + kStages;
    ml.order = ml.empty + kStages;
    return ml;
  }
  __device__ uint8_t* a_tile(int s) const { return tiles + s * kStageBytes; }
  __device__ uint8_t* b_tile(int s) const { return tiles + s * kStageBytes + kABytes; }

  __device__ void init_barriers() const {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps);
    }
    mbar_init(&order[0], 1);
    mbar_init(&order[1], 1);
    fence_barrier_init();
  }

  // The producer thread: every k-block of every tile of this CTA, in order.
  __device__ void produce(const CUtensorMap* ta, const CUtensorMap* tb, const TileScheduler& sched,
                          int k_blocks) const {
    int stage = 0;
    uint32_t phase = 0;
    for (int t = blockIdx.x; t < sched.num_tiles(); t += gridDim.x) {
      int tm, tn;
      sched.coords(t, tm, tn);
      for (int kb = 0; kb < k_blocks; ++kb) {
        mbar_wait(&empty[stage], phase ^ 1);
        mbar_arrive_expect_tx(&full[stage], kStageBytes);
        tma_load_2d(a_tile(stage), ta, &full[stage], kb * BK, tm * BM);
        tma_load_2d(b_tile(stage), tb, &full[stage], kb * BK, tn * BN);
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
    }
  }

  // One consumer warpgroup (c = 0 or 1) accumulates rows [64c, 64c + 64) of a tile.
  template <int R>
  __device__ void consume(float (&acc)[R], int c, int k_blocks, int& stage,
                          uint32_t& phase) const {
    using Mma = Wgmma<BN, T>;
    static_assert(Mma::kRegs == R, "accumulator size");
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    int prev = -1;
    for (int kb = 0; kb < k_blocks; ++kb) {
      mbar_wait(&full[stage], phase);
      const uint64_t da = smem_desc_k128(a_tile(stage) + c * 64 * 128);
      const uint64_t db = smem_desc_k128(b_tile(stage));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)  // 16 elements = 32 bytes = 2 descriptor units
        Mma::mma(acc, da + 2 * kk, db + 2 * kk, (kb > 0 || kk > 0) ? 1 : 0);
      wgmma_commit();
      if (prev >= 0) {
        wgmma_wait<1>();
        if (lane == 0) mbar_arrive(&empty[prev]);
      }
      prev = stage;
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    if (prev >= 0 && lane == 0) mbar_arrive(&empty[prev]);
    (void)warp;
  }

  // Ping-pong (Note [Hopper GEMM ping-pong]): one warpgroup accumulates a whole 128-row tile,
  // rows [0, 64) in acc0 and [64, 128) in acc1.
  template <int R>
  __device__ void consume_tile(float (&acc0)[R], float (&acc1)[R], int k_blocks, int& stage,
                               uint32_t& phase) const {
    using Mma = Wgmma<BN, T>;
    static_assert(Mma::kRegs == R, "accumulator size");
    const int lane = threadIdx.x % 32;
    int prev = -1;
    for (int kb = 0; kb < k_blocks; ++kb) {
      mbar_wait(&full[stage], phase);
      const uint64_t da0 = smem_desc_k128(a_tile(stage));
      const uint64_t da1 = smem_desc_k128(a_tile(stage) + 64 * 128);
      const uint64_t db = smem_desc_k128(b_tile(stage));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        const int scale = (kb > 0 || kk > 0) ? 1 : 0;
        Mma::mma(acc0, da0 + 2 * kk, db + 2 * kk, scale);
        Mma::mma(acc1, da1 + 2 * kk, db + 2 * kk, scale);
      }
      wgmma_commit();
      if (prev >= 0) {
        wgmma_wait<1>();
        if (lane == 0) mbar_arrive(&empty[prev]);
      }
      prev = stage;
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    wgmma_wait<0>();
    fence_accumulators(acc0);
    fence_accumulators(acc1);
    if (prev >= 0 && lane == 0) mbar_arrive(&empty[prev]);
  }

  // The stages of a tile the other warpgroup consumes.
  __device__ static void skip(int k_blocks, int& stage, uint32_t& phase) {
    const int next = stage + k_blocks;
    phase ^= static_cast<uint32_t>((next / kStages) & 1);
    stage = next % kStages;
  }
};

}  // namespace ffn::cuda::gemm
