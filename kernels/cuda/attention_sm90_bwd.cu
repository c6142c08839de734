// kernels/cuda/attention_sm90_bwd.cu — the Hopper attention backward (Note [Hopper
// attention], attention_sm90.cuh): dq, which also writes D = rowsum(dY ⊙ Y), then dk/dv.
#include "kernels/cuda/attention_sm90.cuh"

namespace ffn::cuda {
namespace attn90 {
namespace {

// Both kernels stream 64-row tiles (dk/dv holds dK and dV as well as S and dP).
constexpr int kBwdRows = 64, kBwdStages = 6;
using BwdPipe = Pipe<kBwdRows, kBwdStages>;

// ---------------------------------------------------------------------------------------
// dq: 128 queries per CTA, 64-key tiles; writes dsum = D for dk/dv.

template <class T, bool DROP>
__device__ void dq_consume(const BwdPipe& p, const Geometry& g, int c, int j, int base, int64_t bh,
                           const T* y, const T* dy, const float* lse, float* dsum, T* dqkv,
                           int64_t q0, int nkt, const DeviceMask& mask, const float2* rope) {
  const int tid = threadIdx.x - 128 * (c + 1), warp = tid / 32, lane = tid % 32;
  const int gr = lane >> 2, cq = lane & 3;
  const int64_t t = g.t, qw = q0 + 64 * c + 16 * warp;
  const int64_t b = bh / g.heads, h = bh % g.heads, ldy = static_cast<int64_t>(g.heads) * kD;
  uint8_t* mb = p.mask + (4 * c + warp) * 256;
  float* dsum_s = p.stats + c * 256 + (j & 1) * 128;  // by unit parity: the next unit's
                                                      // barrier orders reuse after reads
  const float sl2 = g.scale * kLog2e;
  {  // D_i = dy_i·y_i of the warpgroup's 64 rows, two threads per row (32 columns each)
    const int r = tid >> 1, part = tid & 1;
    const int64_t i = q0 + 64 * c + r;
    float acc = 0.0f;
    if (i < t) {
      const T* yr = y + (b * t + i) * ldy + h * kD + part * 32;
      const T* dyr = dy + (b * t + i) * ldy + h * kD + part * 32;
#pragma unroll
      for (int c0 = 0; c0 < 32; c0 += 8) {
        float a[8], d8[8];
        load_vec<8>(yr + c0, a);
        load_vec<8>(dyr + c0, d8);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc += a[j] * d8[j];
      }
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    if (part == 0) {
      dsum_s[r] = acc;
      if (i < t) dsum[bh * t + i] = acc;
    }
  }
  named_barrier_sync(1 + c, 128);
  float nl2[2], dr[2];  // −lse in log2 units, and D, of the lane's two rows
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = qw + gr + 8 * r;
    nl2[r] = i < t ? -lse[bh * t + i] * kLog2e : 0.0f;
    dr[r] = dsum_s[16 * warp + gr + 8 * r];
  }
  float dq[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) dq[i] = 0.0f;
  mbar_wait(&p.res_full[j & 1], (j >> 1) & 1);
  const uint64_t dqd = smem_desc_k128(p.resident(j & 1, 0) + c * 64 * kRowBytes);
  const uint64_t dyd = smem_desc_k128(p.resident(j & 1, 1) + c * 64 * kRowBytes);
  float s[32], dp[32];
  u32 da[4][4];
  // Tile kt's S and dP; dQ += dS·K of tile kt − 1 runs while tile kt's dS is computed (the
  // forward's overlap, fwd_consume).
  auto issue_scores = [&](int kt) {
    const Slot<kBwdStages> at(base + kt);
    mbar_wait(&p.full[at.stage], at.phase);
    wgmma_fence();
    mma_scores<64, T>(s, dqd, smem_desc_k128(p.tile(at.stage, 0)));
    mma_scores<64, T>(dp, dyd, smem_desc_k128(p.tile(at.stage, 1)));
    wgmma_commit();
  };
  auto issue_dq = [&](int kt) {
    mma_rows<64, T>(dq, da, smem_desc_mn128(p.tile(Slot<kBwdStages>(base + kt).stage, 0), kBox64));
    wgmma_commit();
  };
  auto ds = [&](int kt) {  // dS of tile kt into s (trimmed as the forward's softmax)
    const int64_t k0 = 64LL * kt;
    if constexpr (DROP)
      attn::draw_bytes<4>(mb, mask, bh, t, lane, [&](int idx) {
        return QueryKeys{qw + (idx >> 3), k0 + 8 * (idx & 7)};
      });
    auto run = [&]<bool NEAR>() {
      // Key j = k0 + 8n + 2cq + (e&1) is after query i = qw + gr + 8(e/2) when rel + 8n +
      // (e&1) − 8(e/2) > 0.
      const int rel = NEAR ? static_cast<int>(k0 - qw) - gr + 2 * cq : 0;
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          float pr = ex2(fmaf(s[4 * n + e], sl2, nl2[r]));
          if constexpr (NEAR)
            if (rel + 8 * n + (e & 1) - 8 * r > 0) pr = 0.0f;
          float dpv = dp[4 * n + e];
          if constexpr (DROP) {
            const int bits = mb[(gr + 8 * r) * 8 + n];
            dpv = (bits >> (2 * cq + (e & 1))) & 1 ? dpv * mask.scale : 0.0f;
          }
          s[4 * n + e] = pr * (dpv - dr[r]);
        }
    };
    if (k0 + 63 > q0 + 64 * c)  // some key of the tile is after a query
      run.template operator()<true>();
    else
      run.template operator()<false>();
  };
  issue_scores(0);
  wgmma_wait<0>();
  fence_accumulators(s);
  fence_accumulators(dp);
  ds(0);
  to_a<T, 64>(s, da);
  for (int kt = 1; kt < nkt; ++kt) {
    issue_scores(kt);
    issue_dq(kt - 1);
    wgmma_wait<1>();  // S and dP of tile kt
    fence_accumulators(s);
    fence_accumulators(dp);
    ds(kt);
    wgmma_wait<0>();  // dQ of tile kt − 1
    fence_accumulators(dq);
    fence_operands(da);
    if (lane == 0) mbar_arrive(&p.empty[Slot<kBwdStages>(base + kt - 1).stage]);
    to_a<T, 64>(s, da);
  }
  wgmma_fence();
  issue_dq(nkt - 1);
  wgmma_wait<0>();
  fence_accumulators(dq);
  fence_operands(da);
  if (lane == 0) {
    mbar_arrive(&p.empty[Slot<kBwdStages>(base + nkt - 1).stage]);
    mbar_arrive(&p.res_empty[j & 1]);
  }
  const int64_t ld = 3 * ldy;
  store_rows<T>(dq, g.scale, g.scale, dqkv + b * t * ld + h * kD, ld, qw, t, lane, rope);
}

template <class T, bool DROP, bool ROPE>
__global__ void __launch_bounds__(kThreads, 1)
    dq_kernel(const __grid_constant__ CUtensorMap qkv128, const __grid_constant__ CUtensorMap qkv64,
              const __grid_constant__ CUtensorMap dy128, const T* y, const T* dy, const float* lse,
              float* dsum, T* dqkv, Geometry g, Units units, DeviceMask mask, const float2* rope) {
#if FFN_ATTN_SM90_CODE
  const BwdPipe p = begin_cta<BwdPipe>(&qkv128, &qkv64, &dy128);
  // Unit u: query block q0 of head bh (the last blocks first) and its key tiles [0, nkt).
  auto unit = [&](int64_t u, int64_t& bh, int64_t& q0, int& nkt) {
    bh = units.bh(u);
    q0 = 128LL * (units.blocks - 1 - units.rank(u));
    const int64_t kend = q0 + 128 < g.t ? q0 + 128 : g.t;  // keys [0, kend)
    nkt = static_cast<int>((kend + 63) / 64);
  };
  RingPos at;
  run_units(
      units,
      [&](int j, int64_t u) {
        int64_t bh, q0;
        int nkt;
        unit(u, bh, q0, nkt);
        const int b = static_cast<int>(bh / g.heads), h = static_cast<int>(bh % g.heads);
        produce(p, at, j, Load{&qkv128, h * kD}, Load{&dy128, h * kD}, static_cast<int>(q0),
                Load{&qkv64, (g.heads + h) * kD}, Load{&qkv64, (2 * g.heads + h) * kD}, 0, nkt, b);
      },
      [&](int j, int64_t u, int base) {
        int64_t bh, q0;
        int nkt;
        unit(u, bh, q0, nkt);
        dq_consume<T, DROP>(p, g, threadIdx.x / 128 - 1, j, base, bh, y, dy, lse, dsum, dqkv, q0,
                            nkt, mask, ROPE ? rope : nullptr);
        return nkt;
      });
#endif
}

// ---------------------------------------------------------------------------------------
// Backward dk/dv: 128 keys per CTA, 64-query tiles from the diagonal on.

template <class T, bool DROP>
__device__ void dkv_consume(const BwdPipe& p, const Geometry& g, int c, int j, int base, int64_t bh,
                            const float* lse, const float* dsum, T* dqkv, int64_t k0, int nit,
                            const DeviceMask& mask, const float2* rope) {
  const int tid = threadIdx.x - 128 * (c + 1), warp = tid / 32, lane = tid % 32;
  const int gr = lane >> 2, cq = lane & 3;
  const int64_t t = g.t, kw = k0 + 64 * c + 16 * warp;  // the warp's first key
  uint8_t* mb = p.mask + (4 * c + warp) * 256;
  const float sl2 = g.scale * kLog2e;
  float dk[32], dv[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) dk[i] = dv[i] = 0.0f;
  mbar_wait(&p.res_full[j & 1], (j >> 1) & 1);
  const uint64_t kd = smem_desc_k128(p.resident(j & 1, 0) + c * 64 * kRowBytes);
  const uint64_t vd = smem_desc_k128(p.resident(j & 1, 1) + c * 64 * kRowBytes);
  float s[32], dp[32];  // rows: the warp's 16 keys; columns: the tile's 64 queries
  u32 pa[4][4], da[4][4];
  // Query tile it's Sᵀ and dPᵀ; dV and dK of tile it − 1 run while tile it's Pdᵀ and dSᵀ are
  // computed (the forward's overlap, fwd_consume).
  auto issue_scores = [&](int it) {
    // The tile's row statistics (lse in log2 units, D), double-buffered per warpgroup: the
    // barrier orders this write after every read of the buffer two tiles ago.
    const int64_t q0 = k0 + 64LL * it;
    float* st = p.stats + c * 256 + ((base + it) & 1) * 128;
    if (tid < 64) {
      const int64_t i = q0 + tid;
      st[tid] = i < t ? lse[bh * t + i] * kLog2e : 0.0f;
      st[64 + tid] = i < t ? dsum[bh * t + i] : 0.0f;
    }
    named_barrier_sync(1 + c, 128);
    const Slot<kBwdStages> at(base + it);
    mbar_wait(&p.full[at.stage], at.phase);
    wgmma_fence();
    mma_scores<64, T>(s, kd, smem_desc_k128(p.tile(at.stage, 0)));
    mma_scores<64, T>(dp, vd, smem_desc_k128(p.tile(at.stage, 1)));
    wgmma_commit();
  };
  auto issue_dkv = [&](int it) {
    const int stage = Slot<kBwdStages>(base + it).stage;
    mma_rows<64, T>(dv, pa, smem_desc_mn128(p.tile(stage, 1), kBox64));
    mma_rows<64, T>(dk, da, smem_desc_mn128(p.tile(stage, 0), kBox64));
    wgmma_commit();
  };
  auto grads = [&](int it) {  // Pdᵀ into s, dSᵀ into dp (trimmed as the forward's softmax)
    const int64_t q0 = k0 + 64LL * it;
    const float* st = p.stats + c * 256 + ((base + it) & 1) * 128;
    if constexpr (DROP)  // byte idx: query q0 + idx % 64, keys kw + 8·(idx / 64) …
      attn::draw_bytes<4>(mb, mask, bh, t, lane, [&](int idx) {
        return QueryKeys{q0 + (idx & 63), kw + 8 * (idx >> 6)};
      });
    auto run = [&]<bool EDGE>() {
      // Key j = kw + gr + 8(e/2) is after query i = q0 + col when rel + 8(e/2) − col > 0;
      // queries col ≥ last are past T.
      const int rel = EDGE ? static_cast<int>(kw - q0) + gr : 0;
      const int last = EDGE ? static_cast<int>(t - q0 < 64 ? t - q0 : 64) : 64;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const int c0 = 8 * n + 2 * cq;
        const float2 l2 = *reinterpret_cast<const float2*>(st + c0);
        const float2 dd = *reinterpret_cast<const float2*>(st + 64 + c0);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = c0 + (e & 1);
          float pr = ex2(fmaf(s[4 * n + e], sl2, -((e & 1) ? l2.y : l2.x)));
          if constexpr (EDGE)
            if (col >= last || rel + 8 * (e >> 1) - col > 0) pr = 0.0f;
          const float d = (e & 1) ? dd.y : dd.x;
          if constexpr (DROP) {  // Pd = P·f and dS = P·(dPd·f − D), f = mask/(1−p)
            const float f = (mb[(e >> 1) * 64 + col] >> gr) & 1 ? mask.scale : 0.0f;
            s[4 * n + e] = pr * f;
            dp[4 * n + e] = pr * (dp[4 * n + e] * f - d);
          } else {
            s[4 * n + e] = pr;
            dp[4 * n + e] = pr * (dp[4 * n + e] - d);
          }
        }
      }
    };
    // Some query of the tile is before a key of the warpgroup's, or past T.
    if (q0 < k0 + 64 * c + 63 || q0 + 64 > t)
      run.template operator()<true>();
    else
      run.template operator()<false>();
  };
  issue_scores(0);
  wgmma_wait<0>();
  fence_accumulators(s);
  fence_accumulators(dp);
  grads(0);
  to_a<T, 64>(s, pa);
  to_a<T, 64>(dp, da);
  for (int it = 1; it < nit; ++it) {
    issue_scores(it);
    issue_dkv(it - 1);
    wgmma_wait<1>();  // Sᵀ and dPᵀ of tile it
    fence_accumulators(s);
    fence_accumulators(dp);
    grads(it);
    wgmma_wait<0>();  // dV and dK of tile it − 1
    fence_accumulators(dv);
    fence_accumulators(dk);
    fence_operands(pa);
    fence_operands(da);
    if (lane == 0) mbar_arrive(&p.empty[Slot<kBwdStages>(base + it - 1).stage]);
    to_a<T, 64>(s, pa);
    to_a<T, 64>(dp, da);
  }
  wgmma_fence();
  issue_dkv(nit - 1);
  wgmma_wait<0>();
  fence_accumulators(dv);
  fence_accumulators(dk);
  fence_operands(pa);
  fence_operands(da);
  if (lane == 0) {
    mbar_arrive(&p.empty[Slot<kBwdStages>(base + nit - 1).stage]);
    mbar_arrive(&p.res_empty[j & 1]);
  }
  const int64_t b = bh / g.heads, h = bh % g.heads, ld = 3LL * g.heads * kD;
  T* dkg = dqkv + b * t * ld + (g.heads + h) * kD;
  store_rows<T>(dk, g.scale, g.scale, dkg, ld, kw, t, lane, rope);
  store_rows<T>(dv, 1.0f, 1.0f, dkg + static_cast<int64_t>(g.heads) * kD, ld, kw, t, lane);
}

template <class T, bool DROP, bool ROPE>
__global__ void __launch_bounds__(kThreads, 1)
    dkv_kernel(const __grid_constant__ CUtensorMap qkv128,
               const __grid_constant__ CUtensorMap qkv64, const __grid_constant__ CUtensorMap dy64,
               const float* lse, const float* dsum, T* dqkv, Geometry g, Units units,
               DeviceMask mask, const float2* rope) {
#if FFN_ATTN_SM90_CODE
  const BwdPipe p = begin_cta<BwdPipe>(&qkv128, &qkv64, &dy64);
  // Unit u: key block k0 of head bh (the first blocks, most query tiles, first) and its
  // query tiles from the diagonal on.
  auto unit = [&](int64_t u, int64_t& bh, int64_t& k0, int& nit) {
    bh = units.bh(u);
    k0 = 128LL * units.rank(u);
    nit = static_cast<int>((g.t - k0 + 63) / 64);
  };
  RingPos at;
  run_units(
      units,
      [&](int j, int64_t u) {
        int64_t bh, k0;
        int nit;
        unit(u, bh, k0, nit);
        const int b = static_cast<int>(bh / g.heads), h = static_cast<int>(bh % g.heads);
        produce(p, at, j, Load{&qkv128, (g.heads + h) * kD}, Load{&qkv128, (2 * g.heads + h) * kD},
                static_cast<int>(k0), Load{&qkv64, h * kD}, Load{&dy64, h * kD},
                static_cast<int>(k0), nit, b);
      },
      [&](int j, int64_t u, int base) {
        int64_t bh, k0;
        int nit;
        unit(u, bh, k0, nit);
        dkv_consume<T, DROP>(p, g, threadIdx.x / 128 - 1, j, base, bh, lse, dsum, dqkv, k0, nit,
                             mask, ROPE ? rope : nullptr);
        return nit;
      });
#endif
}

}  // namespace
}  // namespace attn90

void sm90_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& dy,
                             const Tensor& lse, int64_t heads, float scale, const DropoutSpec& d,
                             Tensor& dqkv, double rope_base) {
  using namespace attn90;
  const char* op = "fused_attention_backward";
  FFN_CHECK(sm90_attention_supported(qkv, heads) && aligned16(y) && aligned16(dy) &&
                aligned16(dqkv),
            "[", op, "] the Hopper kernel cannot run ", qkv.desc(), " with ", heads, " heads");
  const int dev = qkv.device().index;
  DeviceGuard guard(dev);
  const int64_t b = qkv.size(0), t = qkv.size(1);
  const Geometry g{t, static_cast<int>(heads), scale};
  const DeviceMask mask = DeviceMask::from(d);
  const CUtensorMap q128 = rows_map(qkv, 128, op), q64 = rows_map(qkv, 64, op);
  const CUtensorMap dy128 = rows_map(dy, 128, op), dy64 = rows_map(dy, 64, op);
  Tensor dsum = Tensor::empty({b * heads, t}, DType::f32, qkv.device());
  const Units units{b * heads, static_cast<int>((t + 127) / 128)};
  const unsigned grid = persistent_grid(units, dev);
  const float2* rope =
      rope_base > 0 ? static_cast<const float2*>(rope_table(dev, t, kD, rope_base).data_ptr())
                    : nullptr;
  // The rotation is a template argument: the kernels without it carry none of its code.
  auto launch = [&]<class T, bool DROP, bool ROPE>() {
    allow_dynamic_smem(reinterpret_cast<const void*>(dq_kernel<T, DROP, ROPE>), BwdPipe::kSmem);
    dq_kernel<T, DROP, ROPE><<<grid, kThreads, BwdPipe::kSmem, stream(dev)>>>(
        q128, q64, dy128, static_cast<const T*>(y.data_ptr()), static_cast<const T*>(dy.data_ptr()),
        lse.data<float>(), dsum.data<float>(), static_cast<T*>(dqkv.data_ptr()), g, units, mask,
        rope);
    FFN_CHECK_LAUNCH();
    allow_dynamic_smem(reinterpret_cast<const void*>(dkv_kernel<T, DROP, ROPE>), BwdPipe::kSmem);
    dkv_kernel<T, DROP, ROPE><<<grid, kThreads, BwdPipe::kSmem, stream(dev)>>>(
        q128, q64, dy64, lse.data<float>(), dsum.data<float>(), static_cast<T*>(dqkv.data_ptr()), g,
        units, mask, rope);
    FFN_CHECK_LAUNCH();
  };
  with_half_drop(qkv.dtype(), d.active(), [&]<class T, bool DROP>() {
    if (rope)
      launch.template operator()<T, DROP, true>();
    else
      launch.template operator()<T, DROP, false>();
  });
}

}  // namespace ffn::cuda
