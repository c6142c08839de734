// kernels/cuda/attention_sm90_fwd.cu — the Hopper attention forward (Note [Hopper
// attention], attention_sm90.cuh: 128 queries per CTA, 128-key tiles) and the entry points'
// shape check.
#include "kernels/cuda/attention_sm90.cuh"

namespace ffn::cuda {
namespace attn90 {
namespace {

constexpr int kFwdRows = 128, kFwdStages = 4;
using FwdPipe = Pipe<kFwdRows, kFwdStages>;

// Per key tile kt ≥ 1 (FlashAttention-3's intra-warpgroup overlap): issue S = Q·Kᵀ of tile
// kt, then O += P·V of tile kt − 1 (P packed at the end of the previous tile); wait for S
// only and run the softmax of tile kt on the CUDA cores while the tensor cores finish P·V;
// then wait for P·V, release tile kt − 1's stage, rescale O and pack P of tile kt. Every
// non-wgmma write of O and of P's registers happens with no wgmma in flight, which is what
// lets ptxas keep the wgmmas asynchronous (it serializes them otherwise, warning C7515).
template <class T, bool DROP>
__device__ void fwd_consume(const FwdPipe& p, const Geometry& g, int c, int j, int base,
                            int64_t bh, T* y, float* lse, int64_t q0, int nkt,
                            const DeviceMask& mask) {
  const int tid = threadIdx.x - 128 * (c + 1), warp = tid / 32, lane = tid % 32;
  const int gr = lane >> 2, cq = lane & 3;
  const int64_t t = g.t, qw = q0 + 64 * c + 16 * warp;
  uint8_t* mb = p.mask + (4 * c + warp) * 256;
  const float sl2 = g.scale * kLog2e;
  float o[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = 0.0f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
  float s[64];
  u32 pa[8][4];
  mbar_wait(&p.res_full[j & 1], (j >> 1) & 1);
  const uint64_t dq = smem_desc_k128(p.resident(j & 1, 0) + c * 64 * kRowBytes);
  auto issue_scores = [&](int kt) {
    const Slot<kFwdStages> at(base + kt);
    mbar_wait(&p.full[at.stage], at.phase);
    wgmma_fence();  // orders the registers written since the last wgmmas (s, O, P) before them
    mma_scores<128, T>(s, dq, smem_desc_k128(p.tile(at.stage, 0)));
    wgmma_commit();
  };
  auto issue_pv = [&](int kt) {
    mma_rows<128, T>(o, pa, smem_desc_mn128(p.tile(Slot<kFwdStages>(base + kt).stage, 1), kBox64));
    wgmma_commit();
  };
  // The softmax of tile kt's scores in s: the running max and sum (log2 units), P (dropped)
  // in s, and the factor alpha by which O must be rescaled. Trimmed to the few instructions
  // per score that bound this kernel (Note [Hopper attention]): the causal test only on the
  // diagonal tile, in 32-bit offsets; the max on the raw scores (scale > 0); one FFMA before
  // each exp2; the dropout code only in the DROP kernels.
  auto softmax = [&](int kt, float(&alpha)[2]) {
    const int64_t k0 = 128LL * kt;
    float mx[2] = {-INFINITY, -INFINITY};
    auto scan = [&]<bool DIAG>() {
      // Key j = k0 + 8n + 2cq + (e&1) is after query i = qw + gr + 8(e/2) when rel + 8n +
      // (e&1) − 8(e/2) > 0 (|rel| < 256 on the diagonal tile).
      const int rel = DIAG ? static_cast<int>(k0 - qw) - gr + 2 * cq : 0;
#pragma unroll
      for (int n = 0; n < 16; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (DIAG)
            if (rel + 8 * n + (e & 1) - 8 * (e >> 1) > 0) s[4 * n + e] = -INFINITY;
          mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * n + e]);
        }
    };
    if (kt == nkt - 1)
      scan.template operator()<true>();
    else
      scan.template operator()<false>();
    float nm[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mnew = fmaxf(mrow[r], mx[r] * sl2);  // finite: key k0 ≤ every query
      alpha[r] = ex2(mrow[r] - mnew);
      mrow[r] = mnew;
      nm[r] = -mnew;
      lrow[r] *= alpha[r];
    }
    if constexpr (DROP)
      attn::draw_bytes<8>(mb, mask, bh, t, lane, [&](int idx) {
        return QueryKeys{qw + (idx >> 4), k0 + 8 * (idx & 15)};
      });
#pragma unroll
    for (int n = 0; n < 16; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float pr = ex2(fmaf(s[4 * n + e], sl2, nm[e >> 1]));
        lrow[e >> 1] += pr;
        if constexpr (DROP) {
          const int bits = mb[(gr + 8 * (e >> 1)) * 16 + n];
          pr = (bits >> (2 * cq + (e & 1))) & 1 ? pr * mask.scale : 0.0f;
        }
        s[4 * n + e] = pr;
      }
  };
  float alpha[2];
  issue_scores(0);
  wgmma_wait<0>();
  fence_accumulators(s);
  softmax(0, alpha);  // O is still zero: no rescale
  to_a<T, 128>(s, pa);
  for (int kt = 1; kt < nkt; ++kt) {
    issue_scores(kt);
    issue_pv(kt - 1);
    wgmma_wait<1>();  // S of tile kt
    fence_accumulators(s);
    softmax(kt, alpha);
    wgmma_wait<0>();  // P·V of tile kt − 1
    fence_accumulators(o);
    fence_operands(pa);
    if (lane == 0) mbar_arrive(&p.empty[Slot<kFwdStages>(base + kt - 1).stage]);
#pragma unroll
    for (int i = 0; i < 32; ++i) o[i] *= alpha[(i >> 1) & 1];
    to_a<T, 128>(s, pa);
  }
  wgmma_fence();
  issue_pv(nkt - 1);
  wgmma_wait<0>();
  fence_accumulators(o);
  fence_operands(pa);
  if (lane == 0) {
    mbar_arrive(&p.empty[Slot<kFwdStages>(base + nkt - 1).stage]);
    mbar_arrive(&p.res_empty[j & 1]);
  }
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
    inv[r] = 1.0f / lrow[r];
    const int64_t i = qw + gr + 8 * r;
    if (cq == 0 && i < t) lse[bh * t + i] = (mrow[r] + __log2f(lrow[r])) / kLog2e;
  }
  const int64_t b = bh / g.heads, h = bh % g.heads, ldy = static_cast<int64_t>(g.heads) * kD;
  store_rows<T>(o, inv[0], inv[1], y + b * t * ldy + h * kD, ldy, qw, t, lane);
}

template <class T, bool DROP>
__global__ void __launch_bounds__(kThreads, 1)
    fwd_kernel(const __grid_constant__ CUtensorMap qkv128, T* y, float* lse, Geometry g,
               Units units, DeviceMask mask) {
#if FFN_ATTN_SM90_CODE
  const FwdPipe p = begin_cta<FwdPipe>(&qkv128);
  // Unit u: query block qt of head bh, the last blocks (most key tiles) first.
  auto unit = [&](int64_t u, int64_t& bh, int& qt) {
    int b32;
    units.split32(static_cast<int>(u), b32, qt);
    bh = b32;
    qt = units.blocks - 1 - qt;
  };
  RingPos at;
  run_units(
      units,
      [&](int j, int64_t u) {
        int64_t bh;
        int qt;
        unit(u, bh, qt);
        const int b = static_cast<int>(bh / g.heads), h = static_cast<int>(bh % g.heads);
        produce(p, at, j, Load{&qkv128, h * kD}, Load{nullptr, 0}, 128 * qt,
                Load{&qkv128, (g.heads + h) * kD}, Load{&qkv128, (2 * g.heads + h) * kD}, 0,
                qt + 1, b);
      },
      [&](int j, int64_t u, int base) {
        int64_t bh;
        int qt;
        unit(u, bh, qt);
        fwd_consume<T, DROP>(p, g, threadIdx.x / 128 - 1, j, base, bh, y, lse, 128LL * qt, qt + 1,
                             mask);
        return qt + 1;
      });
#endif
}

}  // namespace
}  // namespace attn90

namespace attn90 {
std::atomic<int64_t> forced_unit_group{0};
std::atomic<int64_t> forced_grid{0};
}  // namespace attn90

void sm90_attention_force_unit_group(int64_t heads) {
  attn90::forced_unit_group = heads;
}
void sm90_attention_force_grid(int64_t ctas) {
  attn90::forced_grid = ctas;
}

bool sm90_attention_supported(const Tensor& qkv, int64_t heads) {
  if (!qkv.defined() || !qkv.is_cuda() || qkv.dim() != 3 || heads <= 0) return false;
  if (qkv.dtype() != DType::bf16 && qkv.dtype() != DType::f16) return false;
  if (qkv.size(2) != 3 * heads * attn90::kD || !attn90::aligned16(qkv)) return false;
  const int64_t b = qkv.size(0), t = qkv.size(1);
  if (b <= 0 || t <= 0 || t >= (int64_t{1} << 31)) return false;  // coordinates are ints
  // Unit indices are ints (Units::split32): (b·heads) · ⌈t/128⌉ < 2^31.
  if (b * heads * ((t + 127) / 128) >= (int64_t{1} << 31)) return false;
  return gemm::sm90a_code_on(qkv.device().index);  // Note [sm_90a code]
}

void sm90_attention_forward(const Tensor& qkv, int64_t heads, float scale, const DropoutSpec& d,
                            Tensor& y, Tensor& lse) {
  using namespace attn90;
  const char* op = "fused_attention";
  FFN_CHECK(sm90_attention_supported(qkv, heads) && aligned16(y), "[", op,
            "] the Hopper kernel cannot run ", qkv.desc(), " with ", heads, " heads");
  const int dev = qkv.device().index;
  DeviceGuard guard(dev);
  const int64_t b = qkv.size(0), t = qkv.size(1);
  const Geometry g{t, static_cast<int>(heads), scale};
  const CUtensorMap m128 = rows_map(qkv, 128, op);
  Units units{b * heads, static_cast<int>((t + 127) / 128), /*alternate=*/true, b * heads};
  const unsigned grid = persistent_grid(units, dev);
  units.group = unit_group(units, grid, t, dev);  // Note [Unit order]
  with_half_drop(qkv.dtype(), d.active(), [&]<class T, bool DROP>() {
    allow_dynamic_smem(reinterpret_cast<const void*>(fwd_kernel<T, DROP>), FwdPipe::kSmem);
    fwd_kernel<T, DROP><<<grid, kThreads, FwdPipe::kSmem, stream(dev)>>>(
        m128, static_cast<T*>(y.data_ptr()), lse.data<float>(), g, units, DeviceMask::from(d));
    FFN_CHECK_LAUNCH();
  });
}

}  // namespace ffn::cuda
