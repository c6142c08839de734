// kernels/cuda/attention_sm90_fwd.cu — the Hopper attention forward (Note [Hopper
// attention], attention_sm90.cuh: 128 or 192 queries a unit, Note [Forward block rows];
// 128-key tiles) and the entry points' shape check.
#include "kernels/cuda/attention_sm90.cuh"

namespace ffn::cuda {
namespace attn90 {
namespace {

// Note [Forward block rows]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A forward unit is a block of 64·NC queries of one head: NC consumer warpgroups of 64 rows
// each, all reading the same streamed 128-key tiles. With NC = 3 (192 rows, FlashAttention-3's
// tile for head size 64) a key tile loaded into shared memory serves 192 queries instead of
// 128 and 12 consumer warps instead of 8 hide each other's latencies, at 160 registers a
// consumer thread instead of 240 (512 threads, one CTA an SM).
// Where the blocks start matters when 192 does not divide T. Blocks from row 0 leave the
// partial block at the end, where its one or two busy warpgroups take the most key tiles
// while the others idle (at T = 1024 one warpgroup of three walks 8 tiles in each head's
// last unit: measured no faster than 128 rows, against −11% at T = 512; session 36). So
// 192-row blocks end at T: block qt is rows T − 192·(blocks − qt) .. T − 192·(blocks − qt −
// 1) − 1, and the partial block is the first, whose rows need one or two key tiles; its rows
// before 0 load as zeros (TMA fills negative coordinates too) and belong to warpgroups that
// skip the unit. That keeps every warpgroup's first row r0 a multiple of 64 only where T is,
// so 192-row blocks run only there (and without dropout: the dropout kernel spills at 160
// registers); 128-row blocks start at row 0 as before.
// A block's warpgroups need different numbers of key tiles under the causal mask: warpgroup
// c's rows r0 .. r0 + 63 see tiles 0 .. ⌊(min(r0 + 64, T) − 1)/128⌋, none if its rows are all
// past T or before 0. With r0 a multiple of 64 only its last tile crosses its diagonal (tile
// k − 1 ends at 128k − 1 < r0 when 128k ≤ r0 + 63), so the causal test stays on one tile. The
// producer streams the block's longest count; a warpgroup whose rows end sooner (or that has
// none) waits for each remaining tile to land and releases it unread: arriving on a stage's
// empty barrier before its fill would count toward the stage's previous phase. Same
// per-row arithmetic either way, so both sizes give the same bits.
constexpr int kFwdKeys = 128, kFwdStages = 4;

// Note [Forward ping-pong]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Optionally (sm90_attention_force_forward_pingpong) the consumer warpgroups take turns to
// issue their products, FlashAttention-3's inter-warpgroup schedule: warpgroup c waits at
// named barrier kTurnBarrier + c, issues S = Q·Kᵀ of its next tile (and P·V of the one
// before), and arrives at c + 1's (mod NC), so that while one warpgroup's products run on the
// tensor cores the others work on their softmax instead of all contending for both at once.
// Every warpgroup takes n + 1 turns a unit (n: the block's key tiles), whatever its own
// rows need: a warpgroup that is done (or has no rows) takes one per tile it releases
// unread, so the turns line up across units of different lengths. The first turn is
// warpgroup 0's (the last one arrives once before its first unit) and warpgroup 0 takes the
// last hand-over back after its units. The same products in the same order per warpgroup:
// the same bits either way. Measured (H200, session 40, ffn-bench --attention, one run, no
// dropout, forward ms, off → on): 128-row blocks 0.0953 → 0.0936 at gpt2_small's shape and
// 0.0286 → 0.0274 at shakespeare_char's; 192-row blocks 0.0879 → 0.0890 (gpt2_small) and
// 0.0612 → 0.0620 (T = 512). Within a run's noise of the default, so off by default; the
// bench times both, for the next device to say.
[[maybe_unused]] constexpr int kTurnBarrier = 1;  // ids 1 .. NC (0 is __syncthreads'); device only
// 192-row blocks by default from this T (where 64 divides it): measured at B·H = 192 heads and
// more (H100, ffn-bench --attention, session 36), the forward at T = 1024 −10%, T = 512 −7%,
// T = 256 +3% (two blocks a head, one with a single busy warpgroup).
constexpr int64_t kFwd192FromT = 512;
template <int NC>
using FwdPipe = Pipe<kFwdKeys, kFwdStages, 0, NC, /*RES=*/1>;  // Q only
template <int NC>
constexpr int kFwdRows = 64 * NC;

// The first row of query block qt of `blocks` (Note [Forward block rows]): 128-row blocks
// from row 0, 192-row blocks ending at T (negative for a partial first block).
template <int NC>
__host__ __device__ __forceinline__ int64_t fwd_block_row(int qt, int blocks, int64_t t) {
  return NC == 3 ? t - static_cast<int64_t>(kFwdRows<NC>) * (blocks - qt)
                 : static_cast<int64_t>(kFwdRows<NC>) * qt;
}
// Key tiles that warpgroup c of the block at row q0 reads: 0 for rows past T or before 0.
template <int NC>
__host__ __device__ __forceinline__ int fwd_key_tiles(int64_t q0, int c, int64_t t) {
  const int64_t r0 = q0 + 64 * c;
  if (r0 < 0 || r0 >= t) return 0;
  const int64_t last = (r0 + 64 < t ? r0 + 64 : t) - 1;
  return static_cast<int>(last / kFwdKeys) + 1;
}
// Key tiles the producer streams for the block at row q0 (its last row's; the block has rows
// in 0 .. T − 1): the most any of its warpgroups reads.
template <int NC>
__host__ __device__ __forceinline__ int unit_key_tiles(int64_t q0, int64_t t) {
  const int64_t end = q0 + kFwdRows<NC>;
  return static_cast<int>(((end < t ? end : t) - 1) / kFwdKeys) + 1;
}

// Note [Half diagonal tile]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A warpgroup's 64 rows start at a multiple of 64 (Note [Forward block rows]), so where they
// start at a multiple of 128 (and where T ends them early) the last key tile's second 64 keys
// all come after every one of its rows: the causal mask zeroes them. That tile then runs at N
// = 64: S = Q·Kᵀ as m64n64, the softmax over its 32 scores a thread, P·V over 4 k-steps
// instead of 8, about a twentieth of the forward's products and exponentials at T = 1024.
// The keys left out only ever added exact zeros (−∞ scores: no max, ex2 = 0, P·V += 0), so the
// outputs and the log-sum-exp keep their bits. Not in the dropout kernels, whose consumers
// have no registers for both paths (ptxas serialized their wgmmas, C7511). Measured (H200,
// session 42, ffn-bench --attention alternated twice, forward ms, before → after):
// gpt2_small's shape 0.0877/0.0880 → 0.0867/0.0865, T = 512 0.0613/0.0612 → 0.0607/0.0604,
// shakespeare_char's 0.0284/0.0298 → 0.0271/0.0270: less than the work left out, since a
// 192-row block's time is its longest warpgroup's, and that one often has a whole last tile.

// Per key tile kt ≥ 1 (FlashAttention-3's intra-warpgroup overlap): issue S = Q·Kᵀ of tile
// kt, then O += P·V of tile kt − 1 (P packed at the end of the previous tile); wait for S
// only and run the softmax of tile kt on the CUDA cores while the tensor cores finish P·V;
// then wait for P·V, release tile kt − 1's stage, rescale O and pack P of tile kt. Every
// non-wgmma write of O and of P's registers happens with no wgmma in flight, which is what
// lets ptxas keep the wgmmas asynchronous (it serializes them otherwise, warning C7515).
// nkt: this warpgroup's key tiles, n ≥ nkt the unit's (Note [Forward block rows]).
template <class T, bool DROP, int NC, bool PP, bool WHOLE>
__device__ void fwd_consume(const FwdPipe<NC>& p, const Geometry& g, int c, int j, int base,
                            int64_t bh, T* y, float* lse, int64_t q0, int nkt, int n,
                            const DeviceMask& mask) {
  const int tid = threadIdx.x - 128 * (c + 1), warp = tid / 32, lane = tid % 32;
  // Note [Forward ping-pong]: each warpgroup issues its products between taking the turn
  // from the one before it and handing it to the next; n + 1 turns a unit whichever its rows.
  auto take_turn = [&] {
    if constexpr (PP) named_barrier_sync(kTurnBarrier + c, 256);
  };
  auto pass_turn = [&] {
    if constexpr (PP) named_barrier_arrive(kTurnBarrier + (c + 1) % NC, 256);
  };
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
  // The unit's tiles past this warpgroup's last: wait for each to land, release it unread
  // (and take and pass a turn for each, as the warpgroups still using them do).
  auto release_rest = [&] {
    for (int kt = nkt; kt < n; ++kt) {
      const Slot<kFwdStages> at(base + kt);
      mbar_wait(&p.full[at.stage], at.phase);
      if (lane == 0) mbar_arrive(&p.empty[at.stage]);
      take_turn();
      pass_turn();
    }
  };
  if (nkt == 0) {  // rows past T or before 0
    if (lane == 0) mbar_arrive(&p.res_empty[j & 1]);
    take_turn();
    pass_turn();
    release_rest();
    return;
  }
  const uint64_t dq = smem_desc_k128(p.resident(j & 1, 0) + c * 64 * kRowBytes);
  // Note [Half diagonal tile]: N = 64 for the first half of a key tile (s and pa's first
  // halves), 128 for the whole tile.
  auto issue_scores = [&]<int N>(int kt) {
    const Slot<kFwdStages> at(base + kt);
    mbar_wait(&p.full[at.stage], at.phase);
    take_turn();    // after the tile landed: no turn is held while waiting for memory
    wgmma_fence();  // orders the registers written since the last wgmmas (s, O, P) before them
    mma_scores<N, T>(reinterpret_cast<float(&)[N / 2]>(s), dq, smem_desc_k128(p.tile(at.stage, 0)));
    wgmma_commit();
  };
  auto issue_pv = [&]<int N>(int kt) {
    mma_rows<N, T>(o, reinterpret_cast<u32(&)[N / 16][4]>(pa),
                   smem_desc_mn128(p.tile(Slot<kFwdStages>(base + kt).stage, 1), kBox64));
    wgmma_commit();
  };
  // The softmax of tile kt's scores in s: the running max and sum (log2 units), P (dropped)
  // in s, and the factor alpha by which O must be rescaled. Trimmed to the few instructions
  // per score that bound this kernel (Note [Hopper attention]): the causal test only on the
  // diagonal tile, in 32-bit offsets; the max on the raw scores (scale > 0); one FFMA before
  // each exp2; the dropout code only in the DROP kernels.
  auto softmax = [&]<int N>(int kt, float(&alpha)[2]) {
    const int64_t k0 = 128LL * kt;
    float mx[2] = {-INFINITY, -INFINITY};
    auto scan = [&]<bool DIAG>() {
      // Key j = k0 + 8n + 2cq + (e&1) is after query i = qw + gr + 8(e/2) when rel + 8n +
      // (e&1) − 8(e/2) > 0 (|rel| < 256 on the diagonal tile).
      const int rel = DIAG ? static_cast<int>(k0 - qw) - gr + 2 * cq : 0;
#pragma unroll
      for (int n = 0; n < N / 8; ++n)
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
    for (int n = 0; n < N / 8; ++n)
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
  // Note [Half diagonal tile]: this warpgroup's last row in the first half of its last tile.
  // Not in the dropout kernels: there ptxas runs out of registers for the wgmma pipeline
  // with both paths (C7511) and serializes the products.
  // WHOLE: every tile whole (sm90_attention_force_whole_diagonal, for tests; a template
  // argument, since a run-time switch there cost the ping-pong kernels their wgmma pipeline's
  // registers, C7511).
  const bool half =
      !DROP && !WHOLE && ((qw - 16 * warp + 64 < t ? qw - 16 * warp + 64 : t) - 1) % kFwdKeys < 64;
  auto first = [&]<int N>() {
    issue_scores.template operator()<N>(0);
    pass_turn();
    wgmma_wait<0>();
    fence_accumulators(s);
    softmax.template operator()<N>(0, alpha);  // O is still zero: no rescale
    to_a<T, N>(reinterpret_cast<const float(&)[N / 2]>(s), reinterpret_cast<u32(&)[N / 16][4]>(pa));
  };
  auto step = [&]<int N>(int kt) {
    issue_scores.template operator()<N>(kt);
    issue_pv.template operator()<128>(kt - 1);  // every tile before the last is whole
    pass_turn();
    wgmma_wait<1>();  // S of tile kt
    fence_accumulators(s);
    softmax.template operator()<N>(kt, alpha);
    wgmma_wait<0>();  // P·V of tile kt − 1
    fence_accumulators(o);
    fence_operands(pa);
    if (lane == 0) mbar_arrive(&p.empty[Slot<kFwdStages>(base + kt - 1).stage]);
#pragma unroll
    for (int i = 0; i < 32; ++i) o[i] *= alpha[(i >> 1) & 1];
    to_a<T, N>(reinterpret_cast<const float(&)[N / 2]>(s), reinterpret_cast<u32(&)[N / 16][4]>(pa));
  };
  if (half && nkt == 1)
    first.template operator()<64>();
  else
    first.template operator()<128>();
  for (int kt = 1; kt < nkt - 1; ++kt) step.template operator()<128>(kt);
  if (nkt > 1) {
    if (half)
      step.template operator()<64>(nkt - 1);
    else
      step.template operator()<128>(nkt - 1);
  }
  take_turn();
  // The fence inside each branch: one before it left ptxas inserting its own in the divergent
  // path and serializing every wgmma of the kernel (C7520).
  if (half) {
    wgmma_fence();
    issue_pv.template operator()<64>(nkt - 1);
  } else {
    wgmma_fence();
    issue_pv.template operator()<128>(nkt - 1);
  }
  pass_turn();
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
  release_rest();
}

template <class T, bool DROP, int NC, bool PP, bool WHOLE = false>
__global__ void __launch_bounds__(kThreads<NC>, 1)
    fwd_kernel(const __grid_constant__ CUtensorMap q_map,
               const __grid_constant__ CUtensorMap kv_map, T* y, float* lse, Geometry g,
               Units units, DeviceMask mask) {
#if FFN_ATTN_SM90_CODE
  const FwdPipe<NC> p = begin_cta<FwdPipe<NC>>(&q_map, &kv_map);
  // Note [Forward ping-pong]: the first turn is warpgroup 0's; the last warpgroup's final
  // hand-over is taken back after the units, so the barrier is idle when the CTA exits.
  const int cw = threadIdx.x / 128 - 1;  // consumer warpgroup, −1 for the producer
  if (PP && cw == NC - 1) named_barrier_arrive(kTurnBarrier, 256);
  // Unit u: query block qt of head bh, the last blocks (most key tiles) first.
  auto unit = [&](int64_t u, int64_t& bh, int& qt) {
    int b32;
    units.split32(static_cast<int>(u), b32, qt);
    bh = b32;
    qt = units.blocks - 1 - qt;
  };
  RingPos at;
  run_units<24, NC == 3 ? 160 : 240, NC>(
      units,
      [&](int j, int64_t u) {
        int64_t bh;
        int qt;
        unit(u, bh, qt);
        const int b = static_cast<int>(bh / g.heads), h = static_cast<int>(bh % g.heads);
        const int64_t q0 = fwd_block_row<NC>(qt, units.blocks, g.t);
        produce(p, at, j, Load{&q_map, h * kD}, Load{nullptr, 0}, static_cast<int>(q0),
                Load{&kv_map, (g.heads + h) * kD}, Load{&kv_map, (2 * g.heads + h) * kD}, 0,
                unit_key_tiles<NC>(q0, g.t), b);
      },
      [&](int j, int64_t u, int base) {
        int64_t bh;
        int qt;
        unit(u, bh, qt);
        const int c = threadIdx.x / 128 - 1;
        const int64_t q0 = fwd_block_row<NC>(qt, units.blocks, g.t);
        const int n = unit_key_tiles<NC>(q0, g.t);
        fwd_consume<T, DROP, NC, PP, WHOLE>(p, g, c, j, base, bh, y, lse, q0,
                                            fwd_key_tiles<NC>(q0, c, g.t), n, mask);
        return n;
      });
  if (PP && cw == 0) named_barrier_sync(kTurnBarrier, 256);
#endif
}

}  // namespace
}  // namespace attn90

namespace attn90 {
std::atomic<int64_t> forced_unit_group{0};
std::atomic<int64_t> forced_grid{0};
std::atomic<int64_t> forced_forward_rows{0};
std::atomic<int> forced_forward_pingpong{0};
std::atomic<bool> forced_whole_diagonal{false};
}  // namespace attn90

void sm90_attention_force_unit_group(int64_t heads) {
  attn90::forced_unit_group = heads;
}
void sm90_attention_force_grid(int64_t ctas) {
  attn90::forced_grid = ctas;
}
void sm90_attention_force_forward_rows(int64_t rows) {
  FFN_CHECK(rows == 0 || rows == 128 || rows == 192, "[fused_attention] forward block rows ", rows,
            " is not 0 (automatic), 128 or 192");
  attn90::forced_forward_rows = rows;
}
int64_t sm90_attention_forward_rows(int64_t t) {  // Note [Forward block rows]
  const int64_t forced = attn90::forced_forward_rows.load();
  const bool fits = t % 64 == 0;
  if (forced) return forced == 192 && fits ? 192 : 128;
  return fits && t >= attn90::kFwd192FromT ? 192 : 128;
}

void sm90_attention_force_forward_pingpong(int mode) {
  FFN_CHECK(mode >= -1 && mode <= 1, "[fused_attention] forward ping-pong mode ", mode,
            " is not 0 (automatic), 1 (on) or -1 (off)");
  attn90::forced_forward_pingpong = mode;
}
bool sm90_attention_forward_pingpong() {  // Note [Forward ping-pong]
  return attn90::forced_forward_pingpong.load() > 0;
}

void sm90_attention_force_whole_diagonal(bool on) {  // Note [Half diagonal tile]
  attn90::forced_whole_diagonal = on;
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
  const CUtensorMap kv_map = rows_map(qkv, kFwdKeys, op);
  with_half_drop(qkv.dtype(), d.active(), [&]<class T, bool DROP>() {
    auto launch = [&]<int NC>() {
      // 128-row blocks load Q in the key tiles' boxes: one map encoded, not two.
      const CUtensorMap q_map =
          kFwdRows<NC> == kFwdKeys ? kv_map : rows_map(qkv, kFwdRows<NC>, op);
      Units units{b * heads, static_cast<int>((t + kFwdRows<NC> - 1) / kFwdRows<NC>),
                  /*alternate=*/true, b * heads};
      const unsigned grid = persistent_grid(units, dev);
      units.group = unit_group(units, grid, t, dev);  // Note [Unit order]
      auto go = [&](auto kernel) {
        allow_dynamic_smem(reinterpret_cast<const void*>(kernel), FwdPipe<NC>::kSmem);
        kernel<<<grid, kThreads<NC>, FwdPipe<NC>::kSmem, stream(dev)>>>(
            q_map, kv_map, static_cast<T*>(y.data_ptr()), lse.data<float>(), g, units,
            DeviceMask::from(d));
      };
      if (sm90_attention_forward_pingpong())  // Note [Forward ping-pong]
        go(fwd_kernel<T, DROP, NC, true>);
      else if (forced_whole_diagonal.load())  // Note [Half diagonal tile]: tests
        go(fwd_kernel<T, DROP, NC, false, !DROP>);
      else
        go(fwd_kernel<T, DROP, NC, false>);
      FFN_CHECK_LAUNCH();
    };
    if constexpr (!DROP) {  // Note [Forward block rows]
      if (sm90_attention_forward_rows(t) == 192) return launch.template operator()<3>();
    }
    launch.template operator()<2>();
  });
}

}  // namespace ffn::cuda
