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
#include <bit>
#include <mutex>
#include <type_traits>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "kernels/cuda/gemm/act_warpgroup.cuh"
#include "kernels/cuda/gemm/epilogue.cuh"
#include "kernels/cuda/gemm/mainloop.cuh"
#include "kernels/cuda/gemm/tensor_map.h"
#include "kernels/cuda/gemm/trace.cuh"

namespace ffn {
// kernels/gemm.h's, declared here: that header's function ffn::cuda::gemm would clash with
// this namespace.
bool gemm_dynamic_order();
bool gemm_multicast();
bool gemm_dependent_launch();
int gemm_group_rows();
}  // namespace ffn

namespace ffn::cuda::gemm {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
#define FFN_SM90A_CODE 1
#else
#define FFN_SM90A_CODE 0
#endif

// Note [Dependent launch]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Launched in order on one stream, a kernel's CTAs start only once the previous kernel has
// finished, so each persistent GEMM pays its launch and set-up (shared-memory carve-out, the
// barriers, the cluster's first barrier, the tensor maps' fetch) with every SM idle, after the
// previous kernel's last tiles have kept most SMs idle already. With programmatic dependent
// launch (launch_persistent sets cudaLaunchAttributeProgrammaticStreamSerialization where
// gemm_dependent_launch() is on, kernels/gemm.h) the next kernel's CTAs may start while this
// one runs, on SMs its exited CTAs leave free, once every CTA of this one has executed
// launch_dependents (sm90.cuh) or exited. So each of these kernels, after its set-up and
// before it touches global memory (loads, the epilogue's reads, stores, the unit counter),
// waits in grid_dependency_wait until the kernel before it has completed and its writes are
// visible, then at once lets its own dependents be scheduled: where the grid fills the GPU
// (one CTA an SM) they find no room until its CTAs exit. Every thread waits, so whatever a
// role reads or writes later is ordered after the previous kernel, whichever kernel that was
// (where it was not launched as a dependent the wait returns at once). The kernels after ours
// that are not launched so (cuBLASLt's, the elementwise ones) start as before, after ours
// complete. Under stream capture (the trainer's CUDA-graph step) the launches stay plain: a
// captured dependent launch becomes a programmatic edge of the graph, which no GPU test has
// run yet.
// Measured (H200, session 49, ffn-bench --gemm --gemm-variant auto, 36 products back to back,
// FFN_GEMM_PDL=0/1 alternated twice): on ÷ off median 0.998 (0.981-1.013), the FFN workloads
// within their noise; so the launch boundary is not where our kernels lose ~20 us a run back
// to back against cuBLASLt (bench/RESULTS.md, session 48). It stays on: no slower, and the
// place where a kernel could start work that does not depend on its predecessor early.

// Both schedules start alike: barriers set up, then warpgroup 0 gives its registers away and
// becomes the producer (one thread issues every TMA load; returns false), and the consumer
// warpgroups take theirs (setmaxnreg; HOPPER.md).
// With multicast (Note [Operand multicast]) the partner's barriers must be initialised before
// this CTA's first load signals them or its consumers arrive on them: a cluster-wide barrier.
// Then the wait for the previous kernel (Note [Dependent launch]).
template <class ML>
__device__ __forceinline__ bool enter_consumer(const ML& ml, const CUtensorMap* ta,
                                               const CUtensorMap* tb, const TileScheduler& sched) {
  if (threadIdx.x == 0) {
    prefetch_tensor_map(ta);
    prefetch_tensor_map(tb);
    ml.init_barriers();
  }
  if constexpr (ML::kCluster == 2)
    cluster_sync();
  else
    __syncthreads();
  grid_dependency_wait();
  launch_dependents();
  if (threadIdx.x / 128 == 0) {
    regs_dealloc<40>();
    if (threadIdx.x == 0) ml.produce(ta, tb, sched);
    return false;
  }
  regs_alloc<232>();
  return true;
}

// kCluster = 2: clusters of two CTAs share A's tiles (Note [Operand multicast]; K-major A, ta's
// boxes 64 rows). The kernels end with a cluster-wide barrier then: the partner loads into this
// CTA's stages and arrives on its barriers until it is done. The producer warpgroup exits early
// (its threads no longer count for the barrier).
template <class T, int BN, int STAGES, bool A_MN, bool B_MN, class Epi, int kCluster = 1,
          bool kShareB = false>
__global__ void __launch_bounds__(384, 1)
    gemm_kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                const __grid_constant__ CUtensorMap tc, const __grid_constant__ CUtensorMap tc2,
                TileScheduler sched_in, Epi epi) {
#if FFN_SM90A_CODE && defined(__CUDA_ARCH__)
  TileScheduler sched = sched_in;  // cluster and rank as constants where they are
  sched.cluster = kCluster;
  sched.rank = kCluster == 2 ? static_cast<int>(cluster_ctarank()) : 0;
  sched.share_b = kShareB;
  using ML = Mainloop<T, BN, STAGES, 8, A_MN, B_MN, kCluster, kShareB>;
  constexpr int kScratch = Epi::template kScratchBytes<BN, 64>;
  extern __shared__ uint8_t smem_raw[];
  const ML ml = ML::carve(smem_raw, 2 * kScratch);
  if (!enter_consumer(ml, &ta, &tb, sched)) return;
  const int c = threadIdx.x / 128 - 1;
  int stage = 0;
  uint32_t phase = 0;
  float acc[BN / 2];
  TileCtx ctx = TileCtx::of_consumer(c, ml.scratch, kScratch);
  ctx.c_map = &tc;
  ctx.c2_map = &tc2;
  for (int u = sched.first_unit(); u < sched.num_units(); u += sched.unit_stride()) {
    const Unit w = sched.unit(u);
    ml.consume(acc, c, w.kbs, stage, phase);
    ctx.split = w.split;
    ctx.place(w.tm * ML::BM + 64 * c, w.tn * BN);
    epi.tile(acc, ctx);
    ctx.sub += BN / 64;
  }
  epilogue_drain(ctx);
  if constexpr (kCluster == 2) cluster_sync();
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
template <class T, int BN, int STAGES, bool A_MN, bool B_MN, class Epi, int kCluster = 1>
__global__ void __launch_bounds__(384, 1)
    gemm_pingpong_kernel(const __grid_constant__ CUtensorMap ta,
                         const __grid_constant__ CUtensorMap tb,
                         const __grid_constant__ CUtensorMap tc,
                         const __grid_constant__ CUtensorMap tc2, TileScheduler sched_in, Epi epi) {
#if FFN_SM90A_CODE && defined(__CUDA_ARCH__)
  TileScheduler sched = sched_in;  // cluster and rank as constants where they are
  sched.cluster = kCluster;
  sched.rank = kCluster == 2 ? static_cast<int>(cluster_ctarank()) : 0;
  sched.share_b = false;
  using ML = Mainloop<T, BN, STAGES, 4, A_MN, B_MN, kCluster>;
  constexpr int kScratch = Epi::template kScratchBytes<BN, 128>;
  extern __shared__ uint8_t smem_raw[];
  const ML ml = ML::carve(smem_raw, 2 * kScratch);
  if (!enter_consumer(ml, &ta, &tb, sched)) return;
  const int w = threadIdx.x / 128 - 1;
  int stage = 0;
  uint32_t phase = 0;
  float acc0[BN / 2], acc1[BN / 2];
  int j = 0;
  uint32_t order_phase = 0;
  TileCtx ctx = TileCtx::of_consumer(w, ml.scratch, kScratch);
  ctx.c_map = &tc;
  ctx.c2_map = &tc2;
  for (int u = sched.first_unit(); u < sched.num_units(); u += sched.unit_stride(), ++j) {
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
    ctx.place(un.tm * ML::BM, un.tn * BN);
    epilogue_tile2(epi, acc0, acc1, ctx);
  }
  epilogue_drain(ctx);
  if constexpr (kCluster == 2) cluster_sync();
#endif
}

// Note [Activation warpgroup]'s kernel: 128×128 tiles, one consumer warpgroup, A K-major (x
// or dz2), B K-major in the forward (W1 as [h, d]) and MN-major in the backward (W2 as
// [d, h]). tc: z or dz; tc2: hd; tz: the saved z (backward).
// The units come in Note [Dynamic unit order] (kDynamic: the producer thread takes them from
// `units`) or in the static order (StaticUnits). kCluster = 2 (static order only): clusters of
// two CTAs share A's tiles (Note [Operand multicast]; ta's boxes are then 64 rows).
// kRowScale (the GLU's, Note [RMSNorm folded into the FFN]): act.row_scale is given; the
// forward's consumer scales its accumulators' rows as it stages them.
template <class T, int STAGES, Activation A, bool kBackward, bool kGlu, bool kDynamic, int kCluster,
          bool kRowScale = false>
__global__ void __launch_bounds__(512, 1)
    gemm_act_kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                    const __grid_constant__ CUtensorMap tc, const __grid_constant__ CUtensorMap tc2,
                    TileScheduler sched_in, UnitCounter units,
                    ActWarpgroup<T, A, kBackward, kGlu, kDynamic, kRowScale> act) {
#if FFN_SM90A_CODE && defined(__CUDA_ARCH__)
  static_assert(kCluster == 1 || !kDynamic, "multicast runs in the static order");
  using ML = Mainloop<T, 128, STAGES, 4, false, kBackward, kCluster>;
  using SH = ActShared<kBackward, kGlu, kDynamic>;
  extern __shared__ uint8_t smem_raw[];
  TileScheduler sched = sched_in;  // cluster and rank as constants where they are
  sched.cluster = kCluster;
  sched.rank = kCluster == 2 ? static_cast<int>(cluster_ctarank()) : 0;
  sched.share_b = false;
  const ML ml = ML::carve(smem_raw, SH::kBytes);
  const SH sh = SH::carve(ml.scratch);
  const auto ring = sh.ring(sched);
  if (threadIdx.x == 0) {
    prefetch_tensor_map(&ta);
    prefetch_tensor_map(&tb);
    ring.init();
    ml.init_barriers();  // ends with fence_barrier_init
  }
  // With multicast the partner's barriers must be initialised before this CTA's first load
  // signals them or its consumers arrive on them.
  if constexpr (kCluster == 2)
    cluster_sync();
  else
    __syncthreads();
  grid_dependency_wait();  // Note [Dependent launch]
  launch_dependents();
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
        ml.produce_unit(&ta, &tb, sched.unit(u), stage, phase, kGlu && !kBackward ? act.n : 0, k);
        u = after;
      }
    }
  } else if (wg == 1) {
    regs_alloc<232>();
    const int wg_thread = threadIdx.x % 128;
    float acc0[64], acc1[64];
    // The GLU forward's row scale (kRowScale): this thread's rows r and r + 8 of both halves,
    // [2h + 0/1], of the even tiles (s_even) and the odd ones (s_odd), each loaded when the
    // tile's unit is taken, about a tile before its staging (tile 0's: at the start), and read
    // where it is staged: no copy between them waits for a load.
    constexpr bool kScaleRows = kRowScale && !kBackward;
    float s_even[4] = {1.0f, 1.0f, 1.0f, 1.0f}, s_odd[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    const auto load_scales = [&](const Unit& un, float(&s)[4]) {
      const int r = 128 * un.tm + 16 * (wg_thread / 32) + (wg_thread % 32) / 4;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = r + 64 * (i / 2) + 8 * (i % 2);
        s[i] = row < act.m ? __ldg(act.row_scale + row) : 0.0f;
      }
    };
    // Tile 0's start (each later tile's is marked where the one before it is staged); trace.cuh
    // counts a CTA's tiles from it.
    if (wg_thread == 0) trace::mark(0, 0);
    // Note [Overlapped tile boundary]: the halves are staged between the next tile's MMAs.
    ml.consume_overlapped(
        acc0, acc1,
        [&](int j) {
          const int u = ring.at(j);
          if constexpr (kScaleRows)
            if (u >= 0) {
              if (j & 1)
                load_scales(sched.unit(u), s_odd);
              else
                load_scales(sched.unit(u), s_even);
            }
          return u < 0 ? -1 : sched.unit(u).kbs;
        },
        [&](int j, int h, float(&acc)[64]) {
          const int b = j & 1;
          if (h == 0) {
            if (wg_thread == 0) trace::mark(1, j);
            if (j >= 2) named_barrier_sync(SH::empty_barrier(b), SH::kHandoff);  // tile j - 2's
            if (wg_thread == 0) trace::mark(2, j);
          }
          if constexpr (kScaleRows) {  // rows r and r + 8 of this half: stage_box's s0, s1
            const bool odd = j & 1;
            const float s0 = h == 0 ? (odd ? s_odd[0] : s_even[0]) : (odd ? s_odd[2] : s_even[2]);
            const float s1 = h == 0 ? (odd ? s_odd[1] : s_even[1]) : (odd ? s_odd[3] : s_even[3]);
            stage_block<T, 64, true>(acc, sh.staged(b), h, wg_thread, s0, s1);
          } else {
            stage_block<T>(acc, sh.staged(b), h, wg_thread);
          }
          if (h == 1) {
            fence_proxy_async_smem();  // the forward's z leaves by TMA straight from here
            named_barrier_arrive(SH::full_barrier(b), SH::kHandoff);
            if (wg_thread == 0) trace::mark(3, j);
            if (wg_thread == 0) trace::mark(0, j + 1);
          }
        });
  } else {
    regs_dealloc<120>();
    act.run(wg - 2, sh, sched, &tc, &tc2);
  }
  // Multicast: the partner still loads into this CTA's stages and arrives on its barriers
  // until it is done; neither CTA's shared memory may go before both are.
  if constexpr (kCluster == 2) cluster_sync();
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

// The plain epilogues, which take tiles 192 columns wide (the activation ones walk their
// staged tiles in runs that need a power-of-two width).
template <class Epi>
struct TakesWidth192 : std::false_type {};
template <class T>
struct TakesWidth192<StoreC<T>> : std::true_type {};
template <class T, bool ROPE>
struct TakesWidth192<StoreCTma<T, ROPE>> : std::true_type {};
template <>
struct TakesWidth192<StorePartial> : std::true_type {};

// Launches kKernel (`threads` threads, `smem` bytes of dynamic shared memory) as a persistent
// grid over `units` units in clusters of kCluster CTAs (Note [Operand multicast]): one CTA an
// SM, or as many clusters as can be resident at once; as a dependent launch where
// gemm_dependent_launch() is on and the stream is not capturing (Note [Dependent launch]).
// The shared-memory attribute and that count are set up once per kernel and device.
template <auto kKernel, int kCluster, class... Args>
void launch_persistent(int threads, int smem, int units, int dev, const Args&... args) {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = kCluster;
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream(dev);
  cfg.attrs = attrs;
  cfg.numAttrs = 1;  // the occupancy query below with the cluster only
  static std::once_flag once[8];
  static int resident[8];
  std::call_once(once[dev % 8], [&] {
    FFN_CHECK_CUDA(
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    resident[dev % 8] = properties(dev).multiProcessorCount;
    if constexpr (kCluster > 1) {
      cfg.gridDim = dim3(static_cast<unsigned>(resident[dev % 8]));
      int clusters = 0;
      FFN_CHECK_CUDA(cudaOccupancyMaxActiveClusters(&clusters, kKernel, &cfg));
      FFN_CHECK(clusters > 0, "[sm90_gemm] no cluster of ", kCluster, " CTAs fits on device ", dev);
      resident[dev % 8] = clusters * kCluster;
    }
  });
  cfg.gridDim = dim3(static_cast<unsigned>(std::min(units * kCluster, resident[dev % 8])));
  cfg.numAttrs = ffn::gemm_dependent_launch() && !capturing(dev) ? 2 : 1;
  FFN_CHECK_CUDA(cudaLaunchKernelEx(&cfg, kKernel, args...));
}

// c2: the second output of a two-output epilogue (ActTma), else null. kCluster = 2: A's tiles
// shared in clusters (Note [Operand multicast]; K-major A, an even number of column tiles), or
// with kShareB B's (an even number of row tiles). group_m: Note [Tile groups].
template <class T, int BN, int STAGES, bool PINGPONG, bool A_MN, bool B_MN, class Epi,
          int kCluster = 1, bool kShareB = false>
void launch(const Tensor& a, const Tensor& b, const Tensor& c, const Epi& epi, int splits,
            int group_m, const Tensor* c2) {
  static_assert(!(PINGPONG && kShareB), "the ping-pong kernel shares A only");
  using ML = Mainloop<T, BN, STAGES, PINGPONG ? 4 : 8, A_MN, B_MN, kCluster, kShareB>;
  constexpr int kSplitA = kShareB ? 1 : kCluster, kSplitB = kShareB ? 2 : 1;
  const int dev = a.device().index;
  DeviceGuard guard(dev);
  const int m = static_cast<int>(c.size(0)), n = static_cast<int>(c.size(1));
  const int k = static_cast<int>(A_MN ? a.size(0) : a.size(1));
  // K-major operands load as one box of 128 (BN) rows (the shared one: half as many, from
  // each CTA of the cluster), MN-major ones as 64-row boxes.
  const CUtensorMap ta = tensor_map(a, A_MN ? 64 : ML::BM / kSplitA),
                    tb = tensor_map(b, B_MN ? 64 : BN / kSplitB);
  CUtensorMap tc{}, tc2{};
  if constexpr (StoresWithTma<Epi>::value) tc = tensor_map(c, 64);
  if (c2) tc2 = tensor_map(*c2, 64);
  TileScheduler sched{(m + ML::BM - 1) / ML::BM / kSplitB, (n + BN - 1) / BN / kSplitA,
                      (k + ML::BK - 1) / ML::BK, splits};
  sched.cluster = kCluster;
  sched.share_b = kShareB;
  sched.group_shift = std::countr_zero(static_cast<unsigned>(group_m));  // a power of two
  constexpr auto kernel = [] {
    if constexpr (PINGPONG)
      return gemm_pingpong_kernel<T, BN, STAGES, A_MN, B_MN, Epi, kCluster>;
    else
      return gemm_kernel<T, BN, STAGES, A_MN, B_MN, Epi, kCluster, kShareB>;
  }();
  const int smem = ML::smem_bytes(2 * Epi::template kScratchBytes<BN, PINGPONG ? 128 : 64>);
  launch_persistent<kernel, kCluster>(384, smem, sched.num_units(), dev, ta, tb, tc, tc2, sched,
                                      epi);
}

// launch() in clusters where multicast is on (Note [Operand multicast]): the cooperative
// kernel's wider tiles (BN = 192, 256) share B, the larger operand tile, where the row tiles
// pair up (an MN-major B only at BN = 256: whole boxes each); otherwise A is shared where the
// column tiles pair up (K-major A only); else alone.
template <class T, int BN, int STAGES, bool PINGPONG, bool A_MN, bool B_MN, class Epi>
void launch_paired(const Tensor& a, const Tensor& b, const Tensor& c, const Epi& epi, int splits,
                   int group_m, const Tensor* c2) {
  if (ffn::gemm_multicast()) {
    if constexpr (!PINGPONG && BN > 128 && (!B_MN || BN % 128 == 0)) {
      if (((c.size(0) + 127) / 128) % 2 == 0) {
        launch<T, BN, STAGES, PINGPONG, A_MN, B_MN, Epi, 2, true>(a, b, c, epi, splits, group_m,
                                                                  c2);
        return;
      }
    }
    if constexpr (!A_MN) {
      if (((c.size(1) + BN - 1) / BN) % 2 == 0) {
        launch<T, BN, STAGES, PINGPONG, A_MN, B_MN, Epi, 2>(a, b, c, epi, splits, group_m, c2);
        return;
      }
    }
  }
  launch<T, BN, STAGES, PINGPONG, A_MN, B_MN, Epi, 1>(a, b, c, epi, splits, group_m, c2);
}

// How a product is cut: schedule, tile width, split count and tile order.
struct Tiling {
  bool pingpong = false;
  int bn = 128;
  int splits = 1;
  int group_m = 8;  // Note [Tile groups]
};

// As many stages as the 227 KiB of shared memory per block leave after the epilogue's
// scratch (both consumer warpgroups'), the barriers and the 1024-byte alignment slack; at
// most 6 (4 for BN = 256), beyond which the measured rate no longer improves.
template <class Epi, int BN, bool PINGPONG>
constexpr int stages_for() {
  constexpr int scratch = 2 * Epi::template kScratchBytes<BN, PINGPONG ? 128 : 64>;
  constexpr int stage = (128 + BN) * 64 * 2;
  constexpr int fit = (232448 - 1024 - 256 - scratch) / stage;
  constexpr int cap = BN > 128 ? 4 : 6;
  static_assert(fit >= 2, "the epilogue's scratch leaves no room for a ring");
  return fit < cap ? fit : cap;
}

// Cooperative: BN = 256, 192 or 128. Ping-pong: BN = 128 (two 64×128 accumulator blocks per
// warpgroup).
template <class T, bool A_MN, bool B_MN, class Epi>
void launch_tiling(const Tensor& a, const Tensor& b, const Tensor& c, const Epi& epi,
                   const Tiling& t, const Tensor* c2 = nullptr) {
  if (t.pingpong)
    launch_paired<T, 128, stages_for<Epi, 128, true>(), true, A_MN, B_MN>(a, b, c, epi, t.splits,
                                                                          t.group_m, c2);
  else if (t.bn == 256)
    launch_paired<T, 256, stages_for<Epi, 256, false>(), false, A_MN, B_MN>(a, b, c, epi, t.splits,
                                                                            t.group_m, c2);
  else if (t.bn == 192)
    if constexpr (TakesWidth192<Epi>::value)
      launch_paired<T, 192, stages_for<Epi, 192, false>(), false, A_MN, B_MN>(
          a, b, c, epi, t.splits, t.group_m, c2);
    else
      FFN_CHECK(false, "[sm90_gemm] this epilogue has no 192-column tiles");
  else
    launch_paired<T, 128, stages_for<Epi, 128, false>(), false, A_MN, B_MN>(a, b, c, epi, t.splits,
                                                                            t.group_m, c2);
}

// The activation GEMM's column tiles: 128 columns, or the GLU forward's 64-column blocks.
template <bool kBackward, bool kGlu>
int act_tiles_n(int n) {
  return kGlu && !kBackward ? n / 64 : (n + 127) / 128;
}

// Note [Activation warpgroup]: forward (a = x, b = W1 [h, d]: out = z) or backward (a = dz2,
// b = W2 [d, h], z the saved z: out = dz); hd the second output.
// db_part (backward, optional): [tiles_m, n] fp32 column sums of dz per 128-row tile; mask:
// the hidden dropout's (inactive: none). kGlu (Note [GLU warpgroup]): forward b = W [2h, d],
// out = z [m, 2h], hd = the GLU's output [m, h], h % 64 == 0; backward b = W2 [d, h], z the
// saved [m, 2h], out = dz [m, 2h], hd = the recomputed GLU output [m, h], db_part [tiles_m,
// 2h].
// The units' order (Note [Dynamic unit order]): dynamic under gemm_dynamic_order()
// (kernels/gemm.h: data parallelism), else static; kCluster = 2 in clusters sharing A
// (act_multicast below).
template <class T, Activation A, bool kBackward, bool kGlu, bool kDynamic, int kCluster,
          bool kRowScale = false>
void launch_act_in(const Tensor& a, const Tensor& b, const Tensor& out, const Tensor& hd,
                   const Tensor* z, const T* bias, const DeviceMask& mask, float* db_part,
                   const float* row_scale = nullptr) {
  constexpr int kStage = 2 * 128 * 64 * 2;
  constexpr int kStages =
      std::min(6, (232448 - 1024 - 256 - ActShared<kBackward, kGlu, kDynamic>::kBytes) / kStage);
  static_assert(kStages >= 3, "the activation warpgroup's tiles leave too little of a ring");
  using ML = Mainloop<T, 128, kStages, 4, false, kBackward, kCluster>;
  const int dev = a.device().index;
  DeviceGuard guard(dev);
  const int m = static_cast<int>(out.size(0));
  const int n = static_cast<int>(kGlu ? hd.size(1) : out.size(1));  // kGlu: h
  const int k = static_cast<int>(a.size(1));
  // Multicast (Note [Operand multicast]) loads A as two 64-row halves.
  const CUtensorMap ta = tensor_map(a, ML::BM / kCluster),
                    tb = tensor_map(b, kBackward || kGlu ? 64 : 128);
  const CUtensorMap tc = tensor_map(out, 64);
  const CUtensorMap tc2 = kBackward ? CUtensorMap{} : tensor_map(hd, 64);
  TileScheduler sched{(m + 127) / 128, act_tiles_n<kBackward, kGlu>(n) / kCluster, (k + 63) / 64,
                      1};
  sched.cluster = kCluster;
  const int forced_group = ffn::gemm_group_rows();
  const int group_m = forced_group > 0
                          ? forced_group
                          : group_rows(sched.tiles_m, static_cast<double>(b.numel()) * sizeof(T),
                                       2.0 * 128 * k, properties(dev).l2CacheSize);
  sched.group_shift = std::countr_zero(static_cast<unsigned>(group_m));  // a power of two
  constexpr auto kernel =
      gemm_act_kernel<T, kStages, A, kBackward, kGlu, kDynamic, kCluster, kRowScale>;
  const int smem = ML::smem_bytes(ActShared<kBackward, kGlu, kDynamic>::kBytes);
  const UnitCounter units = kDynamic ? unit_counter(dev) : UnitCounter{};
  ActWarpgroup<T, A, kBackward, kGlu, kDynamic, kRowScale> act{bias, m, n, db_part};
  act.mask = mask;
  act.row_scale = row_scale;
  if constexpr (kBackward) {
    act.z = static_cast<const T*>(z->data_ptr());
    act.hd = static_cast<T*>(hd.data_ptr());
    if constexpr (kGlu) act.dz = static_cast<T*>(out.data_ptr());
  }
#if defined(FFN_GEMM_TRACE)
  static int launches = 0;
  unsigned long long* traced = trace::arm(launches, stream(dev));
#endif
  launch_persistent<kernel, kCluster>(512, smem, sched.num_units(), dev, ta, tb, tc, tc2, sched,
                                      units, act);
#if defined(FFN_GEMM_TRACE)
  if (traced) {
    char what[160];
    std::snprintf(what, sizeof what, "%s%s m %d n %d k %d%s%s", kBackward ? "bwd" : "fwd",
                  kGlu ? " glu" : "", m, n, k, mask.active ? " dropout" : "", db_part ? " db" : "");
    trace::report(traced, stream(dev), what);
  }
#endif
}

// Whether the activation kernel runs in clusters sharing A (Note [Operand multicast]): in the
// static order, where the column tiles pair up, and where its mainloop rather than its
// activation warps is the bound: every forward, and the plain backward from K = 2048 on.
// Measured (H100, session 31, ffn-bench --act-epilogues, 0.2 s windows, alternated twice,
// ms without -> with): forward ffn_d4096 2.31 -> 1.97, geglu_d2048 2.32 -> 1.98, geglu_d1024
// 0.571 -> 0.540, ffn_d1024 0.288 -> 0.277, gpt2's fc1 0.181 -> 0.175; backward with db
// ffn_d4096 (K = 4096) 2.43 -> 2.10, but at K <= 1024 (ffn_d1024, gpt2) within noise either
// way and the GLU's 1.357 -> 1.422 (geglu_d2048, K = 2048) and 0.465 -> 0.470: where the
// activation warps are the bound, the pair's rings in lockstep make each CTA wait for the
// slower of the two.
template <bool kBackward, bool kGlu>
bool act_multicast(int n, int k) {
  if (ffn::gemm_dynamic_order() || !ffn::gemm_multicast()) return false;
  if (act_tiles_n<kBackward, kGlu>(n) % 2 != 0) return false;
  return !kBackward || (!kGlu && k >= 2048);
}

// The order (Note [Dynamic unit order]) and multicast (act_multicast). row_scale: the GLU's
// (ActWarpgroup::row_scale), optional [m]; its kernels run in the static order (neither the
// order nor multicast changes a bit), the forward in clusters where multicast is on and the
// column tiles pair up, as act_multicast has the unscaled one: fewer instantiations.
template <class T, Activation A, bool kBackward, bool kGlu = false>
void launch_act(const Tensor& a, const Tensor& b, const Tensor& out, const Tensor& hd,
                const Tensor* z, const T* bias, const DeviceMask& mask, float* db_part = nullptr,
                const float* row_scale = nullptr) {
  const int n = static_cast<int>(kGlu ? hd.size(1) : out.size(1));
  const int k = static_cast<int>(a.size(1));
  if constexpr (kGlu) {
    if (row_scale) {
      if constexpr (!kBackward) {
        if (ffn::gemm_multicast() && act_tiles_n<kBackward, kGlu>(n) % 2 == 0) {
          launch_act_in<T, A, kBackward, kGlu, false, 2, true>(a, b, out, hd, z, bias, mask,
                                                               db_part, row_scale);
          return;
        }
      }
      launch_act_in<T, A, kBackward, kGlu, false, 1, true>(a, b, out, hd, z, bias, mask, db_part,
                                                           row_scale);
      return;
    }
  }
  if (ffn::gemm_dynamic_order()) {
    launch_act_in<T, A, kBackward, kGlu, true, 1>(a, b, out, hd, z, bias, mask, db_part);
    return;
  }
  if constexpr (!(kBackward && kGlu)) {  // the GLU's backward never runs in clusters
    if (act_multicast<kBackward, kGlu>(n, k)) {
      launch_act_in<T, A, kBackward, kGlu, false, 2>(a, b, out, hd, z, bias, mask, db_part);
      return;
    }
  }
  launch_act_in<T, A, kBackward, kGlu, false, 1>(a, b, out, hd, z, bias, mask, db_part);
}

}  // namespace ffn::cuda::gemm
