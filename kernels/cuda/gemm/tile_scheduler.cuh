// kernels/cuda/gemm/tile_scheduler.cuh — which output tiles a persistent CTA computes, in
// which order. Tiles are numbered in groups of kGroupM tile-rows, column by column inside a
// group, so the CTAs running at one time share A rows and B columns in L2; CTA b takes tiles
// b, b + gridDim.x, ... Producer and consumers of a CTA walk the same sequence.
#pragma once

#include <cstdint>

namespace ffn::cuda::gemm {

struct TileScheduler {
  static constexpr int kGroupM = 8;
  int tiles_m, tiles_n;

  __host__ __device__ int num_tiles() const { return tiles_m * tiles_n; }
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
};

}  // namespace ffn::cuda::gemm
