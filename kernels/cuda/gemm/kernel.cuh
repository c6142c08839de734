// kernels/cuda/gemm/kernel.cuh — the Hopper GEMM kernels composed from their pieces: the
// mainloop (mainloop.cuh), the tile scheduler (tile_scheduler.cuh) and an epilogue
// (epilogue.cuh), in the cooperative and ping-pong schedules, plus the kernel whose
// activation runs on warpgroups of its own (act_warpgroup.cuh), and the host side that builds
// the TMA tensor maps, sizes the shared-memory ring and launches a persistent grid. Included
// by the .cu files that instantiate it for their epilogues (sm90_gemm.cu: plain products,
// split-K and the dropout fc1; sm90_gemm_act.cu: the activation epilogues).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <type_traits>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "kernels/cuda/gemm/act_warpgroup.cuh"
#include "kernels/cuda/gemm/epilogue.cuh"
#include "kernels/cuda/gemm/mainloop.cuh"
#include "kernels/cuda/gemm/tensor_map.h"

namespace ffn {
// kernels/gemm.h's, declared here: that header's function ffn::cuda::gemm would clash with
// this namespace.
bool gemm_dynamic_order();
}  // namespace ffn

namespace ffn::cuda::gemm {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
#define FFN_SM90A_CODE 1
#else
#define FFN_SM90A_CODE 0
#endif

// Both schedules start alike: barriers set up, then warpgroup 0 gives its registers away and
// becomes the producer (one thread issues every TMA load; returns false), and the consumer
// warpgroups take theirs (setmaxnreg; HOPPER.md).
template <class ML>
__device__ __forceinline__ bool enter_consumer(const ML& ml, const CUtensorMap* ta,
                                               const CUtensorMap* tb, const TileScheduler& sched) {
  if (threadIdx.x == 0) {
    prefetch_tensor_map(ta);
    prefetch_tensor_map(tb);
    ml.init_barriers();
  }
  __syncthreads();
  if (threadIdx.x / 128 == 0) {
    regs_dealloc<40>();
    if (threadIdx.x == 0) ml.produce(ta, tb, sched);
    return false;
  }
  regs_alloc<232>();
  return true;
}

template <class T, int BN, int STAGES, bool A_MN, bool B_MN, class Epi>
__global__ void __launch_bounds__(384, 1)
    gemm_kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                const __grid_constant__ CUtensorMap tc, const __grid_constant__ CUtensorMap tc2,
                TileScheduler sched, Epi epi) {
#if FFN_SM90A_CODE && defined(__CUDA_ARCH__)
  using ML = Mainloop<T, BN, STAGES, 8, A_MN, B_MN>;
  constexpr int kScratch = Epi::template kScratchBytes<BN, 64>;
  extern __shared__ uint8_t smem_raw[];
  const ML ml = ML::carve(smem_raw, 2 * kScratch);
  if (!enter_consumer(ml, &ta, &tb, sched)) return;
  const int wg = threadIdx.x / 128;
  const int c = wg - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  int stage = 0;
  uint32_t phase = 0;
  float acc[BN / 2];
  TileCtx ctx;
  ctx.wg_thread = threadIdx.x - 128 * wg;
  ctx.barrier = 1 + c;
  ctx.scratch = ml.scratch + c * kScratch;
  ctx.c_map = &tc;
  ctx.c2_map = &tc2;
  for (int u = blockIdx.x; u < sched.num_units(); u += gridDim.x) {
    const Unit w = sched.unit(u);
    ml.consume(acc, c, w.kbs, stage, phase);
    // The accumulator layout of wgmma.cuh: rows 16·warp + lane/4 (+8), columns
    // 8·(i/4) + 2·(lane%4) (+1).
    ctx.split = w.split;
    ctx.rows = w.tm * ML::BM + 64 * c;
    ctx.cols = w.tn * BN;
    ctx.row0 = ctx.rows + 16 * warp + lane / 4;
    ctx.col0 = ctx.cols + 2 * (lane % 4);
    epi.tile(acc, ctx);
  }
  epilogue_drain(ctx);
#endif
}

// Note [Hopper GEMM ping-pong]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The cooperative kernel above splits each 128-row tile between the two consumer warpgroups,
// so both run their epilogues at the same time and the tensor cores idle meanwhile. Here each
// consumer warpgroup owns whole tiles, alternating: the CTA's j-th tile goes to warpgroup
// j % 2, which skips the other's stages in the ring (Mainloop::skip). The mainloops take
// turns (Mainloop::order barriers): warpgroup w starts tile j's only after the other has
// finished tile j - 1's, so while one warpgroup stores a tile, the other's MMAs run. Stages
// are released by 4 warps (one warpgroup).
template <class T, int BN, int STAGES, bool A_MN, bool B_MN, class Epi>
__global__ void __launch_bounds__(384, 1)
    gemm_pingpong_kernel(const __grid_constant__ CUtensorMap ta,
                         const __grid_constant__ CUtensorMap tb,
                         const __grid_constant__ CUtensorMap tc,
                         const __grid_constant__ CUtensorMap tc2, TileScheduler sched, Epi epi) {
#if FFN_SM90A_CODE && defined(__CUDA_ARCH__)
  using ML = Mainloop<T, BN, STAGES, 4, A_MN, B_MN>;
  constexpr int kScratch = Epi::template kScratchBytes<BN, 128>;
  extern __shared__ uint8_t smem_raw[];
  const ML ml = ML::carve(smem_raw, 2 * kScratch);
  if (!enter_consumer(ml, &ta, &tb, sched)) return;
  const int wg = threadIdx.x / 128;
  const int w = wg - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  int stage = 0;
  uint32_t phase = 0;
  float acc0[BN / 2], acc1[BN / 2];
  int j = 0;
  uint32_t order_phase = 0;
  TileCtx ctx;
  ctx.wg_thread = threadIdx.x - 128 * wg;
  ctx.barrier = 1 + w;
  ctx.scratch = ml.scratch + w * kScratch;
  ctx.c_map = &tc;
  ctx.c2_map = &tc2;
  for (int u = blockIdx.x; u < sched.num_units(); u += gridDim.x, ++j) {
    const Unit un = sched.unit(u);
    if ((j & 1) != w) {
      ML::skip(un.kbs, stage, phase);
      continue;
    }
    // Mainloops take turns: wait until the other warpgroup's mainloop of the previous tile
    // is done. Only then are this tile's stages at most one phase ahead of their barriers,
    // which is what parity waits can tell apart.
    if (j > 0) {
      mbar_wait(&ml.order[1 - w], order_phase);
      order_phase ^= 1;
    }
    ml.consume_tile(acc0, acc1, un.kbs, stage, phase);
    if (threadIdx.x % 128 == 0) mbar_arrive(&ml.order[w]);
    ctx.split = un.split;
    ctx.cols = un.tn * BN;
    ctx.col0 = ctx.cols + 2 * (lane % 4);
    ctx.rows = un.tm * ML::BM;
    ctx.row0 = ctx.rows + 16 * warp + lane / 4;
    epilogue_tile2(epi, acc0, acc1, ctx);
  }
  epilogue_drain(ctx);
#endif
}

// Note [Activation warpgroup]'s kernel: 128×128 tiles, one consumer warpgroup, A K-major (x
// or dz2), B K-major in the forward (W1 as [h, d]) and MN-major in the backward (W2 as
// [d, h]). tc: z or dz; tc2: hd; tz: the saved z (backward).
// The units come in Note [Dynamic unit order] (kDynamic: the producer thread takes them from
// `units`) or in the static order (StaticUnits).
template <class T, int STAGES, Activation A, bool kBackward, bool kGlu, bool kDynamic>
__global__ void __launch_bounds__(512, 1)
    gemm_act_kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                    const __grid_constant__ CUtensorMap tc, const __grid_constant__ CUtensorMap tc2,
                    TileScheduler sched, UnitCounter units,
                    ActWarpgroup<T, A, kBackward, kGlu, kDynamic> act) {
#if FFN_SM90A_CODE && defined(__CUDA_ARCH__)
  using ML = Mainloop<T, 128, STAGES, 4, false, kBackward>;
  using SH = ActShared<kBackward, kGlu, kDynamic>;
  extern __shared__ uint8_t smem_raw[];
  const ML ml = ML::carve(smem_raw, SH::kBytes);
  const SH sh = SH::carve(ml.scratch);
  const auto ring = sh.ring(sched);
  if (threadIdx.x == 0) {
    prefetch_tensor_map(&ta);
    prefetch_tensor_map(&tb);
    ring.init();
    ml.init_barriers();  // ends with fence_barrier_init
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    regs_dealloc<40>();
    if (threadIdx.x == 0) {
      int stage = 0;
      uint32_t phase = 0;
      // Each unit is taken one ahead of its loads, so the activation warpgroups can see the
      // tile after the next one when they start a tile (the backward's z goes into L2 then).
      int u = ring.take(units, 0, sched.num_units());
      for (int k = 0; u >= 0; ++k) {
        const int after = ring.take(units, k + 1, sched.num_units());
        ml.produce_unit(&ta, &tb, sched.unit(u), stage, phase, kGlu && !kBackward ? act.n : 0);
        u = after;
      }
    }
  } else if (wg == 1) {
    regs_alloc<232>();
    const int wg_thread = threadIdx.x % 128;
    int stage = 0;
    uint32_t phase = 0;
    float acc0[64], acc1[64];
    for (int j = 0;; ++j) {
      const int u = ring.at(j);
      if (u < 0) break;
      const Unit un = sched.unit(u);
      ml.consume_tile(acc0, acc1, un.kbs, stage, phase);
      const int b = j & 1;
      if (j >= 2) named_barrier_sync(SH::empty_barrier(b), SH::kHandoff);  // tile j - 2's read
      stage_block<T>(acc0, sh.staged(b), 0, wg_thread);
      stage_block<T>(acc1, sh.staged(b), 1, wg_thread);
      fence_proxy_async_smem();  // the forward's z leaves by TMA straight from here
      named_barrier_arrive(SH::full_barrier(b), SH::kHandoff);
    }
  } else {
    regs_dealloc<120>();
    act.run(wg - 2, sh, sched, &tc, &tc2);
  }
#endif
}

// Note [Dynamic unit order]'s counter pair of `dev` (zeros between launches), allocated at
// its first use, which must not be under stream capture (the trainer's first step runs
// uncaptured); sm90_gemm_act.cu.
UnitCounter unit_counter(int dev);

// A row-major [rows, cols] operand as boxes of box_rows rows × 64 columns (tensor_map.h).
inline CUtensorMap tensor_map(const Tensor& t, int box_rows) {
  return tensor_map_2d(t, box_rows, "sm90_gemm");
}

// Epilogues that store C (and C2) through TMA need tensor maps of them.
template <class Epi>
struct StoresWithTma : std::false_type {};
template <class T, bool ROPE>
struct StoresWithTma<StoreCTma<T, ROPE>> : std::true_type {};
template <class T, Activation A, bool B>
struct StoresWithTma<ActTma<T, A, B>> : std::true_type {};

// c2: the second output of a two-output epilogue (ActTma), else null.
template <class T, int BN, int STAGES, bool PINGPONG, bool A_MN, bool B_MN, class Epi>
void launch(const Tensor& a, const Tensor& b, const Tensor& c, const Epi& epi, int splits,
            const Tensor* c2) {
  using ML = Mainloop<T, BN, STAGES, PINGPONG ? 4 : 8, A_MN, B_MN>;
  const int dev = a.device().index;
  DeviceGuard guard(dev);
  const int m = static_cast<int>(c.size(0)), n = static_cast<int>(c.size(1));
  const int k = static_cast<int>(A_MN ? a.size(0) : a.size(1));
  // K-major operands load as one box of 128 (BN) rows, MN-major ones as 64-row boxes.
  const CUtensorMap ta = tensor_map(a, A_MN ? 64 : ML::BM), tb = tensor_map(b, B_MN ? 64 : BN);
  CUtensorMap tc{}, tc2{};
  if constexpr (StoresWithTma<Epi>::value) tc = tensor_map(c, 64);
  if (c2) tc2 = tensor_map(*c2, 64);
  const TileScheduler sched{(m + ML::BM - 1) / ML::BM, (n + BN - 1) / BN, (k + ML::BK - 1) / ML::BK,
                            splits};
  auto kernel = [] {
    if constexpr (PINGPONG)
      return gemm_pingpong_kernel<T, BN, STAGES, A_MN, B_MN, Epi>;
    else
      return gemm_kernel<T, BN, STAGES, A_MN, B_MN, Epi>;
  }();
  const int smem = ML::smem_bytes(2 * Epi::template kScratchBytes<BN, PINGPONG ? 128 : 64>);
  static std::once_flag once[8];
  std::call_once(once[dev % 8], [&] {
    FFN_CHECK_CUDA(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  });
  const int grid = std::min(sched.num_units(), properties(dev).multiProcessorCount);
  kernel<<<grid, 384, smem, stream(dev)>>>(ta, tb, tc, tc2, sched, epi);
  FFN_CHECK_CUDA(cudaGetLastError());
}

// How a product is cut: schedule, tile width and split count.
struct Tiling {
  bool pingpong = false;
  int bn = 128;
  int splits = 1;
};

// As many stages as the 227 KiB of shared memory per block leave after the epilogue's
// scratch (both consumer warpgroups'), the barriers and the 1024-byte alignment slack; at
// most 6 (4 for BN = 256), beyond which the measured rate no longer improves.
template <class Epi, int BN, bool PINGPONG>
constexpr int stages_for() {
  constexpr int scratch = 2 * Epi::template kScratchBytes<BN, PINGPONG ? 128 : 64>;
  constexpr int stage = (128 + BN) * 64 * 2;
  constexpr int fit = (232448 - 1024 - 256 - scratch) / stage;
  constexpr int cap = BN == 256 ? 4 : 6;
  static_assert(fit >= 2, "the epilogue's scratch leaves no room for a ring");
  return fit < cap ? fit : cap;
}

// Cooperative: BN = 256 or 128. Ping-pong: BN = 128 (two 64×128 accumulator blocks per
// warpgroup).
template <class T, bool A_MN, bool B_MN, class Epi>
void launch_tiling(const Tensor& a, const Tensor& b, const Tensor& c, const Epi& epi,
                   const Tiling& t, const Tensor* c2 = nullptr) {
  if (t.pingpong)
    launch<T, 128, stages_for<Epi, 128, true>(), true, A_MN, B_MN>(a, b, c, epi, t.splits, c2);
  else if (t.bn == 256)
    launch<T, 256, stages_for<Epi, 256, false>(), false, A_MN, B_MN>(a, b, c, epi, t.splits, c2);
  else
    launch<T, 128, stages_for<Epi, 128, false>(), false, A_MN, B_MN>(a, b, c, epi, t.splits, c2);
}

// Note [Activation warpgroup]: forward (a = x, b = W1 [h, d]: out = z) or backward (a = dz2,
// b = W2 [d, h], z the saved z: out = dz); hd the second output.
// db_part (backward, optional): [tiles_m, n] fp32 column sums of dz per 128-row tile; mask:
// the hidden dropout's (inactive: none). kGlu (Note [GLU warpgroup]): forward b = W [2h, d],
// out = z [m, 2h], hd = the GLU's output [m, h], h % 64 == 0; backward b = W2 [d, h], z the
// saved [m, 2h], out = dz [m, 2h], hd = the recomputed GLU output [m, h], db_part [tiles_m,
// 2h].
// The units' order (Note [Dynamic unit order]): dynamic under gemm_dynamic_order()
// (kernels/gemm.h: data parallelism), else static.
template <class T, Activation A, bool kBackward, bool kGlu, bool kDynamic>
void launch_act_in(const Tensor& a, const Tensor& b, const Tensor& out, const Tensor& hd,
                   const Tensor* z, const T* bias, const DeviceMask& mask, float* db_part) {
  constexpr int kStage = 2 * 128 * 64 * 2;
  constexpr int kStages =
      std::min(6, (232448 - 1024 - 256 - ActShared<kBackward, kGlu, kDynamic>::kBytes) / kStage);
  static_assert(kStages >= 3, "the activation warpgroup's tiles leave too little of a ring");
  using ML = Mainloop<T, 128, kStages, 4, false, kBackward>;
  const int dev = a.device().index;
  DeviceGuard guard(dev);
  const int m = static_cast<int>(out.size(0));
  const int n = static_cast<int>(kGlu ? hd.size(1) : out.size(1));  // kGlu: h
  const int k = static_cast<int>(a.size(1));
  const CUtensorMap ta = tensor_map(a, ML::BM), tb = tensor_map(b, kBackward || kGlu ? 64 : 128);
  const CUtensorMap tc = tensor_map(out, 64);
  const CUtensorMap tc2 = kBackward ? CUtensorMap{} : tensor_map(hd, 64);
  const TileScheduler sched{(m + 127) / 128, kGlu && !kBackward ? n / 64 : (n + 127) / 128,
                            (k + 63) / 64, 1};
  auto kernel = gemm_act_kernel<T, kStages, A, kBackward, kGlu, kDynamic>;
  const int smem = ML::smem_bytes(ActShared<kBackward, kGlu, kDynamic>::kBytes);
  const UnitCounter units = kDynamic ? unit_counter(dev) : UnitCounter{};
  static std::once_flag once[8];
  std::call_once(once[dev % 8], [&] {
    FFN_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  });
  const int grid = std::min(sched.num_units(), properties(dev).multiProcessorCount);
  ActWarpgroup<T, A, kBackward, kGlu, kDynamic> act{bias, m, n, db_part};
  act.mask = mask;
  if constexpr (kBackward) {
    act.z = static_cast<const T*>(z->data_ptr());
    act.hd = static_cast<T*>(hd.data_ptr());
    if constexpr (kGlu) act.dz = static_cast<T*>(out.data_ptr());
  }
  kernel<<<grid, 512, smem, stream(dev)>>>(ta, tb, tc, tc2, sched, units, act);
  FFN_CHECK_CUDA(cudaGetLastError());
}

template <class T, Activation A, bool kBackward, bool kGlu = false>
void launch_act(const Tensor& a, const Tensor& b, const Tensor& out, const Tensor& hd,
                const Tensor* z, const T* bias, const DeviceMask& mask, float* db_part = nullptr) {
  if (ffn::gemm_dynamic_order())
    launch_act_in<T, A, kBackward, kGlu, true>(a, b, out, hd, z, bias, mask, db_part);
  else
    launch_act_in<T, A, kBackward, kGlu, false>(a, b, out, hd, z, bias, mask, db_part);
}

}  // namespace ffn::cuda::gemm
