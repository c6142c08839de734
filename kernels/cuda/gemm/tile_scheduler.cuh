// kernels/cuda/gemm/tile_scheduler.cuh — which work units a persistent CTA computes, in which
// order. A unit is an output tile, or with split-K (Note [Split-K]) one of `splits` parts of
// a tile's K range. Tiles are numbered in groups of group_m tile-rows, column by column
// inside a group, so the CTAs running at one time share A rows and B columns in L2 (Note
// [Tile groups]); units
// run split by split (all tiles' split 0 first). CTA b takes units b, b + gridDim.x, ...
// Producer and consumers of a CTA walk the same sequence. UnitRing is the dynamic order
// instead (Note [Dynamic unit order]): CTAs take the next unit from a counter in global
// memory and hand it to their warps through shared memory.
#pragma once

#include <cstdint>

#include "kernels/cuda/gemm/sm90.cuh"

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

// Note [Tile groups]
// ~~~~~~~~~~~~~~~~~~
// The CTAs running at one time take consecutive tiles: a group of group rows (a power of two,
// 1 << group_shift) walked column by column. Each group reads all of B once while its row
// blocks of A stay in L2, so B is read from DRAM ceil(tiles_m / group) times; a wave of 132
// CTAs reads `group` row blocks of A and 132 / group column blocks of B. Eight rows suit the
// shapes whose B fits in L2. Where B is larger (the FFN workloads at d = 4096, welder_fc2,
// GEGLU at d = 2048, the LM head), 16 rows measured up to 14% faster and nowhere slower beyond
// the timing noise (H100, session 37, ffn-bench --gemm: ffn_d4096's fc2 weight gradient 1.92
// -> 1.66 ms; the activation kernels at ffn_d4096 3-5% faster, ffn-bench --act-epilogues).
// Where A's row blocks are short as well (the LM head's forward: B is the 77 MB embedding
// table, a row block of x 196 KB) eight rows re-read B sixteen times: 32 rows took the L2 hit
// rate from 85% to 95% and the kernel from 2.20 to 2.09 ms. group_rows below picks the length
// for the plain kernels (sm90_gemm.cu's choose_tiling) and the activation kernels
// (kernel.cuh's launch_act_in); Sm90GemmArgs::group_m or gemm_group_rows()
// (FFN_GEMM_GROUP_ROWS) force it. The order changes which CTA computes a tile, never how: no
// bits change.
struct TileScheduler {
  int tiles_m, tiles_n;
  int k_blocks;    // K blocks of the whole product
  int splits = 1;  // 1 <= splits <= k_blocks
  // Note [Operand multicast]: with cluster = 2 a unit is a pair of tiles (tm, 2q) and
  // (tm, 2q + 1), tiles_n counts the pairs, and the CTA of cluster rank `rank` (set in the
  // kernel) computes the pair's tile 2q + rank. The cluster's CTAs take the same units. The
  // norm epilogue's clusters (Note [Residual add and norm in the epilogue]) take a whole row
  // of `cluster` tiles a unit the same way.
  // share_b: the pair is (2p, tn) and (2p + 1, tn) instead, tiles_m counts the pairs, and the
  // CTAs share B's tile.
  int cluster = 1;
  int rank = 0;
  bool share_b = false;
  int group_shift = 3;  // Note [Tile groups]: groups of 1 << group_shift tile rows

  __host__ __device__ int num_tiles() const { return tiles_m * tiles_n; }
  // The persistent stride: CTA b takes units b, b + gridDim.x, ...; in clusters the cluster's
  // CTAs take the same units, b / cluster + k·gridDim.x / cluster.
  __device__ int first_unit() const { return static_cast<int>(blockIdx.x) / cluster; }
  __device__ int unit_stride() const { return static_cast<int>(gridDim.x) / cluster; }
  __host__ __device__ int num_units() const { return num_tiles() * splits; }
  // Tile t → (tile row, tile column). The activation kernels' warps decode one to three units
  // a tile (Note [Activation warpgroup]), so the common cases skip the divisions they do not
  // need: a whole group of tile rows (a mask and a shift) and no split.
  __device__ __forceinline__ void coords(int t, int& tm, int& tn) const {
    const int group_m = 1 << group_shift;
    const int per_group = tiles_n << group_shift;
    const int group = t / per_group;
    const int first_m = group << group_shift;
    const int in_group = t - group * per_group;
    if (tiles_m - first_m >= group_m) {
      tm = first_m + (in_group & (group_m - 1));
      tn = in_group >> group_shift;
    } else {
      const int size_m = tiles_m - first_m;
      tm = first_m + in_group % size_m;
      tn = in_group / size_m;
    }
  }
  __device__ __forceinline__ Unit unit(int u) const {
    Unit w;
    if (splits == 1) {
      w.split = 0;
      coords(u, w.tm, w.tn);
      w.kb0 = 0;
      w.kbs = k_blocks;
    } else {
      const int tiles = num_tiles();
      w.split = u / tiles;
      coords(u - w.split * tiles, w.tm, w.tn);
      w.kb0 = static_cast<int>(static_cast<int64_t>(w.split) * k_blocks / splits);
      w.kbs = static_cast<int>(static_cast<int64_t>(w.split + 1) * k_blocks / splits) - w.kb0;
    }
    if (cluster > 1) {
      if (share_b)
        w.tm = cluster * w.tm + rank;
      else
        w.tn = cluster * w.tn + rank;
    }
    return w;
  }
};

// Note [Tile groups]' length for a product of tiles_m tile rows whose B takes b_bytes and
// whose A takes row_bytes a tile row, on a GPU with l2_bytes of L2: 8 rows; where B is larger
// than 80% of L2 and there are 16 tile rows or more, 16, doubled up to 64 while a group's rows
// of A take at most a sixth of L2.
inline int group_rows(int64_t tiles_m, double b_bytes, double row_bytes, double l2_bytes) {
  if (b_bytes <= 0.8 * l2_bytes || tiles_m < 16) return 8;
  int g = 16;
  while (g < 64 && 2 * g <= tiles_m && 2 * g * row_bytes <= l2_bytes / 6) g *= 2;
  return g;
}

// Note [Dynamic unit order]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A persistent kernel whose CTAs stride statically (b, b + gridDim.x, ...) ends with its
// slowest CTA, and a CTA that starts late does its whole share late. That happens under data
// parallelism: NCCL's all-reduce kernels run beside backward, and an SM that holds one of
// their CTAs cannot also hold one of ours (a CTA here takes the SM's whole register file),
// so some of our CTAs wait for the collective to end, about 0.25 ms, and then start their
// full share while the other SMs idle (gpt2_small on 2 H100s, session 26: forward+backward
// 1.0 ms longer than on one GPU, 0.5 ms with fc1's activation off the persistent GEMM, and
// as long as one GPU's with the all-reduce moved after backward). Here the producer thread
// of each CTA takes its next unit from a counter in global memory (atomicAdd), one unit ahead
// of the one it loads, and passes it to the CTA's other warps through a ring of kSlots
// entries in shared memory; a CTA that starts late takes fewer units. The units are still
// TileScheduler's, taken in increasing order by the CTAs together, so neighbours in L2 run
// together as before, and every output tile and db partial is computed by one CTA from the
// same inputs in the same order whichever CTA it is: the results are bit-identical to the
// static order's. Measured (2 H100s, gpt2_small, session 26, separate calls on fresh
// machines): forward+backward on 2 GPUs 1.0 ms over one GPU's with the static order
// (32.08 ms), 0.42 ms over with this one in fc1's activation GEMMs (31.37), 2 GPUs ×1.871 ->
// ×1.905 one GPU's tokens/s; the single-GPU kernel times stayed within run-to-run noise.
// The Hopper attention kernels stride statically: this ring there (session 27) left the 2-GPU
// step as it was (forward+backward 31.93 and 31.99 ms against 31.99 and 31.97 with the static
// order fed through the same ring, alternated in one call) and made the forward ~7% slower at
// gpt2_small's shape on one GPU, so it was not kept.
// On one GPU the ring costs the activation kernels themselves 2-10% (ncu, H100, session 30,
// bisected: ffn_d1024's fc1 forward 254-258 -> 270-272 us and backward 348-352 -> 362-364,
// welder_fc2's f16 gelu_erf backward 442-448 -> 474-502; session 26's "unchanged" came from
// wall-clock timings that the power cap's clock swing hides, Note [Timing window] in
// bench/timing.h). So the kernels take the order as a template parameter: StaticUnits
// (the persistent stride behind the same interface) unless gemm_dynamic_order()
// (kernels/gemm.h), which the trainer turns on for more than one rank. Static, they measured
// 264/341, 440-446 us (ffn-bench, 1 s windows: welder_fc2 and ffn_d1024 2.5-4% faster).
// The readers are threads: each reads the entry into a register and arrives on the slot's
// empty barrier itself, so the thread that read the slot is the one that releases it.
// (Session 26 had every lane read and lane 0 arrive for its warp after __syncwarp, which the
// PTX memory model orders but compute-sanitizer's racecheck does not follow: it reported the
// lanes' loads against the producer's next store into the slot. Lane 0 reading and passing
// the entry on by shuffle, also clean, changed the backward kernels' register allocation and
// measured slower on the bf16 gelu_erf backward: bench/RESULTS-2026-11-27-s26-29.md session 27.)
//   full[s]   count 1: the producer's arrive after writing entry k into slot k % kSlots;
//   empty[s]  count kReaders threads: each reader's arrive once it has read the entry (the
//             producer reuses the slot for entry k + kSlots).
// After the last unit the producer writes -1 (no more) and stops; readers stop at it, so they
// may read entry k + 1 only after entry k was a unit. The counter pair (UnitCounter: the next
// ticket, the CTAs done) is reset by the last CTA to finish, so every launch starts from zero
// without a memset; launches sharing a pair must run one at a time, which they do on the one
// compute stream (Note [One compute stream]).
struct UnitCounter {
  int* next;  // the next unit to hand out
  int* done;  // CTAs whose producer has taken its last ticket
};

template <int kReaders>  // reader threads
struct UnitRing {
  static constexpr int kSlots = 8;
  static constexpr int kBytes = kSlots * (4 + 2 * 8);
  int* units;
  uint64_t* full;
  uint64_t* empty;

  // p: kBytes of shared memory, 8-byte aligned.
  __device__ static UnitRing carve(uint8_t* p) {
    UnitRing r;
    r.full = reinterpret_cast<uint64_t*>(p);
    r.empty = r.full + kSlots;
    r.units = reinterpret_cast<int*>(r.empty + kSlots);
    return r;
  }
  // One thread, before the kernel's fence_barrier_init and __syncthreads.
  __device__ void init() const {
    for (int s = 0; s < kSlots; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kReaders);
    }
  }
  // The producer thread: entry k (the k-th unit of this CTA, or -1 once there is none).
  __device__ int take(const UnitCounter& c, int k, int num_units) const {
    const int s = k % kSlots;
    if (k >= kSlots) mbar_wait(&empty[s], ((k / kSlots) & 1) ^ 1);
    const int t = atomicAdd(c.next, 1);
    const int u = t < num_units ? t : -1;
    units[s] = u;
    mbar_arrive(&full[s]);  // release: the entry is visible to whoever waits on it
    if (u < 0) {
      __threadfence();
      if (atomicAdd(c.done, 1) == static_cast<int>(gridDim.x) - 1) {  // every ticket is taken
        atomicExch(c.next, 0);
        atomicExch(c.done, 0);
      }
    }
    return u;
  }
  // A reader thread: entry k, waiting for it; the thread is then done with the slot. Every
  // reader takes every entry once, in order, up to the first -1 (k - 1 must have been a
  // unit).
  __device__ int at(int k) const {
    mbar_wait(&full[k % kSlots], (k / kSlots) & 1);
    const int u = units[k % kSlots];
    mbar_arrive(&empty[k % kSlots]);
    return u;
  }
  // Entry k if the producer has written it already, else -2 (not known yet), without
  // waiting; at(k) still takes it later. k - 1 must have been a unit.
  __device__ int peek(int k) const {
    return mbar_test(&full[k % kSlots], (k / kSlots) & 1) ? units[k % kSlots] : -2;
  }
};

// The static order behind UnitRing's interface (Note [Dynamic unit order]): the k-th unit is
// TileScheduler's first_unit() + k·unit_stride(), known without waiting or shared memory. On a
// GPU of its own the activation kernels run this way: the ring's handoffs cost them 2-10%
// there (ncu, session 30).
struct StaticUnits {
  static constexpr int kBytes = 0;
  int num_units, first, stride;
  __device__ explicit StaticUnits(const TileScheduler& s)
      : num_units(s.num_units()), first(s.first_unit()), stride(s.unit_stride()) {}
  __device__ void init() const {}
  __device__ int at(int k) const {
    const int u = first + k * stride;
    return u < num_units ? u : -1;
  }
  __device__ int take(const UnitCounter&, int k, int) const { return at(k); }
  __device__ int peek(int k) const { return at(k); }
};

}  // namespace ffn::cuda::gemm
