// kernels/cuda/gemm/sm90.cuh — the Hopper (sm_90a) primitives the GEMM pieces are built from:
// mbarriers, TMA tile loads and stores (cp.async.bulk.tensor), stmatrix, wgmma shared-memory
// descriptors and fences, setmaxnreg and griddepcontrol. Thin wrappers over PTX, each named after
// what it does.
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

namespace ffn::cuda::gemm {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// --- mbarrier -------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
// Makes barrier initialisation visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Waits until the barrier's phase with parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// Whether the phase with parity `parity` has completed, without waiting.
__device__ __forceinline__ bool mbar_test(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
// Note [Idle waits]
// ~~~~~~~~~~~~~~~~~
// A try_wait that finds the phase incomplete returns after a few cycles, so a thread waiting
// in mbar_wait issues a try_wait and a branch every ~16 cycles for as long as it waits. In the
// Hopper attention's dk/dv kernel the producer thread (stages ahead) and the dQ writer (a
// tile behind the consumers) wait most of the time, and ncu (session 24, H200, gpt2_small's
// step) counted 19M of the kernel's 96M warp instructions in their wait loops, issue slots
// taken from the consumer warps of their SM sub-partitions. Those waiters use mbar_wait_idle:
// after each failed try they sleep ~kIdleSleepNs, which work queued a stage or a tile ahead
// absorbs. With the row statistics loaded a tile ahead (attention_sm90_bwd.cu), the backward
// went 0.315 → 0.292 ms at gpt2_small's shape (ffn-bench --attention, same call, H200).
// The GEMM's producer spins too (7M of 99M warp instructions in fc1's backward activation
// GEMM), but there the idle wait measured no faster (0.212 → 0.214 ms) and the bare
// weight-gradient GEMMs 1-5% slower in one A/B, so the GEMM keeps mbar_wait. try_wait's
// suspend-time hint in the GEMM producer's wait (suspended until the phase completes) measured
// no better either (session 25, H100, alternated twice: fc1's backward activation GEMM
// 0.2069/0.2075 -> 0.2086/0.2108 ms, gpt2_small 32.0/31.9 -> 32.0/31.8 ms/iter).
constexpr unsigned kIdleSleepNs = 128;
__device__ __forceinline__ void mbar_wait_idle(uint64_t* bar, uint32_t parity) {
  for (;;) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
    if (done) return;
    __nanosleep(kIdleSleepNs);
  }
}

// --- clusters (Note [Operand multicast]) --------------------------------------------------
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of the cluster's CTAs that has not exited arrives (release) and waits for the
// others (acquire); also a barrier over the CTA's own threads.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// Arrives on the barrier at bar's offset in CTA `rank` of the cluster (the default .release
// at CTA scope, as mbar_arrive: a .cluster-scope release stalled the arriving thread ~1000
// cycles each time, session 31).
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_addr(bar)),
      "r"(rank)
      : "memory");
}

// --- programmatic dependent launch (Note [Dependent launch] in kernel.cuh) ----------------
// Waits until the grids this one depends on have completed and their memory is visible; at
// once where the launch had no programmatic dependency.
__device__ __forceinline__ void grid_dependency_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
// Lets the next grid in the stream, if launched as dependent, be scheduled once every CTA of
// this grid has done this or exited.
__device__ __forceinline__ void launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// --- TMA ----------------------------------------------------------------------------------
// Loads the box at (c0 = innermost coordinate, c1) of `map` into shared memory at `dst`;
// completion (the bytes) is counted on `bar`. Out-of-bounds elements are filled with zeros.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
      : "memory");
}
// tma_load_2d into the same shared-memory offset of every CTA of the cluster in `ctas` (a bit
// per rank), each of whose barriers at bar's offset counts the bytes.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map,
                                                      uint64_t* bar, int c0, int c1,
                                                      uint16_t ctas) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "h"(ctas)
      : "memory");
}
// The same for a 3-D map (c0 innermost): out-of-bounds elements along any dimension are zeros.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// Stores the box at (c0, c1) of `map` from shared memory at `src` (laid out as the map's
// swizzle says); elements outside the tensor are not written. Joins the thread's current
// bulk group: commit it with tma_store_commit, and wait before reusing `src`.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int c0,
                                             int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_addr(src)), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed store groups still read shared memory.
template <int N>
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Waits until every committed store group is complete (its writes done).
__device__ __forceinline__ void tma_store_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Orders this thread's ordinary shared-memory writes before later async-proxy (TMA) reads.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// stmatrix .x4: four 8×8 matrices of 16-bit elements from the warp's registers into shared
// memory in one instruction. Register k of every lane holds its pair of matrix k (row
// lane / 4, columns 2(lane % 4) and + 1: the mma/wgmma accumulator fragment's layout);
// lanes 8k .. 8k + 7 give the shared addresses of matrix k's rows 0-7 (16 bytes each).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// --- wgmma --------------------------------------------------------------------------------
// Descriptor of a K-major tile whose rows are 128 bytes (64 bf16/f16) written by TMA with
// 128-byte swizzling: 8-row groups 1024 bytes apart (stride byte offset), the leading byte
// offset unused for this layout, swizzle mode 1 (128B). Advancing along K by 16 elements
// inside the row adds 32 bytes to the start address.
__device__ __forceinline__ uint64_t smem_desc_k128(const void* tile) {
  const uint64_t addr = smem_addr(tile);
  return ((addr & 0x3ffff) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}
// Descriptor of an MN-major tile: k rows of 64 M- (or N-) elements, 128 bytes each, written by
// TMA with 128-byte swizzling as boxes of 64 rows. 8-row groups along K are 1024 bytes apart
// (stride byte offset); consecutive 64-element groups along M/N are `box_bytes` apart (the
// next box; leading byte offset). Advancing along K by 16 rows adds 2048 bytes.
__device__ __forceinline__ uint64_t smem_desc_mn128(const void* tile, uint32_t box_bytes) {
  const uint64_t addr = smem_addr(tile);
  return ((addr & 0x3ffff) >> 4) | (uint64_t{(box_bytes >> 4) & 0x3fff} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across the async MMAs.
template <int R>
__device__ __forceinline__ void fence_accumulators(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Named barrier `id` over `threads` threads (a warpgroup's 128, leaving id 0 to
// __syncthreads).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrives at named barrier `id` without waiting (release): the producer side of a handoff
// whose consumer side calls named_barrier_sync with the same thread count.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// --- registers ----------------------------------------------------------------------------
template <int R>
__device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}

}  // namespace ffn::cuda::gemm
