// kernels/cuda/gemm/sm90_gemm.cu — the Hopper GEMM kernel (kernels/cuda/gemm/sm90_gemm.h):
// composes the mainloop (mainloop.cuh), the tile scheduler and an epilogue, and the host side
// that builds the TMA tensor maps and launches a persistent grid.
#include "kernels/cuda/gemm/sm90_gemm.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <mutex>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "kernels/cuda/gemm/epilogue.cuh"
#include "kernels/cuda/gemm/mainloop.cuh"

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
                                               const CUtensorMap* tb, const TileScheduler& sched,
                                               int k_blocks) {
  if (threadIdx.x == 0) {
    prefetch_tensor_map(ta);
    prefetch_tensor_map(tb);
    ml.init_barriers();
  }
  __syncthreads();
  if (threadIdx.x / 128 == 0) {
    regs_dealloc<40>();
    if (threadIdx.x == 0) ml.produce(ta, tb, sched, k_blocks);
    return false;
  }
  regs_alloc<232>();
  return true;
}

template <class T, int BN, int STAGES, bool A_MN, bool B_MN, class Epi>
__global__ void __launch_bounds__(384, 1)
    gemm_kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                const __grid_constant__ CUtensorMap tc, TileScheduler sched, int k_blocks,
                Epi epi) {
#if FFN_SM90A_CODE && defined(__CUDA_ARCH__)
  using ML = Mainloop<T, BN, STAGES, 8, A_MN, B_MN>;
  constexpr int kScratch = Epi::template kScratchBytes<BN, 64>;
  extern __shared__ uint8_t smem_raw[];
  const ML ml = ML::carve(smem_raw, 2 * kScratch);
  if (!enter_consumer(ml, &ta, &tb, sched, k_blocks)) return;
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
  for (int t = blockIdx.x; t < sched.num_tiles(); t += gridDim.x) {
    int tm, tn;
    sched.coords(t, tm, tn);
    ml.consume(acc, c, k_blocks, stage, phase);
    // The accumulator layout of wgmma.cuh: rows 16·warp + lane/4 (+8), columns
    // 8·(i/4) + 2·(lane%4) (+1).
    ctx.rows = tm * ML::BM + 64 * c;
    ctx.cols = tn * BN;
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
                         int k_blocks, Epi epi) {
#if FFN_SM90A_CODE && defined(__CUDA_ARCH__)
  using ML = Mainloop<T, BN, STAGES, 4, A_MN, B_MN>;
  constexpr int kScratch = Epi::template kScratchBytes<BN, 128>;
  extern __shared__ uint8_t smem_raw[];
  const ML ml = ML::carve(smem_raw, 2 * kScratch);
  if (!enter_consumer(ml, &ta, &tb, sched, k_blocks)) return;
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
  for (int t = blockIdx.x; t < sched.num_tiles(); t += gridDim.x, ++j) {
    if ((j & 1) != w) {
      ML::skip(k_blocks, stage, phase);
      continue;
    }
    int tm, tn;
    sched.coords(t, tm, tn);
    // Mainloops take turns: wait until the other warpgroup's mainloop of the previous tile
    // is done. Only then are this tile's stages at most one phase ahead of their barriers,
    // which is what parity waits can tell apart.
    if (j > 0) {
      mbar_wait(&ml.order[1 - w], order_phase);
      order_phase ^= 1;
    }
    ml.consume_tile(acc0, acc1, k_blocks, stage, phase);
    if (threadIdx.x % 128 == 0) mbar_arrive(&ml.order[w]);
    ctx.cols = tn * BN;
    ctx.col0 = ctx.cols + 2 * (lane % 4);
    ctx.rows = tm * ML::BM;
    ctx.row0 = ctx.rows + 16 * warp + lane / 4;
    epi.tile2(acc0, acc1, ctx);
  }
  epilogue_drain(ctx);
#endif
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda needed).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    FFN_CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                    cudaEnableDefault, &q));
    FFN_CHECK(p && q == cudaDriverEntryPointSuccess,
              "[sm90_gemm] cuTensorMapEncodeTiled is not available from the driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A row-major [rows, cols] matrix as boxes of box_rows rows × 64 columns with 128-byte
// swizzling (for loads and stores alike).
CUtensorMap tensor_map(const Tensor& t, int box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(t.size(1)),
                              static_cast<cuuint64_t>(t.size(0))};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(t.size(1)) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = encode_fn()(
      &map, t.dtype() == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      2, const_cast<void*>(t.data_ptr()), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  FFN_CHECK(r == CUDA_SUCCESS, "[sm90_gemm] cuTensorMapEncodeTiled failed (", static_cast<int>(r),
            ") for a ", shape_str(t.shape()), " ", dtype_name(t.dtype()), " operand");
  return map;
}

template <class T, int BN, int STAGES, bool PINGPONG, bool A_MN, bool B_MN, class Epi>
void launch(const Tensor& a, const Tensor& b, const Tensor& c, const Epi& epi) {
  using ML = Mainloop<T, BN, STAGES, PINGPONG ? 4 : 8, A_MN, B_MN>;
  const int dev = a.device().index;
  DeviceGuard guard(dev);
  const int m = static_cast<int>(c.size(0)), n = static_cast<int>(c.size(1));
  const int k = static_cast<int>(A_MN ? a.size(0) : a.size(1));
  // K-major operands load as one box of 128 (BN) rows, MN-major ones as 64-row boxes.
  const CUtensorMap ta = tensor_map(a, A_MN ? 64 : ML::BM), tb = tensor_map(b, B_MN ? 64 : BN);
  CUtensorMap tc{};
  if constexpr (std::is_same_v<Epi, StoreCTma<T>>) tc = tensor_map(c, 64);
  const TileScheduler sched{(m + ML::BM - 1) / ML::BM, (n + BN - 1) / BN};
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
  const int grid = std::min(sched.num_tiles(), properties(dev).multiProcessorCount);
  kernel<<<grid, 384, smem, stream(dev)>>>(ta, tb, tc, sched, (k + ML::BK - 1) / ML::BK, epi);
  FFN_CHECK_CUDA(cudaGetLastError());
}

// Cooperative: BN = 256 where N fills it, else BN = 128. Ping-pong: BN = 128 (two 64×128
// accumulator blocks per warpgroup). As many stages as shared memory leaves after the
// epilogue's scratch (up to 227 KiB per block).
template <class T, bool A_MN, bool B_MN, class Epi>
void dispatch(const Tensor& a, const Tensor& b, const Tensor& c, const Epi& epi,
              Sm90Schedule schedule) {
  constexpr bool staged = std::is_same_v<Epi, BiasActDropout<T>>;
  // Measured (bench/RESULTS.md, session 6): ping-pong wins for the staged fc1 epilogue at
  // both FFN shapes, and is mixed for plain stores (BN = 128 costs at long K).
  if (schedule == Sm90Schedule::automatic)
    schedule = staged ? Sm90Schedule::pingpong : Sm90Schedule::cooperative;
  if (schedule == Sm90Schedule::pingpong)
    launch<T, 128, staged ? 4 : 6, true, A_MN, B_MN>(a, b, c, epi);
  else if (c.size(1) >= 256)
    launch<T, 256, staged ? 3 : 4, false, A_MN, B_MN>(a, b, c, epi);
  else
    launch<T, 128, staged ? 5 : 6, false, A_MN, B_MN>(a, b, c, epi);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace
}  // namespace gemm

bool sm90_gemm_supported(const Tensor& a, const Tensor& b, const Tensor& c, bool trans_a,
                         bool trans_b) {
  if (!a.defined() || !b.defined() || !c.defined() || !a.is_cuda()) return false;
  if (a.dtype() != b.dtype() || a.dtype() != c.dtype()) return false;
  if (a.dtype() != DType::bf16 && a.dtype() != DType::f16) return false;
  const cudaDeviceProp& p = properties(a.device().index);
  if (p.major != 9 || p.minor != 0) return false;
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
  // A is MN-major when transposed; B is K-major when transposed ([n, k] rows of K).
  auto run = [&]<class T, bool A_MN, bool B_MN>() {
    const T* bias = args.bias.defined() ? static_cast<const T*>(args.bias.data_ptr()) : nullptr;
    if (tma)
      gemm::dispatch<T, A_MN, B_MN>(a, b, c, gemm::StoreCTma<T>{bias, n}, args.schedule);
    else
      gemm::dispatch<T, A_MN, B_MN>(
          a, b, c,
          gemm::StoreC<T>{static_cast<T*>(c.data_ptr()), bias, static_cast<int>(c.size(0)), n},
          args.schedule);
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
    gemm::dispatch<T, false, false>(
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
