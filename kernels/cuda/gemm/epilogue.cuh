// kernels/cuda/gemm/epilogue.cuh — what the Hopper GEMM does with a consumer's accumulators
// before they leave registers. epi.tile(acc, row0, col0) gets the fragment of wgmma.cuh's
// layout: acc[4j + 0/1] are C[row0][col0 + 8j + 0/1], acc[4j + 2/3] the same columns of row
// row0 + 8 (col0 even, the lane's first column). Epilogues bounds-check and store; the FFN's
// elementwise work lives here, so it costs no extra pass over memory. All 32 lanes of a warp
// call tile() together (the staged epilogues meet at the warpgroup's named barrier).
//
//   StoreC          C = acc (+ bias[col]), stored from registers (any N)
//   StoreCTma       the same through shared memory and TMA stores (N % 8 == 0): the stores
//                   run asynchronously while the warpgroup goes on to its next tile; with
//                   ROW_OPS (the variant that knows its rows), each row first scaled by
//                   row_scale[row] where given (before the bias; Note [RMSNorm folded into
//                   the QKV GEMM] in layers/attention.cpp) and the first columns (heads of 64)
//                   rotated by rotary embeddings where given (Note [Fused rotary embeddings])
//   StorePartial    split-K: fp32 partial sums into a workspace (Note [Split-K])
//   BiasActDropout  z = round(acc) (stored if asked), hd = dropout(act(z + b1)): fc1 of the
//                   plain FFN. z is rounded to T before the bias exactly as the unfused path
//                   stores it, so hd is the value bias_act_dropout(z) gives, and the mask is
//                   the DropoutSpec's element i = row·N + col (Note [Dropout RNG]).
//   ActTma          the FFN's activation without dropout, two outputs through TMA stores
//                   (Note [Activation epilogues]): forward z and hd = act(z + b1); backward
//                   dz = dhd ⊙ act'(z + b1) and the recomputed hd, reading the saved z.
#pragma once

#include "core/cuda/types.cuh"
#include "kernels/activation.h"
#include "kernels/cuda/gemm/sm90.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/rowwise.cuh"  // DeviceMask

namespace ffn::cuda::gemm {

// Where a consumer warpgroup's 64×BN block of the output lies, and its scratch space.
struct TileCtx {
  int row0, col0;    // this lane's first row and column (wgmma.cuh's layout)
  int rows, cols;    // the block's first row and column
  int wg_thread;     // 0..127 within the consumer warpgroup
  int barrier;       // named barrier id of the warpgroup
  uint8_t* scratch;  // kScratchBytes<BN> of shared memory owned by this warpgroup
  const CUtensorMap* c_map;  // C as 64×64 boxes with 128-byte swizzling (StoreCTma)
  const CUtensorMap* c2_map;  // a second output of the same shape (ActTma), or unused
  int split = 0;             // the unit's part of K (StorePartial; Note [Split-K])
  // StoreCTma: the 64-column subtiles the warpgroup stored before this block, so that its two
  // buffers keep alternating across blocks of an odd number of subtiles (BN = 192: with each
  // tile starting at buffer 0, a tile's first subtile was written into the buffer its
  // predecessor's last store might still be reading).
  int sub = 0;

  // Consumer warpgroup c's context (the CTA's warpgroup c + 1; warpgroup 0 produces): its
  // thread index, named barrier 1 + c and its part of the scratch, kScratch bytes a warpgroup.
  __device__ __forceinline__ static TileCtx of_consumer(int c, uint8_t* scratch, int kScratch) {
    TileCtx t;
    t.wg_thread = static_cast<int>(threadIdx.x) - 128 * (c + 1);
    t.barrier = 1 + c;
    t.scratch = scratch + c * kScratch;
    return t;
  }

  // The block whose first row and column are (r, c), and this thread's first element in it:
  // the accumulator layout of wgmma.cuh, rows 16·warp + lane/4 (+8), columns 8·(i/4) +
  // 2·(lane%4) (+1), warp and lane within the warpgroup (wg_thread).
  __device__ __forceinline__ void place(int r, int c) {
    rows = r;
    cols = c;
    row0 = r + 16 * (wg_thread / 32) + (wg_thread % 32) / 4;
    col0 = c + 2 * (wg_thread % 4);
  }
};

// Stores a pair: one 4-byte store when both are in range and the row start is aligned.
template <class T>
__device__ __forceinline__ void store_pair(T* p, bool second, bool paired, float v0, float v1) {
  if (paired && second) {
    using P = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, __nv_bfloat162, __half2>;
    P two;
    two.x = from_acc<T>(v0);
    two.y = from_acc<T>(v1);
    *reinterpret_cast<P*>(p) = two;
  } else {
    p[0] = from_acc<T>(v0);
    if (second) p[1] = from_acc<T>(v1);
  }
}

// Note [Staging with stmatrix]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A warpgroup's 64 rows × 64 columns of accumulators, v[first + 4j + e] (row r = 16·warp +
// lane / 4, column 8j + 2(lane % 4) + e) and v[first + 4j + 2 + e] (row r + 8), rounded to T
// into a 64×64 box of TMA's 128-byte swizzle (16-byte chunk c of row r at c ^ (r % 8)). Column
// groups j and j + 1 of rows r and r + 8 are the four 8×8 matrices of one stmatrix.x4, in the
// order top j, bottom j, top j + 1, bottom j + 1; lane l addresses row l % 8 of matrix l / 8,
// and each matrix row is one 16-byte chunk, so the eight rows of a matrix land in eight
// different chunks (no bank conflicts). Four instructions a thread where 32 four-byte stores
// did it (the consumer of the activation GEMM, Note [Activation warpgroup], stages 128
// accumulators a tile while its tensor cores wait), but no faster by the clock: gpt2's fc1
// activation GEMMs and the bare GEMM within ±1% (H100, session 25), so that staging is not
// what the forward's activation warps wait for.
// kScale: rows r and r + 8 multiplied by s0 and s1 before rounding (v itself is not written:
// a non-wgmma write of accumulator registers while other wgmmas are in flight serializes the
// kernel's wgmmas, ptxas C7515).
template <class T, int R, bool kScale = false>
__device__ __forceinline__ void stage_box(const float (&v)[R], int first, uint8_t* box,
                                          int wg_thread, float s0 = 1.0f, float s1 = 1.0f) {
  static_assert(sizeof(T) == 2, "stmatrix stores 16-bit elements");
  const int lane = wg_thread % 32, m = lane / 8;
  const int row = 16 * (wg_thread / 32) + 8 * (m & 1) + lane % 8;
  const uint32_t base = smem_addr(box) + row * 128;
#pragma unroll
  for (int j = 0; j < 8; j += 2) {
    const int i = first + 4 * j;
    if constexpr (kScale)
      stmatrix_x4(base + (((j + (m >> 1)) ^ (row & 7)) << 4), pack2<T>(v[i] * s0, v[i + 1] * s0),
                  pack2<T>(v[i + 2] * s1, v[i + 3] * s1), pack2<T>(v[i + 4] * s0, v[i + 5] * s0),
                  pack2<T>(v[i + 6] * s1, v[i + 7] * s1));
    else
      stmatrix_x4(base + (((j + (m >> 1)) ^ (row & 7)) << 4), pack2<T>(v[i], v[i + 1]),
                  pack2<T>(v[i + 2], v[i + 3]), pack2<T>(v[i + 4], v[i + 5]),
                  pack2<T>(v[i + 6], v[i + 7]));
  }
}

// mask_draw without a run-time index into the block (which would put it in local memory).
__device__ __forceinline__ uint32_t draw_of(const U32x4& r, uint64_t i) {
  const uint32_t k = static_cast<uint32_t>(i & 7) >> 1;
  const uint32_t w = k == 0 ? r.v[0] : k == 1 ? r.v[1] : k == 2 ? r.v[2] : r.v[3];
  return (i & 1) ? w >> 16 : w & 0xffffu;
}

template <class T>
struct StoreC {
  T* c;
  const T* bias;  // optional [n]
  int m, n;

  template <int BN, int ROWS>
  static constexpr int kScratchBytes = 0;

  template <int R>
  __device__ __forceinline__ void tile(const float (&acc)[R], const TileCtx& t) const {
#pragma unroll
    for (int i = 0; i < R; i += 4) {
      pair(t.row0, t.col0 + 2 * i, acc[i], acc[i + 1]);
      pair(t.row0 + 8, t.col0 + 2 * i, acc[i + 2], acc[i + 3]);
    }
  }

  __device__ __forceinline__ void pair(int row, int col, float v0, float v1) const {
    if (row >= m || col >= n) return;
    const bool second = col + 1 < n;
    if (bias) {
      v0 += to_acc(__ldg(bias + col));
      if (second) v1 += to_acc(__ldg(bias + col + 1));
    }
    store_pair(c + static_cast<int64_t>(row) * n + col, second, (n & 1) == 0, v0, v1);
  }
};

// Split-K (Note [Split-K]): the fp32 partial sums of one K range, into its slice of the
// [splits, m, n] workspace; splitk_reduce adds the bias and rounds.
struct StorePartial {
  float* ws;
  int m, n;

  template <int BN, int ROWS>
  static constexpr int kScratchBytes = 0;

  template <int R>
  __device__ __forceinline__ void tile(const float (&acc)[R], const TileCtx& t) const {
    float* part = ws + static_cast<int64_t>(t.split) * m * n;
#pragma unroll
    for (int i = 0; i < R; i += 4) {
      pair(part, t.row0, t.col0 + 2 * i, acc[i], acc[i + 1]);
      pair(part, t.row0 + 8, t.col0 + 2 * i, acc[i + 2], acc[i + 3]);
    }
  }
  __device__ __forceinline__ void pair(float* part, int row, int col, float v0, float v1) const {
    if (row >= m || col >= n) return;
    float* p = part + static_cast<int64_t>(row) * n + col;
    if (col + 1 < n && (n & 1) == 0) {
      *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
    } else {
      p[0] = v0;
      if (col + 1 < n) p[1] = v1;
    }
  }
};

// Note [TMA store epilogue]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A warpgroup's block leaves in 64-row × 64-column subtiles through two 8 KiB shared-memory
// buffers, used in turn (across blocks too, TileCtx::sub): thread 0 of the warpgroup waits
// until the TMA store that last read the buffer has finished reading (at most one other store
// in flight), the warpgroup writes the subtile into it in TMA's 128-byte swizzle with stmatrix
// (Note [Staging with stmatrix]), fences its writes for the async proxy, syncs, and thread 0
// issues the store. The store clips rows and columns outside C. The kernel waits for all
// stores before it exits
// (epilogue_drain). The warpgroup does not wait for the global writes, so its next tile's
// MMAs start at once.
// The rotation StoreCTma<T, true> applies: columns [0, cols) of C are heads of 64 whose
// row r is at sequence position r % t; table is rope_table(dev, t, 64, base) ([t, 32]).
// cols = 0: none.
struct RopeEpi {
  const float2* table = nullptr;
  int t = 0;
  int cols = 0;
};

template <class T, bool ROW_OPS = false>
struct StoreCTma {
  const T* bias;  // optional [n]
  int n;
  RopeEpi rope{};                    // ROW_OPS only
  const float* row_scale = nullptr;  // ROW_OPS only, optional [m]
  int m = 0;                         // ROW_OPS only: C's rows

  template <int BN, int ROWS>
  static constexpr int kScratchBytes = 2 * 64 * 64 * 2;

  template <int R>
  __device__ __forceinline__ void tile(const float (&acc)[R], const TileCtx& t) const {
    const int lane = t.wg_thread % 32, r = 16 * (t.wg_thread / 32) + lane / 4;
    float s0 = 1.0f, s1 = 1.0f;  // the row scales of rows r and r + 8
    if constexpr (ROW_OPS)
      if (row_scale) {
        s0 = t.rows + r < m ? __ldg(row_scale + t.rows + r) : 0.0f;
        s1 = t.rows + r + 8 < m ? __ldg(row_scale + t.rows + r + 8) : 0.0f;
      }
#pragma unroll
    for (int q = 0; q < R / 32; ++q) {  // 64-column subtiles: R / 32 = BN / 64
      uint8_t* buf = t.scratch + ((t.sub + q) & 1) * (64 * 64 * 2);
      if (t.wg_thread == 0) tma_store_wait_read<1>();
      named_barrier_sync(t.barrier, 128);
      float v[32];  // the subtile's values: v[4j + e] row r, v[4j + 2 + e] row r + 8
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int i = 4 * (8 * q + j);
        v[4 * j] = acc[i], v[4 * j + 1] = acc[i + 1], v[4 * j + 2] = acc[i + 2];
        v[4 * j + 3] = acc[i + 3];
        if constexpr (ROW_OPS)
          v[4 * j] *= s0, v[4 * j + 1] *= s0, v[4 * j + 2] *= s1, v[4 * j + 3] *= s1;
        if (bias) {
          const int col = t.col0 + 64 * q + 8 * j;
          const float b0 = col < n ? to_acc(__ldg(bias + col)) : 0.0f;
          const float b1 = col + 1 < n ? to_acc(__ldg(bias + col + 1)) : 0.0f;
          v[4 * j] += b0, v[4 * j + 1] += b1, v[4 * j + 2] += b0, v[4 * j + 3] += b1;
        }
      }
      if constexpr (ROW_OPS)
        if (t.cols + 64 * q < rope.cols) rotate(v, t.rows + r, lane);
      stage_box<T>(v, 0, buf, t.wg_thread);  // Note [Staging with stmatrix]
      fence_proxy_async_smem();
      named_barrier_sync(t.barrier, 128);
      if (t.wg_thread == 0) {
        tma_store_2d(t.c_map, buf, t.cols + 64 * q, t.rows);
        tma_store_commit();
      }
    }
  }

  // One head's 64 columns of rows `row` and row + 8: the lane's column 8j + 2(lane % 4) + e
  // (j < 4) pairs with the same one 32 columns on, which is j + 4 in the same lane.
  __device__ __forceinline__ void rotate(float (&v)[32], int row, int lane) const {
    const float2* cs0 = rope.table + static_cast<int64_t>(row % rope.t) * 32 + 2 * (lane % 4);
    const float2* cs1 = rope.table + static_cast<int64_t>((row + 8) % rope.t) * 32 + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(cs0 + 8 * j));
      const float4 b = __ldg(reinterpret_cast<const float4*>(cs1 + 8 * j));
      rope_rotate(v[4 * j], v[4 * j + 16], a.x, a.y, 1.0f);
      rope_rotate(v[4 * j + 1], v[4 * j + 17], a.z, a.w, 1.0f);
      rope_rotate(v[4 * j + 2], v[4 * j + 18], b.x, b.y, 1.0f);
      rope_rotate(v[4 * j + 3], v[4 * j + 19], b.z, b.w, 1.0f);
    }
  }
};

// A 128-row tile held as two 64-row blocks (ping-pong): the epilogue's own tile2 where it has
// one (BiasActDropout stages both blocks before its walk), else tile() on each block.
template <class Epi, int R>
__device__ __forceinline__ void epilogue_tile2(const Epi& epi, const float (&acc0)[R],
                                               const float (&acc1)[R], TileCtx t) {
  if constexpr (requires { epi.tile2(acc0, acc1, t); }) {
    epi.tile2(acc0, acc1, t);
  } else {
    epi.tile(acc0, t);
    t.rows += 64, t.row0 += 64;
    epi.tile(acc1, t);
  }
}

// Before the kernel exits: the TMA stores a warpgroup's thread 0 issued have completed
// (shared memory must outlive their reads). A no-op for epilogues that issue none.
__device__ __forceinline__ void epilogue_drain(const TileCtx& t) {
  if (t.wg_thread == 0) tma_store_wait_all();
}

template <class T>
struct BiasActDropout {
  T* hd;
  T* z;           // optional: fc1's output without bias, saved for the backward
  const T* bias;  // optional [n]
  int m, n;
  Activation act;
  DeviceMask mask;

  // Room for ROWS rows of the tile rounded to T (z as stored), row pitch BN + 8 elements
  // against bank conflicts.
  template <int BN, int ROWS>
  static constexpr int kScratchBytes = ROWS * (BN + 8) * 2;

  // Note [Fused FFN epilogue]: the accumulators are rounded to T (z, exactly as the unfused
  // path stores it) and staged in shared memory; the warpgroup then walks its block in
  // runs of 8 columns: one 16-byte load of z, one Philox block for the 8 masks (element
  // i = row·N + col is drawn from block i / 8, Note [Dropout RNG]), and 16-byte stores of z
  // and hd. A thread keeps one 8-column run of every 128 / (BN / 8)-th row, so it loads
  // its bias once per tile. The walk is a loop unrolled 4 times with the activation fixed
  // at compile time: only one warpgroup runs it while the other's MMAs go on, so its
  // latency (Philox's dependent rounds, exp) is hidden by independent runs, not by other
  // warps; the fully unrolled per-register version ran out of instruction cache (ncu: over
  // half the stalls were instruction fetch). Staging every block before the walk also
  // frees the accumulator registers first.
  template <int R>
  __device__ __forceinline__ void tile(const float (&acc)[R], const TileCtx& t) const {
    stage(acc, t, 0);
    walk<2 * R, 64>(t);
  }
  template <int R>
  __device__ __forceinline__ void tile2(const float (&acc0)[R], const float (&acc1)[R],
                                        const TileCtx& t) const {
    stage(acc0, t, 0);
    stage(acc1, t, 64);
    walk<2 * R, 128>(t);
  }

  template <int R>
  __device__ __forceinline__ void stage(const float (&acc)[R], const TileCtx& t, int r0) const {
    constexpr int P = 2 * R + 8;
    T* st = reinterpret_cast<T*>(t.scratch);
    const int lr = r0 + t.row0 - t.rows, lc = t.col0 - t.cols;  // this lane's place
#pragma unroll
    for (int i = 0; i < R; i += 4) {
      const int c = lc + 2 * i;
      store_pair(st + lr * P + c, true, true, acc[i], acc[i + 1]);
      store_pair(st + (lr + 8) * P + c, true, true, acc[i + 2], acc[i + 3]);
    }
  }

  template <int BN, int ROWS>
  __device__ __forceinline__ void walk(const TileCtx& t) const {
    named_barrier_sync(t.barrier, 128);
    switch (act) {
      case Activation::gelu_erf: walk_as<BN, ROWS, Activation::gelu_erf>(t); break;
      case Activation::gelu_tanh: walk_as<BN, ROWS, Activation::gelu_tanh>(t); break;
      case Activation::silu: walk_as<BN, ROWS, Activation::silu>(t); break;
      case Activation::identity: walk_as<BN, ROWS, Activation::identity>(t); break;
    }
    named_barrier_sync(t.barrier, 128);
  }

  template <int BN, int ROWS, Activation A>
  __device__ __forceinline__ void walk_as(const TileCtx& t) const {
    constexpr int P = BN + 8, kRuns = BN / 8, kRowStep = 128 / kRuns;
    static_assert(128 % kRuns == 0, "a thread keeps one run of columns");
    const T* st = reinterpret_cast<const T*>(t.scratch);
    const int c = 8 * (t.wg_thread % kRuns), r0 = t.wg_thread / kRuns;
    const int col = t.cols + c;
    if (col >= n) return;
    const DeviceMask mk = mask.resolved();  // the shift read once a tile, not once a run
    if (col + 8 <= n && n % 8 == 0) {  // aligned 16-byte runs, one Philox block each
      float bv[8];
      if (bias) {
        const uint4 braw = __ldg(reinterpret_cast<const uint4*>(bias + col));
        const T* bt = reinterpret_cast<const T*>(&braw);
#pragma unroll
        for (int j = 0; j < 8; ++j) bv[j] = to_acc(bt[j]);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) bv[j] = 0.0f;
      }
#pragma unroll 4
      for (int i = 0; i < ROWS / kRowStep; ++i) {
        const int r = r0 + i * kRowStep;
        if (t.rows + r < m)
          run8<A>(st + r * P + c, static_cast<int64_t>(t.rows + r) * n + col, bv, mk);
      }
      return;
    }
#pragma unroll 1
    for (int r = r0; r < ROWS && t.rows + r < m; r += kRowStep)
      ragged(st + r * P + c, t.rows + r, col, mk);
  }

  // Eight consecutive outputs of one row starting at element i0, z8 their rounded GEMM
  // values in shared memory, bv their biases, mk the mask resolved (walk_as).
  template <Activation A>
  __device__ __forceinline__ void run8(const T* z8, int64_t i0, const float (&bv)[8],
                                       const DeviceMask& mk) const {
    const uint4 zraw = *reinterpret_cast<const uint4*>(z8);
    const T* zt = reinterpret_cast<const T*>(&zraw);
    if (z) *reinterpret_cast<uint4*>(z + i0) = zraw;
    float f[8];
    mk.factors<8>(i0, f);
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      o[j] = from_acc<T>(act_math::value<T>(to_acc(zt[j]) + bv[j], A) * f[j]);
    *reinterpret_cast<uint4*>(hd + i0) = out;
  }

  // A run at the ragged right edge (or of a row length that is not a multiple of 8):
  // element by element.
  __device__ __forceinline__ void ragged(const T* z8, int row, int col,
                                         const DeviceMask& mk) const {
    const int64_t i0 = static_cast<int64_t>(row) * n + col;
    for (int j = 0; j < 8 && col + j < n; ++j) {
      const uint64_t u = static_cast<uint64_t>(i0 + j);
      if (z) z[i0 + j] = z8[j];
      const float b = bias ? to_acc(bias[col + j]) : 0.0f;
      float g = 1.0f;
      if (mk.active)
        g = draw_of(philox_block(mk.keys, mk.offset, u >> 3), u) >= mk.thr ? mk.scale : 0.0f;
      hd[i0 + j] = from_acc<T>(act_math::value<T>(to_acc(z8[j]) + b, act) * g);
    }
  }
};

// Note [Activation epilogues]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The plain FFN's activation, folded into the GEMM whose output it consumes, when there is no
// hidden dropout (GPT's MLP; any FFN with dropout = 0):
//   forward  (fc1, z = x·W1ᵀ):        stores z = round(acc) and hd = act(z + b1);
//   backward (dhd = dz2·W2, reads z):  stores dz = round(round(acc) · act'(z + b1)) and the
//                                      recomputed hd = act(z + b1) that dW2 = dz2ᵀ·hd needs.
// The arithmetic is bias_act_dropout's and bias_act_dropout_backward's with the mask at 1
// (the GEMM result rounded to T first, exactly as the unfused path stores it), so given the
// same GEMM the outputs are bit-identical to the unfused pair; db1 is not summed here
// (linear_act_backward adds a column-sum pass). Each lane computes on its own accumulator fragment
// (no staging walk): per 64×64 subtile it loads the z pairs it needs straight from global memory
// (4-byte loads, issued before the wait for the output buffers; prefetching the next subtile's as
// well spilled registers under the 168-register cap of a 384-thread block), writes both outputs
// into a pair of swizzled 8 KiB buffers and one thread stores them with TMA as in Note [TMA store
// epilogue]. The ping-pong schedule runs this while the other warpgroup's MMAs go on, which hides
// it only behind a long mainloop; the layers run the same arithmetic on warpgroups of its
// own (Note [Activation warpgroup], act_warpgroup.cuh), measured faster at K = 768 to 4096.
template <class T, Activation A, bool kBackward>
struct ActTma {
  const T* z;     // backward: fc1's saved output without bias, [m, n]
  const T* bias;  // optional [n]
  int m, n;

  template <int BN, int ROWS>
  static constexpr int kScratchBytes = 2 * 2 * 64 * 64 * 2;  // two (out1, out2) buffer pairs

  // The z pairs (bf16x2/half2 as 4 bytes) of one 64-column subtile: rows row, row + 8,
  // columns col + 8j (+1).
  __device__ __forceinline__ void load_z(int row, int col, uint32_t (&zr)[16]) const {
    if constexpr (kBackward) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int c = col + 8 * j;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = row + 8 * h;
          zr[2 * j + h] = r < m && c < n ? __ldg(reinterpret_cast<const unsigned int*>(
                                               z + static_cast<int64_t>(r) * n + c))
                                         : 0u;
        }
      }
    }
  }

  template <int R>
  __device__ __forceinline__ void tile(const float (&acc)[R], const TileCtx& t) const {
    constexpr int kSub = R / 32;  // 64-column subtiles: R / 32 = BN / 64
    static_assert(kSub % 2 == 0, "buffer pairs alternate within a block");
    const int lane = t.wg_thread % 32, r = 16 * (t.wg_thread / 32) + lane / 4;
#pragma unroll
    for (int q = 0; q < kSub; ++q) {
      uint8_t* buf1 = t.scratch + (q & 1) * (2 * 64 * 64 * 2);
      uint8_t* buf2 = buf1 + 64 * 64 * 2;
      uint32_t zr[16];
      load_z(t.row0, t.col0 + 64 * q, zr);  // in flight while the buffers are awaited
      if (t.wg_thread == 0) tma_store_wait_read<1>();
      named_barrier_sync(t.barrier, 128);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int i = 4 * (8 * q + j);
        const int col = t.col0 + 64 * q + 8 * j;
        float b0 = 0.0f, b1 = 0.0f;
        if (bias && col < n) {
          b0 = to_acc(__ldg(bias + col));
          b1 = to_acc(__ldg(bias + col + 1));
        }
        float o1[4], o2[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float g = to_acc(from_acc<T>(acc[i + e]));  // the GEMM output as stored
          const float b = (e & 1) ? b1 : b0;
          if constexpr (kBackward) {
            const uint32_t pair = zr[2 * j + e / 2];
            float val, d;
            act_math::value_grad<T>(unpack<T>(pair, e & 1) + b, A, val, d);
            o1[e] = g * d;
            o2[e] = val;
          } else {
            o1[e] = g;
            o2[e] = act_math::value<T>(g + b, A);
          }
        }
        const int off = ((j ^ (r & 7)) << 4) + 4 * (lane % 4);
        store_pair(reinterpret_cast<T*>(buf1 + r * 128 + off), true, true, o1[0], o1[1]);
        store_pair(reinterpret_cast<T*>(buf1 + (r + 8) * 128 + off), true, true, o1[2], o1[3]);
        store_pair(reinterpret_cast<T*>(buf2 + r * 128 + off), true, true, o2[0], o2[1]);
        store_pair(reinterpret_cast<T*>(buf2 + (r + 8) * 128 + off), true, true, o2[2], o2[3]);
      }
      fence_proxy_async_smem();
      named_barrier_sync(t.barrier, 128);
      if (t.wg_thread == 0) {
        tma_store_2d(t.c_map, buf1, t.cols + 64 * q, t.rows);
        tma_store_2d(t.c2_map, buf2, t.cols + 64 * q, t.rows);
        tma_store_commit();
      }
    }
  }
};

}  // namespace ffn::cuda::gemm
