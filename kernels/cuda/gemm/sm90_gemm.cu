// kernels/cuda/gemm/sm90_gemm.cu — the Hopper GEMM's plain products
// (kernels/cuda/gemm/sm90_gemm.h): the tiling choice, split-K and its reduce, and the dropout fc1;
// the kernels themselves are composed in kernel.cuh.
#include "kernels/cuda/gemm/sm90_gemm.h"

#include <cmath>

#include "kernels/cuda/gemm/kernel.cuh"

namespace ffn::cuda {

namespace gemm {
namespace {

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

// Note [Split-K]'s choice, from the shape and the SM count only (so a given GPU model always
// cuts a shape the same way and results are reproducible). Products that fill the GPU keep
// the measured default (cooperative, BN = 256 where N allows). Those with fewer tiles than
// SMs take the tile width and split count that minimise a cost model: waves × K blocks per
// unit × the time of one K block of a tile (from the measured mainloop rate, about 6 TFLOP/s
// per SM), plus for split-K the workspace traffic (written and read once, 2.5 TB/s) and 12 us
// for the reduce kernel's launch and tail (4 us until session 37, when gpt2's fc1 weight
// gradient measured 0.134 ms unsplit in 192-column tiles against 0.141 split in four, which
// the model had put 0.5 us ahead). The tile order: Note [Tile groups]' group_rows unless
// forced (Sm90GemmArgs::group_m, else gemm_group_rows()).
Tiling choose_tiling(int64_t m, int64_t n, int64_t k, int sms, int64_t l2_bytes,
                     Sm90Schedule schedule, int forced_splits, int tile_n, int group_m) {
  Tiling t;
  const int64_t k_blocks = (k + 63) / 64, tiles_m = (m + 127) / 128;
  t.group_m = group_m > 0
                  ? group_m
                  : group_rows(tiles_m, 2.0 * static_cast<double>(n) * static_cast<double>(k),
                               2.0 * 128 * static_cast<double>(k), static_cast<double>(l2_bytes));
  auto tiles = [&](int bn) { return tiles_m * ((n + bn - 1) / bn); };
  if (schedule == Sm90Schedule::pingpong) {
    t.pingpong = true;
    t.bn = 128;
  } else {
    t.bn = tile_n > 0 ? tile_n : n >= 256 ? 256 : 128;
  }
  if (forced_splits > 0) {
    t.splits = static_cast<int>(std::min<int64_t>(forced_splits, k_blocks));
    return t;
  }
  if (schedule != Sm90Schedule::automatic || tile_n > 0 || tiles(t.bn) >= sms) return t;
  double best = INFINITY;
  for (int bn : {128, 192, 256}) {
    if (bn > 128 && n < bn) continue;
    const double kb_time = 2.0 * 128 * bn * 64 / (bn == 256 ? 6.0e12 : bn == 192 ? 5.8e12 : 5.5e12);
    for (int s = 1; s <= 16 && s <= k_blocks / 4 + (s == 1); ++s) {
      const int64_t units = tiles(bn) * s;
      const double waves = static_cast<double>((units + sms - 1) / sms);
      double cost = waves * static_cast<double>((k_blocks + s - 1) / s) * kb_time;
      if (s > 1) cost += 8.0 * s * static_cast<double>(m) * static_cast<double>(n) / 2.5e12 + 12e-6;
      if (cost < best) best = cost, t.bn = bn, t.splits = s;
    }
  }
  return t;
}

// The fused fc1 epilogue: measured (bench/RESULTS-2026-11-23.md, session 6), ping-pong wins at both FFN
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
                    Sm90Schedule schedule, int forced_splits, int tile_n, int group_m,
                    const RopeEpi& rope, const float* row_scale) {
  const int dev = a.device().index;
  const int64_t m = c.size(0), n = c.size(1), k = A_MN ? a.size(0) : a.size(1);
  const cudaDeviceProp& props = properties(dev);
  const Tiling t =
      choose_tiling(m, n, k, props.multiProcessorCount, props.l2CacheSize, schedule, forced_splits,
                    tile_n, group_m > 0 ? group_m : ffn::gemm_group_rows());
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
  if constexpr (!A_MN && !B_MN) {  // x·Wᵀ, the only layout the row epilogue is built for
    if (rope.table || row_scale) {
      launch_tiling<T, A_MN, B_MN>(
          a, b, c,
          StoreCTma<T, true>{bias, static_cast<int>(n), rope, row_scale, static_cast<int>(m)}, t);
      return;
    }
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

Sm90Plan sm90_gemm_plan(int64_t m, int64_t n, int64_t k, int sms, int64_t l2_bytes,
                        const Sm90GemmArgs& args) {
  const gemm::Tiling t = gemm::choose_tiling(m, n, k, sms, l2_bytes, args.schedule, args.splits,
                                             args.tile_n, args.group_m);
  return {t.pingpong, t.bn, t.splits, t.group_m};
}

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
  FFN_CHECK(args.schedule != Sm90Schedule::act_warpgroups,
            "[sm90_gemm] the act_warpgroups schedule is for the activation epilogues only");
  const bool tma = args.tma_store && n % 8 == 0 && gemm::aligned16(c.data_ptr());
  FFN_CHECK(args.splits >= 0, "[sm90_gemm] splits must be >= 0 (0: automatic), got ", args.splits);
  FFN_CHECK(args.tile_n == 0 || ((args.tile_n == 128 || args.tile_n == 192 || args.tile_n == 256) &&
                                 (args.tile_n == 128 || args.schedule != Sm90Schedule::pingpong)),
            "[sm90_gemm] tile_n must be 0 (automatic), 128, 192 or 256 (ping-pong: 128), got ",
            args.tile_n);
  FFN_CHECK(args.group_m >= 0 && args.group_m <= 4096 && (args.group_m & (args.group_m - 1)) == 0,
            "[sm90_gemm] group_m must be 0 (automatic) or a power of two up to 4096, got ",
            args.group_m);
  gemm::RopeEpi rope;
  if (args.rope_base > 0) {
    FFN_CHECK(!args.trans_a && args.trans_b && tma && args.rope_cols > 0 &&
                  args.rope_cols % 64 == 0 && args.rope_cols <= n && args.rope_seq > 0,
              "[sm90_gemm] rotary embeddings in the epilogue need x·Wᵀ stored through TMA (n % 8 "
              "== 0, 16-byte aligned C), rope_cols a positive multiple of 64 up to n and "
              "rope_seq > 0; got trans_a=",
              args.trans_a, ", trans_b=", args.trans_b, ", n=", n, ", rope_cols=", args.rope_cols,
              ", rope_seq=", args.rope_seq);
    const int dev = a.device().index;
    rope = {
        static_cast<const float2*>(rope_table(dev, args.rope_seq, 64, args.rope_base).data_ptr()),
        static_cast<int>(args.rope_seq), static_cast<int>(args.rope_cols)};
  }
  const float* row_scale = nullptr;
  if (args.row_scale.defined()) {
    const Tensor& s = args.row_scale;
    FFN_CHECK(!args.trans_a && args.trans_b && tma,
              "[sm90_gemm] a row scale in the epilogue needs x·Wᵀ stored through TMA (n % 8 == "
              "0, 16-byte aligned C); got trans_a=",
              args.trans_a, ", trans_b=", args.trans_b, ", n=", n);
    FFN_CHECK(s.is_cuda() && s.device() == a.device() && s.dtype() == DType::f32 && s.dim() == 1 &&
                  s.size(0) == c.size(0) && s.is_contiguous(),
              "[sm90_gemm] row_scale must be a contiguous [", c.size(0),
              "] f32 tensor on a's GPU, got ", shape_str(s.shape()), " ", dtype_name(s.dtype()));
    row_scale = static_cast<const float*>(s.data_ptr());
  }
  // A is MN-major when transposed; B is K-major when transposed ([n, k] rows of K).
  auto run = [&]<class T, bool A_MN, bool B_MN>() {
    const T* bias = args.bias.defined() ? static_cast<const T*>(args.bias.data_ptr()) : nullptr;
    gemm::dispatch_plain<T, A_MN, B_MN>(a, b, c, bias, tma, args.schedule,
                                        rope.table || row_scale ? 1 : args.splits, args.tile_n,
                                        args.group_m, rope, row_scale);
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
  FFN_CHECK(schedule != Sm90Schedule::act_warpgroups,
            "[sm90_gemm] the act_warpgroups schedule is for the activation epilogues only");
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
