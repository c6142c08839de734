// kernels/cuda/attention_sm90_bwd.cu — the Hopper attention backward (Note [Hopper
// attention], attention_sm90.cuh; Note [Attention backward in one pass] below): D =
// rowsum(dY ⊙ Y); dk/dv, which also sums dQ's partial products into an fp32 buffer in a
// fixed order and stores each query tile's dq where its last key block adds to the sum;
// optionally dqkv's column sums (Note [QKV bias gradient in the attention backward]).
#include "kernels/cuda/attention_sm90.cuh"

namespace ffn::cuda {
namespace attn90 {
namespace {

// dk/dv streams 64-row tiles (it holds dK and dV as well as S and dP).
constexpr int kBwdRows = 64;

// Note [Attention backward in one pass]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// dk/dv computes dSᵀ for its 128 keys against every 64-query tile at or after them; dQ of
// that tile is dS·K over those 128 keys, so it is computed there too (FlashAttention-2/3's
// single backward pass: 5 products per tile where a separate dq kernel made it 7, and each
// dropout mask bit drawn once) and the key blocks' partial sums are added up in memory:
// - Each consumer warpgroup writes its 64 rows of dSᵀ (16-bit, as packed for dK) into a
//   shared tile laid out like the resident K tile (128 key rows × 64 queries, 128-byte
//   swizzle). Warpgroup gt % 2 (gt: the CTA's tile count) issues dQ = dS·K with A read
//   M-major from that tile and B the resident K tile read N-major, K = 128 keys. Two dS
//   tiles alternate, with named barriers kDsFull + b (the other warpgroup arrives, the
//   issuer waits) and kDsRead + b (the issuer arrives once its product is done; the other
//   waits before writing tile b again), so the warpgroups drift up to a tile apart and one's
//   product runs beside the other's work. The CTA's last unit matches the last arrivals.
// - The issuer stores dQ (fp32, in its accumulator-fragment order: float4 i of thread x at
//   i·128 + x) to its staging buffer and signals the writer thread (warpgroup 0's second
//   warp, 40 registers: the consumers keep 232), which copies it with one bulk copy into the
//   tile's 16 KiB of dqacc, [B·H, ⌈T/64⌉, 64·64] fp32 (50 MiB at gpt2_small's shape, freed
//   after the call): key block 0 writes, the others add (cp.reduce.async.bulk .add.f32).
// - Deterministic: a query tile's contributions are added in key-block order. A counter per
//   (head, query tile), zeroed per call by dsum_kernel, holds how many key blocks have added
//   theirs; the writer of key block kb waits until it reads kb, adds, and stores kb + 1 once
//   its copy is complete (release/acquire at GPU scope, proxy fences around the bulk copies).
//   It stores it when the next tile arrives from its consumers, before waiting on any other
//   CTA. No wait can deadlock: a unit waits only for units of a lower index (Units orders key
//   blocks first within a group of heads), which run on CTAs that are resident (a persistent
//   grid no larger than the SMs, one CTA an SM) and take their units in increasing index
//   order (Note [Unit order]), so the unfinished unit of least index never waits.
// - The last key block of a query tile (the diagonal one, kb = tile / 2: the first two tiles
//   of every unit) stores dq itself: the issuer's threads wait for the tile's counter to read
//   kb (each its own acquire), copy the earlier key blocks' sum from dqacc into their staging
//   buffer (kb > 0; cp.async before the dQ product and the barrier before it, so no registers
//   wait for it), add their product to it (the add the bulk reduction would have made, so
//   the same bits), scale it, rotate it back (rotary embeddings) and store dq into dqkv. A
//   separate pass over dqacc cost ~29 µs a call at gpt2_small's shape (session 29), reading
//   50 MiB that the last addition had just written. Those tiles never pass to the writer, so
//   each side counts buffer c's copies (dq_uses, uses) for its phases. The consumers now wait
//   on other CTAs too, for units of a lower index, as the writer does; the writer moves its
//   last counter before it passes a unit's first tiles, so no unit's counters wait on a later
//   unit's consumers.
//   D = rowsum(dY ⊙ Y), which dk/dv reads per query tile, comes from dsum_kernel first.
// Note [QKV bias gradient in the attention backward]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// GPT-2's QKV projection has a bias whose gradient is the column sums of dqkv, which a
// column-sum pass read back after this backward wrote dqkv (75 MB at gpt2_small's shape, 0.39
// ms of its step, session 23's profile). With dqkv_sum the kernels sum what they store: each
// consumer warpgroup of dk/dv its 64 keys' dk and dv columns after the unit's last product,
// and the issuer of a query tile's last dQ product its 64 queries' dq columns (store_rows
// adds the 16-bit values as stored, rotated back where rope is on; warpgroup_column_sums
// reduces them in a fixed order), one partial row per sequence's 64-row tile, [B·⌈T/64⌉,
// 3·H·64] fp32, every element written exactly once; reduce_partials then sums the rows in
// order (Note [Deterministic column sums], stage 2).
// Deterministic and independent of the grid; not the column-sum pass's order, so the bits of
// the bias gradient differ from it within fp32 rounding. The layer asks for the sums when the
// projection's node wants them (Note [Branch bias gradient], layers/branch_bias_grad.h).
constexpr int kDsBytes = 128 * kRowBytes;  // one dS tile: 128 key rows × 64 queries
constexpr int kDqFloats = 64 * kD;         // one query tile of dQ
constexpr int kDqBytes = kDqFloats * 4;    // 16 KiB
constexpr int kBwdStages = 5;
// Note [QKV bias gradient in the attention backward]: per consumer warpgroup [dk, dv, dq][4
// warps][64 columns] floats (dq's apart: a unit of one tile sums dq and then dk).
constexpr int kRedBytes = 2 * 3 * 4 * 64 * 4;
// Named barriers of both consumer warpgroups (1 and 2 are each one's own): dS tile b is
// full (kDsFull + b), dS tile b has been read by the dQ product (kDsRead + b).
[[maybe_unused]] constexpr int kDsFull = 3, kDsRead = 5;
using BwdPipe = Pipe<kBwdRows, kBwdStages, 2 * kDsBytes + 2 * kDqBytes + kRedBytes>;
[[maybe_unused]] __device__ __forceinline__ uint8_t* ds_tile(const BwdPipe& p, int b) {
  return p.extra + b * kDsBytes;
}
[[maybe_unused]] __device__ __forceinline__ float* dq_stage(const BwdPipe& p, int c) {
  return reinterpret_cast<float*>(p.extra + 2 * kDsBytes + c * kDqBytes);
}
// Consumer warpgroup c's column-sum scratch for its dk (i = 0), dv (i = 1) and dq (i = 2).
[[maybe_unused]] __device__ __forceinline__ float* red_of(const BwdPipe& p, int c, int i) {
  return reinterpret_cast<float*>(p.extra + 2 * kDsBytes + 2 * kDqBytes) + (3 * c + i) * 256;
}
// aux barriers: [c] staging buffer c is full (the issuer's arrival), [2 + c] it is free again
// (the writer's).

__device__ __forceinline__ void bulk_copy_out(float* dst, const float* src, int bytes, bool add) {
  if (add)
    asm volatile(
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
        "r"(smem_addr(src)), "r"(bytes)
        : "memory");
  else
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(smem_addr(src)), "r"(bytes)
                 : "memory");
}
// Waits until *c ≥ value (acquire); then, where the thread's own accesses to what the counter
// guards are asynchronous (bulk copies), the proxy fence.
__device__ __forceinline__ void wait_counter(const int* c, int value, bool async_after = true) {
  int v;
  for (;;) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(c) : "memory");
    if (v >= value) break;
    __nanosleep(32);
  }
  if (async_after) asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
__device__ __forceinline__ void set_counter(int* c, int value) {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(c), "r"(value) : "memory");
}

// ---------------------------------------------------------------------------------------
// Backward dk/dv: 128 keys per CTA, 64-query tiles from the diagonal on.

// Note [RMSNorm folded into the QKV GEMM] (layers/attention.cpp): the row scales of this
// lane's two rows r0 + gr and r0 + gr + 8 of sequence bh / heads (1 past T). Without dropout
// the callers load them a product ahead of the stores that use them: loaded at the stores
// (store_rows' rs, as the dropout kernels do), their global-memory latency stalled each unit's
// three stores (session 50: the dk/dv kernel 4% slower at a d768 shape).
[[maybe_unused]] __device__ __forceinline__ float2 row_scales(const Geometry& g, int64_t bh,
                                                              int64_t r0, int gr) {
  const float* rs = g.row_scale + (bh / g.heads) * g.t;
  const int64_t r = r0 + gr;
  return make_float2(r < g.t ? __ldg(rs + r) : 1.0f, r + 8 < g.t ? __ldg(rs + r + 8) : 1.0f);
}

// SCALE: g.row_scale is set (a separate instantiation, so the kernels without it hold no
// registers for it: loaded a product ahead at run time, the dropout kernels spilled 36-40
// bytes where they spill 4-8). With dropout too, store_rows loads them at the stores: held
// across the products (or loaded two at a time before the stores) they spilled 36-60 bytes,
// and llama_char's folded step was 1% slower than with these loads (session 50).
template <class T, bool DROP, bool SCALE>
__device__ void dkv_consume(const BwdPipe& p, const Geometry& g, int c, int j, int base, int64_t bh,
                            const float* lse, const float* dsum, T* dqkv, int64_t k0, int nit,
                            const DeviceMask& mask, const float2* rope, bool last_unit,
                            float* dbpart, const float* dqacc, const int* counters,
                            uint32_t& dq_uses) {
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
  // The row statistics (lse, D) of query q0 + tid of the tile computed next, loaded a tile
  // ahead (tid < 64): loaded where they are used, their global-memory latency stalled every
  // tile (ncu, session 24: the consumers' most stalled instruction on long scoreboard).
  float next_lse = 0.0f, next_d = 0.0f;
  auto load_stats = [&](int it) {
    const int64_t i = k0 + 64LL * it + tid;
    const bool in = tid < 64 && it < nit && i < t;
    next_lse = in ? lse[bh * t + i] : 0.0f;
    next_d = in ? dsum[bh * t + i] : 0.0f;
  };
  load_stats(0);
  // Query tile it's Sᵀ and dPᵀ; dV and dK of tile it − 1 run while tile it's Pdᵀ and dSᵀ are
  // computed (the forward's overlap, fwd_consume).
  auto issue_scores = [&](int it) {
    // The tile's row statistics (lse in log2 units, D), double-buffered per warpgroup: the
    // barrier orders this write after every read of the buffer two tiles ago.
    float* st = p.stats + c * 256 + ((base + it) & 1) * 128;
    if (tid < 64) {
      st[tid] = next_lse * kLog2e;
      st[64 + tid] = next_d;
    }
    load_stats(it + 1);
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
  // Note [Attention backward in one pass]: the issuer of query tile it's last dQ product
  // copies the earlier key blocks' sum into its staging buffer before the product (each
  // thread the float4s it reads back: cp.async, no registers held across the product, no
  // barrier), adds its product to it and stores dq (with its column sums where asked).
  float4* const staged = reinterpret_cast<float4*>(dq_stage(p, c)) + tid;
  auto stage_sum = [&](const float* sum) {
    mbar_wait(&p.aux[2 + c], (dq_uses & 1) ^ 1);  // the writer read the buffer's last copy
    const float4* src = reinterpret_cast<const float4*>(sum) + tid;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                       smem_addr(staged + i * 128)),
                   "l"(src + i * 128)
                   : "memory");
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  auto final_dq = [&](float(&dq)[32], int it, float2 rq) {
    if (k0 > 0) {
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float4 v = staged[i * 128];
        dq[4 * i] = v.x + dq[4 * i], dq[4 * i + 1] = v.y + dq[4 * i + 1];
        dq[4 * i + 2] = v.z + dq[4 * i + 2], dq[4 * i + 3] = v.w + dq[4 * i + 3];
      }
    }
    const int64_t b = bh / g.heads, h = bh % g.heads, ld = 3LL * g.heads * kD;
    T* dqg = dqkv + b * t * ld + h * kD;
    const int64_t r0 = k0 + 64LL * it + 16 * warp;
    const float* rs = SCALE && DROP ? g.row_scale + b * t : nullptr;  // loaded by store_rows
    if (!dbpart) {
      store_rows<T>(dq, g.scale * rq.x, g.scale * rq.y, dqg, ld, r0, t, lane, rope, nullptr, rs);
      return;
    }
    float sq[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) sq[i] = 0.0f;
    store_rows<T>(dq, g.scale * rq.x, g.scale * rq.y, dqg, ld, r0, t, lane, rope, sq, rs);
    const int64_t qtiles = (t + 63) / 64, tile = k0 / 64 + it;
    warpgroup_column_sums(sq, red_of(p, c, 2), tid, 1 + c,
                          dbpart + (b * qtiles + tile) * ld + h * kD);
  };
  // Note [Attention backward in one pass]: dSᵀ of tile it into the shared dS tile; the
  // warpgroup whose turn it is multiplies it by K and hands dQ to the writer. The barriers
  // kDsFull + b (the other warpgroup arrives, the issuer waits) and kDsRead + b (the issuer
  // arrives once its product is done, the other waits before writing tile b again) let the
  // warpgroups drift apart by up to a tile, so one's dQ product runs beside the other's work.
  auto dq_part = [&](int it) {
    const int gt = base + it, tb = gt & 1;
    const bool issuer = tb == c;
    if (!issuer && gt >= 2) named_barrier_sync(kDsRead + tb, 256);
    uint8_t* dst = ds_tile(p, tb);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // da[kk][q]: key row gr (+8 if q odd), queries
        const int row = 64 * c + 16 * warp + gr + 8 * (q & 1);  // 16kk + 8(q/2) + 2cq, +1
        const int chunk = 2 * kk + (q >> 1);
        *reinterpret_cast<u32*>(dst + row * kRowBytes + ((chunk ^ gr) << 4) + 4 * cq) =
            da[kk][q];
      }
    fence_proxy_async_smem();
    if (!issuer) {
      named_barrier_arrive(kDsFull + tb, 256);
      return;
    }
    if (it < 2 && k0 > 0) {  // the tile's last key block: the earlier blocks' sum
      const int64_t tile = bh * ((t + 63) / 64) + k0 / 64 + it;
      wait_counter(counters + tile, static_cast<int>(k0 / 128), false);
      stage_sum(dqacc + tile * kDqFloats);
    }
    // The row scales of the tile's rows, if it is the query tile's last key block.
    float2 rq = make_float2(1.0f, 1.0f);
    if constexpr (SCALE && !DROP)
      if (it < 2) rq = row_scales(g, bh, k0 + 64LL * it + 16 * warp, gr);
    named_barrier_sync(kDsFull + tb, 256);
    float dq[32];
    wgmma_fence();
    const uint64_t ad = smem_desc_mn128(dst, kBox64);
    const uint64_t bd = smem_desc_mn128(p.resident(j & 1, 0), kBox64);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)  // 16 keys (2048 bytes of both tiles) per step
      Wgmma<64, T>::template mma<1, 1>(dq, ad + kk * 128, bd + kk * 128, kk);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(dq);
    named_barrier_arrive(kDsRead + tb, 256);
    if (it < 2) {  // the query tile's last key block: dq itself
      final_dq(dq, it, rq);
      return;
    }
    const uint32_t phase = dq_uses++ & 1;
    mbar_wait(&p.aux[2 + c], phase ^ 1);  // the writer is done with the buffer
#pragma unroll
    for (int i = 0; i < 8; ++i)
      staged[i * 128] = make_float4(dq[4 * i], dq[4 * i + 1], dq[4 * i + 2], dq[4 * i + 3]);
    fence_proxy_async_smem();
    named_barrier_sync(1 + c, 128);
    if (tid == 0) mbar_arrive(&p.aux[c]);
  };
  issue_scores(0);
  wgmma_wait<0>();
  fence_accumulators(s);
  fence_accumulators(dp);
  grads(0);
  to_a<T, 64>(s, pa);
  to_a<T, 64>(dp, da);
  dq_part(0);
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
    dq_part(it);
  }
  float2 rk = make_float2(1.0f, 1.0f);  // the warp's keys' row scales, for the stores below
  if constexpr (SCALE && !DROP) rk = row_scales(g, bh, kw, gr);
  wgmma_fence();
  issue_dkv(nit - 1);
  wgmma_wait<0>();
  fence_accumulators(dv);
  fence_accumulators(dk);
  fence_operands(pa);
  fence_operands(da);
  if (last_unit)  // the CTA's last two tiles: each kDsRead + b arrival gets its wait
    for (int gt = base + nit - 2; gt < base + nit; ++gt)
      if (gt >= 0 && (gt & 1) != c) named_barrier_sync(kDsRead + (gt & 1), 256);
  if (lane == 0) {
    mbar_arrive(&p.empty[Slot<kBwdStages>(base + nit - 1).stage]);
    mbar_arrive(&p.res_empty[j & 1]);
  }
  const int64_t b = bh / g.heads, h = bh % g.heads, ld = 3LL * g.heads * kD;
  T* dkg = dqkv + b * t * ld + (g.heads + h) * kD;
  const float* rs = SCALE && DROP ? g.row_scale + b * t : nullptr;  // loaded by store_rows
  if (!dbpart) {
    store_rows<T>(dk, g.scale * rk.x, g.scale * rk.y, dkg, ld, kw, t, lane, rope, nullptr, rs);
    store_rows<T>(dv, rk.x, rk.y, dkg + static_cast<int64_t>(g.heads) * kD, ld, kw, t, lane,
                  nullptr, nullptr, rs);
    return;
  }
  // Note [QKV bias gradient in the attention backward]: the warpgroup's 64 keys are query
  // tile k0 / 64 + c's rows, whose partial row it writes (none past T).
  float sk[16], sv[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) sk[i] = sv[i] = 0.0f;
  store_rows<T>(dk, g.scale * rk.x, g.scale * rk.y, dkg, ld, kw, t, lane, rope, sk, rs);
  store_rows<T>(dv, rk.x, rk.y, dkg + static_cast<int64_t>(g.heads) * kD, ld, kw, t, lane, nullptr,
                sv, rs);
  const int64_t qtiles = (t + 63) / 64, tile = k0 / 64 + c;
  float* out = tile < qtiles ? dbpart + (b * qtiles + tile) * ld + (g.heads + h) * kD : nullptr;
  warpgroup_column_sums(sk, red_of(p, c, 0), tid, 1 + c, out);
  warpgroup_column_sums(sv, red_of(p, c, 1), tid, 1 + c,
                        out ? out + static_cast<int64_t>(g.heads) * kD : nullptr);
}

// The writer thread of Note [Attention backward in one pass]: the CTA's dQ tiles, in the
// consumers' order, each added into dqacc after the key blocks before it (a query tile's last
// key block's never comes here: its issuer adds and stores it).
[[maybe_unused]] __device__ void write_dq(const Units& units, int64_t t, float* dqacc,
                                          int* counters) {
  // (32-bit unit indices, pointers advanced per tile, the pipe's addresses carved again
  // here: this thread has 40 registers.)
  extern __shared__ uint8_t smem_raw[];
  const BwdPipe p = BwdPipe::carve(smem_raw);
  const int qtiles = static_cast<int>((t + 63) / 64), count = static_cast<int>(units.count());
  uint32_t gt = 0, uses = 0;  // uses: bit c is buffer c's copies so far, mod 2
  int* pending = nullptr;  // the last tile's counter, set once its copy is complete
  int pending_value = 0;
  for (int k = 0;; ++k) {
    const int u = static_cast<int>(units.at(k, blockIdx.x, gridDim.x));
    if (u >= count) break;
    int bh, kb;
    units.split32(u, bh, kb);
    const int first = bh * qtiles + 2 * kb;  // the unit's first query tile
    float* dst = dqacc + static_cast<int64_t>(first) * kDqFloats;
    int* counter = counters + first;
    for (int it = 2 * kb; it < qtiles; ++it, ++gt, dst += kDqFloats, ++counter) {
      if (it < 2 * kb + 2) {  // the tile's last key block: its issuer stores dq
        // The unit's first tiles: the last one's counter moves now, not when the unit's first
        // copy arrives, as consumers (this CTA's too) may wait for it before they send one.
        if (pending) {
          tma_store_wait_all();
          set_counter(pending, pending_value);
          pending = nullptr;
        }
        continue;
      }
      const int c = gt & 1;
      const uint32_t phase = (uses >> c) & 1;  // buffer c's uses, mod 2
      uses ^= 1u << c;
      mbar_wait_idle(&p.aux[c], phase);  // Note [Idle waits] (sm90.cuh)
      // The previous tile's copy ran while the consumers made this one; its counter moves
      // once it is complete, before any wait on another CTA (which might wait on it).
      if (pending) {
        tma_store_wait_all();
        set_counter(pending, pending_value);
      }
      if (kb > 0) wait_counter(counter, kb);
      bulk_copy_out(dst, dq_stage(p, c), kDqBytes, kb > 0);
      tma_store_commit();
      tma_store_wait_read<0>();  // the staging buffer is read: the consumers may refill it
      mbar_arrive(&p.aux[2 + c]);
      pending = counter, pending_value = kb + 1;
    }
  }
  if (pending) {
    tma_store_wait_all();
    set_counter(pending, pending_value);
  }
}

template <class T, bool DROP, bool ROPE, bool SCALE>
__global__ void __launch_bounds__(kThreads<>, 1)
    dkv_kernel(const __grid_constant__ CUtensorMap qkv128,
               const __grid_constant__ CUtensorMap qkv64, const __grid_constant__ CUtensorMap dy64,
               const float* lse, const float* dsum, T* dqkv, Geometry g, Units units,
               DeviceMask mask, const float2* rope, float* dqacc, int* counters, float* dbpart) {
#if FFN_ATTN_SM90_CODE
  units.alternate = false;  // strided (Note [Unit order]); a constant drops the other order's code
  const BwdPipe p = begin_cta<BwdPipe>(&qkv128, &qkv64, &dy64);
  // Unit u: key block k0 of head bh (the first blocks, most query tiles, first) and its
  // query tiles from the diagonal on.
  auto unit = [&](int64_t u, int64_t& bh, int64_t& k0, int& nit) {
    int b32, kb;
    units.split32(static_cast<int>(u), b32, kb);
    bh = b32;
    k0 = 128LL * kb;
    nit = static_cast<int>((g.t - k0 + 63) / 64);
  };
  RingPos at;
  uint32_t dq_uses = 0;  // a consumer warpgroup's copies through its staging buffer
  auto side = [units, t = g.t, dqacc, counters] {
    write_dq(units, t, dqacc, counters);
  };
  // The writer thread needs more than 24 registers: the consumers give up 8 each (at 32,
  // ptxas spills the writer; 240 for the consumers leaves the producers too few).
  run_units<40, 232>(
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
        dkv_consume<T, DROP, SCALE>(p, g, threadIdx.x / 128 - 1, j, base, bh, lse, dsum, dqkv, k0,
                                    nit, mask, ROPE ? rope : nullptr,
                                    units.at(j + 1, blockIdx.x, gridDim.x) >= units.count(), dbpart,
                                    dqacc, counters, dq_uses);
        return nit;
      },
      side);
#endif
}

// D_i = dy_i·y_i per (head, query), fp32 from the 16-bit values: one warp per (b, t) row,
// 8 lanes per head (16-byte loads). It also zeroes dk/dv's n counters (one launch fewer than
// a memset of their own).
template <class T>
__global__ void dsum_kernel(const T* y, const T* dy, float* dsum, int64_t rows, int64_t t,
                            int heads, int* counters, int64_t n) {
#if FFN_ATTN_SM90_CODE
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    counters[i] = 0;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t b = row / t, i = row % t, ld = static_cast<int64_t>(heads) * kD;
  for (int k0 = 0; k0 < heads * 8; k0 += 32) {  // chunk k: head k / 8, columns 8(k % 8)..
    const int k = k0 + lane;
    float acc = 0.0f;
    if (k < heads * 8) {
      float a[8], d8[8];
      load_vec<8>(y + row * ld + 8 * k, a);
      load_vec<8>(dy + row * ld + 8 * k, d8);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc += a[e] * d8[e];
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
    acc += __shfl_xor_sync(0xffffffffu, acc, 4);
    if (k < heads * 8 && (lane & 7) == 0) dsum[(b * heads + k / 8) * t + i] = acc;
  }
#endif
}

}  // namespace
}  // namespace attn90

void sm90_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& dy,
                             const Tensor& lse, int64_t heads, float scale, const DropoutSpec& d,
                             Tensor& dqkv, double rope_base, Tensor* dqkv_sum,
                             const Tensor& row_scale) {
  using namespace attn90;
  const char* op = "fused_attention_backward";
  FFN_CHECK(sm90_attention_supported(qkv, heads) && aligned16(y) && aligned16(dy) &&
                aligned16(dqkv),
            "[", op, "] the Hopper kernel cannot run ", qkv.desc(), " with ", heads, " heads");
  const int dev = qkv.device().index;
  DeviceGuard guard(dev);
  const int64_t b = qkv.size(0), t = qkv.size(1);
  const Geometry g{t, static_cast<int>(heads), scale,
                   row_scale.defined() ? static_cast<const float*>(row_scale.data_ptr()) : nullptr};
  const DeviceMask mask = DeviceMask::from(d);
  const CUtensorMap q128 = rows_map(qkv, 128, op), q64 = rows_map(qkv, 64, op);
  const CUtensorMap dy64 = rows_map(dy, 64, op);
  Tensor dsum = Tensor::empty({b * heads, t}, DType::f32, qkv.device());
  Units units{b * heads, static_cast<int>((t + 127) / 128), /*alternate=*/false, b * heads};
  const unsigned grid = persistent_grid(units, dev);
  units.group = unit_group(units, grid, t, dev, !d.active());  // Note [Unit order]
  const float2* rope =
      rope_base > 0 ? static_cast<const float2*>(rope_table(dev, t, kD, rope_base).data_ptr())
                    : nullptr;
  const int64_t qtiles = (t + 63) / 64;
  // The rotation is a template argument: the kernels without it carry none of its code.
  auto launch = [&]<class T, bool DROP, bool ROPE>() {
    const T* yp = static_cast<const T*>(y.data_ptr());
    const T* dyp = static_cast<const T*>(dy.data_ptr());
    T* dq = static_cast<T*>(dqkv.data_ptr());
    // Note [Attention backward in one pass].
    Tensor dqacc = Tensor::empty({b * heads * qtiles, kDqFloats}, DType::f32, qkv.device());
    Tensor counters = Tensor::empty({b * heads * qtiles}, DType::i32, qkv.device());
    // Note [QKV bias gradient in the attention backward]: a row of partial column sums per
    // sequence's 64-row tile, [B·⌈T/64⌉, 3·H·64].
    const int64_t width = 3 * heads * kD;
    Tensor part;
    if (dqkv_sum) part = Tensor::empty({b * qtiles, width}, DType::f32, qkv.device());
    float* dbpart = dqkv_sum ? part.data<float>() : nullptr;
    const int64_t rows = b * t;
    dsum_kernel<T><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream(dev)>>>(
        yp, dyp, dsum.data<float>(), rows, t, g.heads, static_cast<int*>(counters.data_ptr()),
        counters.numel());
    FFN_CHECK_LAUNCH();
    auto* k = g.row_scale ? dkv_kernel<T, DROP, ROPE, true> : dkv_kernel<T, DROP, ROPE, false>;
    allow_dynamic_smem(reinterpret_cast<const void*>(k), BwdPipe::kSmem);
    k<<<grid, kThreads<>, BwdPipe::kSmem, stream(dev)>>>(
        q128, q64, dy64, lse.data<float>(), dsum.data<float>(), dq, g, units, mask, rope,
        dqacc.data<float>(), static_cast<int*>(counters.data_ptr()), dbpart);
    FFN_CHECK_LAUNCH();
    if (dqkv_sum) {
      reduce_partials_kernel<float, T>
          <<<static_cast<unsigned>((width + 31) / 32), dim3(32, 8), 0, stream(dev)>>>(
              dbpart, b * qtiles, width, static_cast<T*>(dqkv_sum->data_ptr()));
      FFN_CHECK_LAUNCH();
    }
  };
  with_half_drop(qkv.dtype(), d.active(), [&]<class T, bool DROP>() {
    if (rope)
      launch.template operator()<T, DROP, true>();
    else
      launch.template operator()<T, DROP, false>();
  });
}

}  // namespace ffn::cuda
