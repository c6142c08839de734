// kernels/cuda/gemm/sm90_gemm.cu — the Hopper GEMM kernel (kernels/cuda/gemm/sm90_gemm.h):
// composes the mainloop (mainloop.cuh), the tile scheduler and an epilogue, and the host side
// that builds the TMA tensor maps and launches a persistent grid.
#include "kernels/cuda/gemm/sm90_gemm.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <mutex>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "kernels/cuda/gemm/epilogue.cuh"
#include "kernels/cuda/gemm/mainloop.cuh"
#include "kernels/cuda/gemm/tensor_map.h"

namespace ffn::cuda {

namespace gemm {
namespace {

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
                const __grid_constant__ CUtensorMap tc, TileScheduler sched, Epi epi) {
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
                         const __grid_constant__ CUtensorMap tc, TileScheduler sched,
                         Epi epi) {
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
    epi.tile2(acc0, acc1, ctx);
  }
  epilogue_drain(ctx);
#endif
}

// A row-major [rows, cols] operand as boxes of box_rows rows × 64 columns (tensor_map.h).
CUtensorMap tensor_map(const Tensor& t, int box_rows) {
  return tensor_map_2d(t, box_rows, "sm90_gemm");
}

template <class T, int BN, int STAGES, bool PINGPONG, bool A_MN, bool B_MN, class Epi>
void launch(const Tensor& a, const Tensor& b, const Tensor& c, const Epi& epi, int splits) {
  using ML = Mainloop<T, BN, STAGES, PINGPONG ? 4 : 8, A_MN, B_MN>;
  const int dev = a.device().index;
  DeviceGuard guard(dev);
  const int m = static_cast<int>(c.size(0)), n = static_cast<int>(c.size(1));
  const int k = static_cast<int>(A_MN ? a.size(0) : a.size(1));
  // K-major operands load as one box of 128 (BN) rows, MN-major ones as 64-row boxes.
  const CUtensorMap ta = tensor_map(a, A_MN ? 64 : ML::BM), tb = tensor_map(b, B_MN ? 64 : BN);
  CUtensorMap tc{};
  if constexpr (std::is_same_v<Epi, StoreCTma<T>>) tc = tensor_map(c, 64);
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
  kernel<<<grid, 384, smem, stream(dev)>>>(ta, tb, tc, sched, epi);
  FFN_CHECK_CUDA(cudaGetLastError());
}

// Split-K's second pass (Note [Split-K]): c = Σ_s ws[s] (in split order) + bias, rounded to T.
// Four consecutive elements per thread (16-byte loads when n % 4 == 0).
template <class T>
__global__ void splitk_reduce_kernel(const float* __restrict__ ws, int splits, int64_t mn, int n,
                                     const T* __restrict__ bias, T* __restrict__ c) {
  const int64_t i0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i0 >= mn) return;
  if (n % 4 == 0) {
    float4 acc = *reinterpret_cast<const float4*>(ws + i0);
    for (int s = 1; s < splits; ++s) {
      const float4 v = *reinterpret_cast<const float4*>(ws + s * mn + i0);
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
    float r[4] = {acc.x, acc.y, acc.z, acc.w};
    const int col = static_cast<int>(i0 % n);
#pragma unroll
    for (int j = 0; j < 4; ++j) c[i0 + j] = from_acc<T>(bias ? r[j] + to_acc(bias[col + j]) : r[j]);
    return;
  }
  for (int64_t i = i0; i < i0 + 4 && i < mn; ++i) {
    float acc = ws[i];
    for (int s = 1; s < splits; ++s) acc += ws[s * mn + i];
    c[i] = from_acc<T>(bias ? acc + to_acc(bias[i % n]) : acc);
  }
}

// How a plain product is cut: schedule, tile width and split count.
struct Tiling {
  bool pingpong = false;
  int bn = 128;
  int splits = 1;
};

// Note [Split-K]'s choice, from the shape and the SM count only (so a given GPU model always
// cuts a shape the same way and results are reproducible). Products that fill the GPU keep
// the measured default (cooperative, BN = 256 where N allows). Those with fewer tiles than
// SMs take the tile width and split count that minimise a cost model: waves × K blocks per
// unit × the time of one K block of a tile (from the measured mainloop rate, about 6 TFLOP/s
// per SM), plus for split-K the workspace traffic (written and read once, 2.5 TB/s) and the
// reduce kernel's launch (4 us).
Tiling choose_tiling(int64_t m, int64_t n, int64_t k, int sms, Sm90Schedule schedule,
                     int forced_splits) {
  Tiling t;
  const int64_t k_blocks = (k + 63) / 64;
  auto tiles = [&](int bn) { return ((m + 127) / 128) * ((n + bn - 1) / bn); };
  if (schedule == Sm90Schedule::pingpong) {
    t.pingpong = true;
    t.bn = 128;
  } else {
    t.bn = n >= 256 ? 256 : 128;
  }
  if (forced_splits > 0) {
    t.splits = static_cast<int>(std::min<int64_t>(forced_splits, k_blocks));
    return t;
  }
  if (schedule != Sm90Schedule::automatic || tiles(t.bn) >= sms) return t;
  double best = INFINITY;
  for (int bn : {128, 256}) {
    if (bn == 256 && n < 256) continue;
    const double kb_time = 2.0 * 128 * bn * 64 / (bn == 256 ? 6.0e12 : 5.5e12);
    for (int s = 1; s <= 16 && s <= k_blocks / 4 + (s == 1); ++s) {
      const int64_t units = tiles(bn) * s;
      const double waves = static_cast<double>((units + sms - 1) / sms);
      double cost = waves * static_cast<double>((k_blocks + s - 1) / s) * kb_time;
      if (s > 1) cost += 8.0 * s * static_cast<double>(m) * static_cast<double>(n) / 2.5e12 + 4e-6;
      if (cost < best) best = cost, t.bn = bn, t.splits = s;
    }
  }
  return t;
}

// Cooperative: BN = 256 or 128 (choose_tiling). Ping-pong: BN = 128 (two 64×128
// accumulator blocks per warpgroup). As many stages as shared memory leaves after the
// epilogue's scratch (up to 227 KiB per block).
template <class T, bool A_MN, bool B_MN, class Epi>
void launch_tiling(const Tensor& a, const Tensor& b, const Tensor& c, const Epi& epi,
                   const Tiling& t) {
  constexpr bool staged = std::is_same_v<Epi, BiasActDropout<T>>;
  if (t.pingpong)
    launch<T, 128, staged ? 4 : 6, true, A_MN, B_MN>(a, b, c, epi, t.splits);
  else if (t.bn == 256)
    launch<T, 256, staged ? 3 : 4, false, A_MN, B_MN>(a, b, c, epi, t.splits);
  else
    launch<T, 128, staged ? 5 : 6, false, A_MN, B_MN>(a, b, c, epi, t.splits);
}

// The fused fc1 epilogue: measured (bench/RESULTS.md, session 6), ping-pong wins at both FFN
// shapes; never split.
template <class T>
void dispatch_fused(const Tensor& a, const Tensor& b, const Tensor& c,
                    const BiasActDropout<T>& epi, Sm90Schedule schedule) {
  Tiling t;
  t.pingpong = schedule != Sm90Schedule::cooperative;
  t.bn = !t.pingpong && c.size(1) >= 256 ? 256 : 128;
  launch_tiling<T, false, false>(a, b, c, epi, t);
}

// A plain product: C (+ bias) stored straight, or through split-K's workspace and reduce.
template <class T, bool A_MN, bool B_MN>
void dispatch_plain(const Tensor& a, const Tensor& b, Tensor& c, const T* bias, bool tma,
                    Sm90Schedule schedule, int forced_splits) {
  const int dev = a.device().index;
  const int64_t m = c.size(0), n = c.size(1), k = A_MN ? a.size(0) : a.size(1);
  const Tiling t =
      choose_tiling(m, n, k, properties(dev).multiProcessorCount, schedule, forced_splits);
  if (t.splits > 1) {
    Tensor ws = Tensor::empty({t.splits, m, n}, DType::f32, a.device());
    launch_tiling<T, A_MN, B_MN>(
        a, b, c, StorePartial{static_cast<float*>(ws.data_ptr()), static_cast<int>(m),
                              static_cast<int>(n)},
        t);
    const int64_t mn = m * n;
    const int64_t threads = (mn + 3) / 4;
    splitk_reduce_kernel<T><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream(dev)>>>(
        static_cast<const float*>(ws.data_ptr()), t.splits, mn, static_cast<int>(n), bias,
        static_cast<T*>(c.data_ptr()));
    FFN_CHECK_CUDA(cudaGetLastError());
    return;
  }
  if (tma)
    launch_tiling<T, A_MN, B_MN>(a, b, c, StoreCTma<T>{bias, static_cast<int>(n)}, t);
  else
    launch_tiling<T, A_MN, B_MN>(
        a, b, c, StoreC<T>{static_cast<T*>(c.data_ptr()), bias, static_cast<int>(m),
                           static_cast<int>(n)},
        t);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace
}  // namespace gemm

bool sm90_gemm_supported(const Tensor& a, const Tensor& b, const Tensor& c, bool trans_a,
                         bool trans_b) {
  if (!a.defined() || !b.defined() || !c.defined() || !a.is_cuda()) return false;
  if (a.dtype() != b.dtype() || a.dtype() != c.dtype()) return false;
  if (a.dtype() != DType::bf16 && a.dtype() != DType::f16) return false;
  if (!gemm::sm90a_code_on(a.device().index)) return false;  // Note [sm_90a code]
  if (a.dim() != 2 || b.dim() != 2 || c.dim() != 2) return false;
  if (!a.is_contiguous() || !b.is_contiguous() || !c.is_contiguous()) return false;
  const int64_t m = trans_a ? a.size(1) : a.size(0), k = trans_a ? a.size(0) : a.size(1);
  const int64_t n = trans_b ? b.size(0) : b.size(1), kb = trans_b ? b.size(1) : b.size(0);
  if (m <= 0 || n <= 0 || k <= 0 || kb != k || c.size(0) != m || c.size(1) != n) return false;
  // TMA: 16-byte aligned rows and base pointers; coordinates fit in int.
  if (a.size(1) % 8 != 0 || b.size(1) % 8 != 0) return false;
  if (!gemm::aligned16(a.data_ptr()) || !gemm::aligned16(b.data_ptr())) return false;
  constexpr int64_t kMax = int64_t{1} << 31;
  return m < kMax && n < kMax && k < kMax;
}

void sm90_gemm(const Tensor& a, const Tensor& b, Tensor& c, const Sm90GemmArgs& args) {
  FFN_CHECK(sm90_gemm_supported(a, b, c, args.trans_a, args.trans_b),
            "[sm90_gemm] cannot run a ", shape_str(a.shape()), " ", dtype_name(a.dtype()),
            args.trans_a ? "ᵀ" : "", " · ", shape_str(b.shape()), " ", dtype_name(b.dtype()),
            args.trans_b ? "ᵀ" : "", " -> ", shape_str(c.shape()), " ", dtype_name(c.dtype()),
            " product (sm90_gemm_supported says which operands it takes)");
  const int n = static_cast<int>(c.size(1));
  if (args.bias.defined())
    FFN_CHECK(args.bias.is_cuda() && args.bias.dtype() == c.dtype() && args.bias.dim() == 1 &&
                  args.bias.size(0) == n && args.bias.is_contiguous(),
              "[sm90_gemm] bias must be a contiguous [", n, "] ", dtype_name(c.dtype()),
              " tensor on the GPU, got ", shape_str(args.bias.shape()), " ",
              dtype_name(args.bias.dtype()));
  const bool tma = args.tma_store && n % 8 == 0 && gemm::aligned16(c.data_ptr());
  FFN_CHECK(args.splits >= 0, "[sm90_gemm] splits must be >= 0 (0: automatic), got ", args.splits);
  // A is MN-major when transposed; B is K-major when transposed ([n, k] rows of K).
  auto run = [&]<class T, bool A_MN, bool B_MN>() {
    const T* bias = args.bias.defined() ? static_cast<const T*>(args.bias.data_ptr()) : nullptr;
    gemm::dispatch_plain<T, A_MN, B_MN>(a, b, c, bias, tma, args.schedule, args.splits);
  };
  auto by_layout = [&]<class T>() {
    if (!args.trans_a && args.trans_b)
      run.template operator()<T, false, false>();
    else if (!args.trans_a && !args.trans_b)
      run.template operator()<T, false, true>();
    else if (args.trans_a && !args.trans_b)
      run.template operator()<T, true, true>();
    else
      run.template operator()<T, true, false>();
  };
  if (a.dtype() == DType::bf16)
    by_layout.template operator()<__nv_bfloat16>();
  else
    by_layout.template operator()<__half>();
}

void sm90_gemm_nt_bias_act_dropout(const Tensor& x, const Tensor& w, const Tensor& b,
                                   Activation act, const DropoutSpec& d, Tensor& hd, Tensor* z,
                                   Sm90Schedule schedule) {
  const int m = static_cast<int>(x.size(0)), n = static_cast<int>(w.size(0));
  for (const Tensor* t : {static_cast<const Tensor*>(&hd), static_cast<const Tensor*>(z), &b})
    FFN_CHECK(!t || !t->defined() || reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0,
              "[sm90_gemm] the fused fc1 epilogue needs 16-byte aligned hd, z and bias");
  FFN_CHECK(sm90_gemm_supported(x, w, hd, false, true),
            "[sm90_gemm] the fused fc1 cannot run x ", shape_str(x.shape()), " ",
            dtype_name(x.dtype()), ", w ", shape_str(w.shape()), " -> hd ", shape_str(hd.shape()));
  auto run = [&]<class T>() {
    gemm::dispatch_fused<T>(
        x, w, hd,
        gemm::BiasActDropout<T>{static_cast<T*>(hd.data_ptr()),
                                z ? static_cast<T*>(z->data_ptr()) : nullptr,
                                b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr, m, n,
                                act, DeviceMask::from(d)},
        schedule);
  };
  if (x.dtype() == DType::bf16)
    run.template operator()<__nv_bfloat16>();
  else
    run.template operator()<__half>();
}

}  // namespace ffn::cuda
