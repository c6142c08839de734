// kernels/cuda/gemm/norm_epilogue.cuh — the epilogue that ends a pre-norm block's branch
// inside the GEMM that produces it (Note [Residual add and norm in the epilogue]): the
// projection's or fc2's h = x·Wᵀ + bias is added, with its dropout, into the fp32 residual
// stream, and the LayerNorm (or RMSNorm) of the sum is written as the next GEMM's input. h is
// never stored, and no norm pass runs after the GEMM.
#pragma once

#include "kernels/cuda/gemm/epilogue.cuh"

namespace ffn::cuda::gemm {

// Note [Residual add and norm in the epilogue]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Unfused, the branch's GEMM writes h [M, N] in 16 bits and add_layer_norm (Note [Residual add
// and norm] in kernels/layer_norm.h) reads h and the residual x, writes a = x + dropout(h) in
// fp32 and y = norm(a) in 16 bits: 2 + 2 + 4 + 4 + 2 = 14 bytes an element over two kernels.
// Here the GEMM's epilogue does it: 4 + 4 + 2 = 10, plus a's tile read back from L2. A row's
// statistics need all N columns and a tile holds BN of them, so the N / BN tiles of a row
// block run as one cluster (sm90_gemm_norm.cu's kernel; N = 2 or 4 tiles of 192 columns, or
// 2 to 4 of 128), each CTA its own tile:
//   1. Each consumer warpgroup rounds its 64 × BN block of acc + bias to T (h exactly as the
//      unfused GEMM stores it) into shared memory, then walks it a row at a time, 8 columns a
//      lane: a = x + h ⊙ mask with dropout_add's arithmetic and mask bits (element i = row·N +
//      col, Note [Dropout RNG]), so `a` equals the unfused path's bit for bit given the same
//      product. a is stored, and the tile's mean and squared deviations from it of each row
//      (RMSNorm: the sum of squares) go to part[tn][row] in global memory.
//   2. The CTA's threads meet; one fences and arrives on a barrier in every CTA of the
//      cluster; once a CTA's barrier has all of them, its threads merge each row's tile
//      statistics in column order (Chan's update: a function of the tile sizes only) and
//      store y = (a - mean)·rstd·w + b for their own tile, reading back the `a` each stored.
// The statistics are summed in a different order than layer_norm's warp does, so y, mean and
// rstd match the unfused pass to rounding, not bit for bit; every CTA of a row block merges
// them alike, so its tiles agree.
// Measured (H200, session 41, ffn-bench --norm, ms, against cuBLASLt's GEMM followed by the
// norm's pass): gpt2's projection 0.197 against 0.080, its fc2 0.295 against 0.157, the char
// models' 0.068-0.079 against 0.041-0.050; a gpt2_small step 29.33 -> 30.40 ms with it on the
// attention projections (the char models 5% slower). A first version without clusters,
// where the CTA that finished a row block's last tile normalized the whole block, was as
// slow (0.19-0.28 ms; ncu: SMs active 56% of the kernel). Taking parts out (session 41, call
// 4): the GEMM with only the staging 0.046-0.051 ms, the add walk about 0.05 more, the
// normalization the rest. Both walks are bound by the latency of their loads (a few rows a
// lane in flight, 1.9 TB/s at best) and run while both consumer warpgroups' tensor cores
// wait, where the norm's own pass streams at 3.3 TB/s. What would make it pay: the tiles'
// epilogues beside the other warpgroup's products (ping-pong, Note [Hopper GEMM ping-pong])
// and x read and a, y written by TMA in large asynchronous boxes. So it is off by default
// (norm_epilogue() in kernels/gemm.h), wired only to the attention projection's GEMM
// (fn::linear_add_layer_norm); fc2 inside the fused FFN is not.
template <class T>
struct AddNormEpi {
  const T* bias;     // optional [n]
  const float* res;  // x [m, n]
  float* a;          // [m, n]
  T* y;              // [m, n]
  const T* w;        // the norm's weight [n]
  const T* b;        // the norm's bias [n], optional (never with RMSNorm)
  float* mean;       // [m]; null: RMSNorm
  float* rstd;       // [m]
  float2* part;      // [tiles_n, m]: each tile's (mean, squared deviations) of a row
  int m, n, tiles_n, bn;
  float eps;
  DeviceMask mask;

  // ROWS rows of the tile rounded to T (pitch BN + 8 against bank conflicts), and in the
  // first warpgroup's, the row block's barrier (stats_barrier).
  template <int BN, int ROWS>
  static constexpr int kScratchBytes = ROWS*(BN + 8) * 2 + 16;

  // The barrier the row block's CTAs (a cluster) arrive on once their tiles' statistics are
  // stored: in the first consumer warpgroup's scratch, after its staged rows.
  template <int BN>
  __device__ static uint64_t* stats_barrier(uint8_t* scratch0) {
    return reinterpret_cast<uint64_t*>(scratch0 + 64 * (BN + 8) * 2);
  }

  // j: the CTA's tile count so far (the barrier's phase); kC: the CTAs of a row block.
  template <int kC, int R>
  __device__ __forceinline__ void tile(const float (&acc)[R], const TileCtx& t, int j) const {
    constexpr int BN = 2 * R, P = BN + 8;
    static_assert(BN % 64 == 0, "whole 8-column runs");
    T* st = reinterpret_cast<T*>(t.scratch);
    const int half = (t.rows % 128) / 64;  // which consumer warpgroup (cooperative)
    {
      const int lr = t.row0 - t.rows, lc = t.col0 - t.cols;
#pragma unroll
      for (int i = 0; i < R; i += 4) {
        const int c = lc + 2 * i;
        float b0 = 0.0f, b1 = 0.0f;
        if (bias && t.cols + c < n) {
          b0 = to_acc(__ldg(bias + t.cols + c));
          b1 = to_acc(__ldg(bias + t.cols + c + 1));
        }
        store_pair(st + lr * P + c, true, true, acc[i] + b0, acc[i + 1] + b1);
        store_pair(st + (lr + 8) * P + c, true, true, acc[i + 2] + b0, acc[i + 3] + b1);
      }
    }
    named_barrier_sync(t.barrier, 128);
    add_rows<BN>(st, t);
    // Step 2: the CTA's threads meet; one fences (cumulative: it orders the stores the
    // barrier made it see) and arrives on the barrier of every CTA of the row block; all wait
    // for the row block's arrivals, then each CTA normalizes its own tile.
    named_barrier_sync(kCtaBarrier, 256);
    uint64_t* bar = stats_barrier<BN>(t.scratch - half * kScratchBytes<BN, 64>);
    if (half == 0 && t.wg_thread == 0) {
      __threadfence();
#pragma unroll
      for (int p = 0; p < kC; ++p) mbar_arrive_cluster(bar, p);
    }
    mbar_wait(bar, j & 1);
    normalize_tile<BN>(t);
  }

  static constexpr int kCtaBarrier = 3;  // both consumer warpgroups (1 and 2 are theirs)

  // Before the tile's mainloop: its block of x into L2 (prefetch.global.L2), so that the
  // reads of step 1 overlap the products instead of following them. rows, cols: the
  // warpgroup's block; thread: 0..127.
  template <int BN>
  __device__ __forceinline__ void prefetch(int rows, int cols, int thread) const {
    constexpr int kLines = BN * 4 / 128;  // 128-byte lines of a block row
    for (int i = thread; i < 64 * kLines; i += 128) {
      const int row = rows + i / kLines, col = cols + 32 * (i % kLines);
      if (row < m && col < n)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(res + static_cast<int64_t>(row) * n + col));
    }
  }

  // Step 1: lanes take 8-column runs of a row, L lanes a row (16 for 128-column tiles, else
  // a warp), four warps walking the warpgroup's 64 rows, kBatch rows a lane at a time: their
  // loads are issued together, so a lane has that many in flight (one at a time, the walk
  // was bound by the latency of x's loads: gpt2's projection took 0.28 ms against 0.08 for
  // the GEMM and the norm's pass, H200, session 41).
  template <int BN>
  __device__ __forceinline__ void add_rows(const T* st, const TileCtx& t) const {
    constexpr int P = BN + 8, kRuns = BN / 8, L = kRuns <= 16 ? 16 : 32, RP = 32 / L;
    constexpr int kBatch = 4, kStep = 4 * RP;  // rows between a lane's consecutive rows
    static_assert(64 % (kStep * kBatch) == 0, "whole batches");
    const int lane = t.wg_thread % 32, warp = t.wg_thread / 32;
    const int run = lane % L, col = t.cols + 8 * run;
    const int tn = t.cols / BN;
    const int cnt = min(BN, n - t.cols);  // this tile's columns (n % 8 == 0)
    const bool in_cols = run < kRuns && col < n;
    const DeviceMask mk = mask.resolved();  // the shift read once, not once a run
#pragma unroll 1
    for (int r0 = RP * warp + lane / L; r0 < 64; r0 += kStep * kBatch) {
      float av[kBatch][8];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int rr = r0 + j * kStep, row = t.rows + rr;
        if (in_cols && row < m) {
          const int64_t i0 = static_cast<int64_t>(row) * n + col;
          float hv[8], f[8];
          load_vec<8>(st + rr * P + 8 * run, hv);
          load_vec<8>(res + i0, av[j]);
          mk.factors<8>(i0, f);
#pragma unroll
          for (int e = 0; e < 8; ++e) av[j][e] = add_rn(av[j][e], mul_rn(hv[e], f[e]));
          store_vec<8>(a + i0, av[j]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) av[j][e] = 0.0f;
        }
      }
      float mt[kBatch], q[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        mt[j] = 0.0f;
        if (mean) {
#pragma unroll
          for (int e = 0; e < 8; ++e) mt[j] += av[j][e];
        }
      }
      if (mean) {
        lanes_sum<L, kBatch>(mt);
#pragma unroll
        for (int j = 0; j < kBatch; ++j) mt[j] /= static_cast<float>(cnt);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const bool valid = in_cols && t.rows + r0 + j * kStep < m;
        q[j] = 0.0f;
        if (valid)
#pragma unroll
          for (int e = 0; e < 8; ++e) q[j] += (av[j][e] - mt[j]) * (av[j][e] - mt[j]);
      }
      lanes_sum<L, kBatch>(q);
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int row = t.rows + r0 + j * kStep;
        if (run == 0 && row < m)
          part[static_cast<int64_t>(tn) * m + row] = make_float2(mt[j], q[j]);
      }
    }
  }

  // Sums over groups of L lanes, B values at once (their shuffles interleaved).
  template <int L, int B>
  __device__ __forceinline__ static void lanes_sum(float (&v)[B]) {
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1)
#pragma unroll
      for (int j = 0; j < B; ++j) v[j] += __shfl_xor_sync(0xffffffffu, v[j], o);
  }

  // Step 2's normalization of the warpgroup's 64 rows of the tile, in add_rows' layout (each
  // thread reads back the `a` it stored), kBatch rows a lane at a time: the row's tile
  // statistics merged in column order (Chan et al.'s pairwise update; RMSNorm: means 0, the
  // sums of squares added), then y = (a - mean)·rstd·w + b. The first tile's CTA writes mean
  // and rstd.
  template <int BN>
  __device__ __forceinline__ void normalize_tile(const TileCtx& t) const {
    constexpr int kRuns = BN / 8, L = kRuns <= 16 ? 16 : 32, RP = 32 / L;
    constexpr int kBatch = 4, kStep = 4 * RP;
    const int lane = t.wg_thread % 32, warp = t.wg_thread / 32;
    const int run = lane % L, col = t.cols + 8 * run;
    const bool in_cols = run < kRuns && col < n;
    float wv[8], bv[8] = {};
    if (in_cols) {
      load_vec<8>(w + col, wv);
      if (b) load_vec<8>(b + col, bv);
    }
#pragma unroll 1
    for (int r0 = RP * warp + lane / L; r0 < 64; r0 += kStep * kBatch) {
      float mu[kBatch], r[kBatch], av[kBatch][8];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int row = t.rows + r0 + j * kStep;
        mu[j] = 0.0f, r[j] = 0.0f;
        if (row >= m) continue;
        float q = 0.0f, cnt = 0.0f;
        for (int tn = 0; tn < tiles_n; ++tn) {
          const float2 p = __ldcg(part + static_cast<int64_t>(tn) * m + row);
          const float c = static_cast<float>(min(bn, n - tn * bn));
          if (tn == 0) {
            mu[j] = p.x, q = p.y, cnt = c;
          } else {
            const float tot = cnt + c, d = p.x - mu[j];
            mu[j] += d * (c / tot);
            q += p.y + d * d * (cnt * c / tot);
            cnt = tot;
          }
        }
        r[j] = 1.0f / sqrtf(q / static_cast<float>(n) + eps);
        if (in_cols) load_vec<8>(a + static_cast<int64_t>(row) * n + col, av[j]);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int row = t.rows + r0 + j * kStep;
        if (row >= m) continue;
        if (t.cols == 0 && run == 0) {
          if (mean) mean[row] = mu[j];
          rstd[row] = r[j];
        }
        if (!in_cols) continue;
        float o[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = (av[j][e] - mu[j]) * r[j] * wv[e] + bv[e];
        store_vec<8>(y + static_cast<int64_t>(row) * n + col, o);
      }
    }
  }
};

}  // namespace ffn::cuda::gemm
