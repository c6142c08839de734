// kernels/cuda/gemm/sm90_gemm_norm.cu — the Hopper GEMM that ends a pre-norm block's branch:
// the residual add, its dropout and the next norm in the epilogue (sm90_gemm.h,
// sm90_gemm_nt_add_norm; Note [Residual add and norm in the epilogue] in norm_epilogue.cuh).
#include <string>
#include <utility>

#include "kernels/checks.h"
#include "kernels/cuda/gemm/kernel.cuh"
#include "kernels/cuda/gemm/norm_epilogue.cuh"
#include "kernels/cuda/gemm/sm90_gemm.h"

namespace ffn::cuda {

namespace gemm {
namespace {

// Note [Residual add and norm in the epilogue]'s kernel: the cooperative kernel (kernel.cuh's
// gemm_kernel: a producer warpgroup, two consumer warpgroups sharing 128-row tiles) in
// clusters of kC CTAs, each unit a row block of kC tiles of BN columns, the CTA of cluster
// rank r computing tile r (no multicast: each loads its own A). The row block's barrier is
// initialised and made visible to the cluster before any CTA can arrive on it.
template <class T, int BN, int STAGES, int kC>
__global__ void __launch_bounds__(384, 1)
    add_norm_kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                    TileScheduler sched_in, AddNormEpi<T> epi) {
#if FFN_SM90A_CODE && defined(__CUDA_ARCH__)
  TileScheduler sched = sched_in;
  sched.cluster = kC;
  sched.rank = static_cast<int>(cluster_ctarank());
  sched.share_b = false;
  using ML = Mainloop<T, BN, STAGES, 8, false, false, 1>;
  constexpr int kScratch = AddNormEpi<T>::template kScratchBytes<BN, 64>;
  extern __shared__ uint8_t smem_raw[];
  const ML ml = ML::carve(smem_raw, 2 * kScratch);
  if (threadIdx.x == 0) {
    mbar_init(AddNormEpi<T>::template stats_barrier<BN>(ml.scratch), kC);
    fence_barrier_init();
  }
  cluster_sync();
  if (!enter_consumer(ml, &ta, &tb, sched)) return;
  const int c = threadIdx.x / 128 - 1;
  int stage = 0;
  uint32_t phase = 0;
  float acc[BN / 2];
  TileCtx ctx = TileCtx::of_consumer(c, ml.scratch, kScratch);
  int j = 0;
  for (int u = sched.first_unit(); u < sched.num_units(); u += sched.unit_stride(), ++j) {
    const Unit w = sched.unit(u);
    ctx.place(w.tm * ML::BM + 64 * c, w.tn * BN);
    epi.template prefetch<BN>(ctx.rows, ctx.cols, ctx.wg_thread);
    ml.consume(acc, c, w.kbs, stage, phase);
    epi.template tile<kC>(acc, ctx, j);
  }
  // The cluster's CTAs arrive on each other's barriers until their last tile: none leaves
  // before all are past it.
  cluster_sync();
#endif
}

template <class T, int BN, int kC>
void launch_add_norm(const Tensor& x, const Tensor& w, const AddNormEpi<T>& epi, int m) {
  constexpr int kScratch = AddNormEpi<T>::template kScratchBytes<BN, 64>;
  constexpr int kStages = stages_for<AddNormEpi<T>, BN, false>();
  using ML = Mainloop<T, BN, kStages, 8, false, false, 1>;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  const int k = static_cast<int>(x.size(1));
  const CUtensorMap ta = tensor_map(x, ML::BM), tb = tensor_map(w, BN);
  TileScheduler sched{(m + ML::BM - 1) / ML::BM, 1, (k + ML::BK - 1) / ML::BK, 1};
  sched.cluster = kC;
  sched.group_shift = 0;  // a unit is a whole row block: the rows in order
  launch_persistent<add_norm_kernel<T, BN, kStages, kC>, kC>(
      384, ML::smem_bytes(2 * kScratch), sched.num_units(), dev, ta, tb, sched, epi);
}

// The tile width and cluster size for rows of n: 192 columns in 2 or 4 tiles, else 128 in 2
// to 4; 0 where none fits (or tile_n, when forced, does not). 256-column tiles spill (32
// bytes a thread at 168 registers) and are not built.
std::pair<int, int> add_norm_tiles(int64_t n, int tile_n) {
  for (int bn : {192, 128}) {
    if (tile_n > 0 && bn != tile_n) continue;
    const int64_t c = n / bn;
    if (n % bn == 0 && c >= 2 && c <= 4 && !(bn == 192 && c == 3)) return {bn, static_cast<int>(c)};
  }
  return {0, 0};
}

bool aligned(const Tensor& t, int bytes) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % bytes == 0;
}

}  // namespace
}  // namespace gemm

bool sm90_gemm_add_norm_supported(const Tensor& x, const Tensor& w, const Tensor& res,
                                  const Tensor& a, const Tensor& y) {
  if (!sm90_gemm_supported(x, w, y, false, true)) return false;
  const int64_t m = y.size(0), n = y.size(1);
  if (gemm::add_norm_tiles(n, 0).first == 0 || !gemm::aligned(y, 16)) return false;
  for (const Tensor* t : {&res, &a})
    if (!t->defined() || !t->is_cuda() || t->dtype() != DType::f32 || t->shape() != y.shape() ||
        !t->is_contiguous() || !gemm::aligned(*t, 32))
      return false;
  return true;
}

void sm90_gemm_nt_add_norm(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& res,
                           const DropoutSpec& d, const Tensor& g, const Tensor& beta, double eps,
                           Tensor& a, Tensor& y, Tensor& mean, Tensor& rstd, int tile_n) {
  const char* op = "sm90_gemm_nt_add_norm";
  FFN_CHECK(sm90_gemm_add_norm_supported(x, w, res, a, y), "[", op, "] cannot run x ", x.desc(),
            " · w ", w.desc(), "ᵀ with res ", res.desc(), " -> a ", a.desc(), ", y ", y.desc(),
            " (sm90_gemm_add_norm_supported says which operands it takes)");
  detail::check_dropout(d, op);
  const int64_t m = y.size(0), n = y.size(1);
  auto check = [&](const Tensor& t, const char* name, const Shape& shape, DType dt, int align) {
    FFN_CHECK(t.defined() && t.is_cuda() && t.device() == y.device() && t.dtype() == dt &&
                  t.shape() == shape && t.is_contiguous() && gemm::aligned(t, align),
              "[", op, "] ", name, " must be a contiguous, ", align, "-byte aligned ",
              shape_str(shape), " ", dtype_name(dt), " tensor on y's GPU, got ",
              t.defined() ? t.desc() : std::string("none"));
  };
  check(g, "the norm's weight", {n}, y.dtype(), 16);
  if (beta.defined()) check(beta, "the norm's bias", {n}, y.dtype(), 16);
  if (bias.defined()) check(bias, "the bias", {n}, y.dtype(), 2);
  FFN_CHECK(!(beta.defined() && !mean.defined()), "[", op,
            "] RMSNorm (mean undefined) takes no norm bias");
  if (mean.defined()) check(mean, "mean", {m}, DType::f32, 4);
  check(rstd, "rstd", {m}, DType::f32, 4);
  FFN_CHECK(tile_n == 0 || tile_n == 128 || tile_n == 192, "[", op,
            "] tile_n must be 0 (automatic), 128 or 192, got ", tile_n);
  FFN_CHECK(eps >= 0, "[", op, "] eps must be >= 0, got ", eps);
  if (m == 0) return;
  const auto [bn, kc] = gemm::add_norm_tiles(n, tile_n);
  FFN_CHECK(bn > 0, "[", op, "] rows of ", n, " do not split into 2 to 4 tiles of ",
            tile_n > 0 ? std::to_string(tile_n) : std::string("192 or 128"), " columns");
  Tensor part = Tensor::empty({kc, m, 2}, DType::f32, y.device());
  auto run = [&]<class T>() {
    auto p = [](const Tensor& v) {
      return v.defined() ? static_cast<const T*>(v.data_ptr()) : nullptr;
    };
    const gemm::AddNormEpi<T> epi{p(bias),
                                  static_cast<const float*>(res.data_ptr()),
                                  static_cast<float*>(a.data_ptr()),
                                  static_cast<T*>(y.data_ptr()),
                                  p(g),
                                  p(beta),
                                  mean.defined() ? static_cast<float*>(mean.data_ptr()) : nullptr,
                                  static_cast<float*>(rstd.data_ptr()),
                                  static_cast<float2*>(part.data_ptr()),
                                  static_cast<int>(m),
                                  static_cast<int>(n),
                                  kc,
                                  bn,
                                  static_cast<float>(eps),
                                  DeviceMask::from(d)};
    const int mi = static_cast<int>(m);
    if (bn == 192 && kc == 2) gemm::launch_add_norm<T, 192, 2>(x, w, epi, mi);
    if (bn == 192 && kc == 4) gemm::launch_add_norm<T, 192, 4>(x, w, epi, mi);
    if (bn == 128 && kc == 2) gemm::launch_add_norm<T, 128, 2>(x, w, epi, mi);
    if (bn == 128 && kc == 3) gemm::launch_add_norm<T, 128, 3>(x, w, epi, mi);
    if (bn == 128 && kc == 4) gemm::launch_add_norm<T, 128, 4>(x, w, epi, mi);
  };
  if (y.dtype() == DType::bf16)
    run.template operator()<__nv_bfloat16>();
  else
    run.template operator()<__half>();
}

}  // namespace ffn::cuda
