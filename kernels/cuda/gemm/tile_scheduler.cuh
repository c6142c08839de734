// kernels/cuda/gemm/tile_scheduler.cuh — which work units a persistent CTA computes, in which
// order. A unit is an output tile, or with split-K (Note [Split-K]) one of `splits` parts of
// a tile's K range. Tiles are numbered in groups of kGroupM tile-rows, column by column
// inside a group, so the CTAs running at one time share A rows and B columns in L2; units
// run split by split (all tiles' split 0 first). CTA b takes units b, b + gridDim.x, ...
// Producer and consumers of a CTA walk the same sequence.
#pragma once

#include <cstdint>

namespace ffn::cuda::gemm {

// Note [Split-K]
// ~~~~~~~~~~~~~~
// A product with few output tiles and a long K (the weight gradients dyᵀ·x of a narrow layer:
// 768×768 outputs over 16384 tokens is 18 tiles for 132 SMs) leaves most SMs idle. Split-K
// cuts each tile's K blocks into `splits` contiguous ranges, balanced to within one block;
// each unit writes its fp32 partial tile to a workspace [splits, M, N] (StorePartial), and
// a second kernel (splitk_reduce) sums the partials in split order, adds the bias and rounds
// to C's type. The order of every sum is fixed by the shape alone, so results are bitwise
// reproducible (no atomics). sm90_gemm.cu picks the split count from a cost model of the
// shape (choose_tiling).
struct Unit {
  int tm, tn;    // the output tile
  int split;     // which part of its K range
  int kb0, kbs;  // first K block and number of K blocks
};

struct TileScheduler {
  static constexpr int kGroupM = 8;
  int tiles_m, tiles_n;
  int k_blocks;    // K blocks of the whole product
  int splits = 1;  // 1 <= splits <= k_blocks

  __host__ __device__ int num_tiles() const { return tiles_m * tiles_n; }
  __host__ __device__ int num_units() const { return num_tiles() * splits; }
  // Tile t → (tile row, tile column).
  __device__ __forceinline__ void coords(int t, int& tm, int& tn) const {
    const int per_group = kGroupM * tiles_n;
    const int group = t / per_group;
    const int first_m = group * kGroupM;
    const int size_m = min(tiles_m - first_m, kGroupM);
    const int in_group = t % per_group;
    tm = first_m + in_group % size_m;
    tn = in_group / size_m;
  }
  __device__ __forceinline__ Unit unit(int u) const {
    Unit w;
    const int tiles = num_tiles();
    w.split = u / tiles;
    coords(u - w.split * tiles, w.tm, w.tn);
    w.kb0 = static_cast<int>(static_cast<int64_t>(w.split) * k_blocks / splits);
    w.kbs = static_cast<int>(static_cast<int64_t>(w.split + 1) * k_blocks / splits) - w.kb0;
    return w;
  }
};

}  // namespace ffn::cuda::gemm
