// core/cuda/allocator.cpp — the CUDA caching allocator behind Storage.
//
// Sizes are rounded up to a size class (512 B granules below 1 MiB; above, four
// classes per power of two, so at most 25% slack). Freed blocks go to a per-device,
// per-class free list and are handed out again without cudaMalloc; this is safe
// because of Note [One compute stream] (core/cuda/context.h). When cudaMalloc
// fails, the cache is returned to the driver and the call retried once; if it
// still fails, the error says how much was asked, in use, cached and free.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/storage.h"

namespace ffn::cuda_alloc {

namespace {

size_t size_class(size_t n) {
  if (n == 0) return 0;
  if (n <= (size_t{1} << 20)) return (n + 511) / 512 * 512;
  size_t pow2 = size_t{1} << 20;
  while (pow2 * 2 < n) pow2 *= 2;  // pow2 < n <= 2*pow2
  const size_t step = pow2 / 4;
  return (n + step - 1) / step * step;
}

struct DevicePool {
  std::map<size_t, std::vector<void*>> free_blocks;  // size class -> cached blocks
  std::unordered_map<void*, size_t> live;            // block -> size class
  MemoryStats stats;
  size_t cached = 0;
};

std::mutex g_mu;
std::unordered_map<int, DevicePool> g_pools;

double mib(size_t b) {
  return static_cast<double>(b) / (1 << 20);
}

void release_cache_locked(int device, DevicePool& pool) {
  cuda::DeviceGuard guard(device);
  cudaStreamSynchronize(cuda::stream(device));
  for (auto& [cls, blocks] : pool.free_blocks) {
    for (void* p : blocks) {
      cudaFree(p);
      pool.stats.reserved -= cls;
    }
  }
  pool.free_blocks.clear();
  pool.cached = 0;
}

}  // namespace

void* allocate(size_t nbytes, int device) {
  const size_t cls = size_class(nbytes);
  if (cls == 0) return nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  DevicePool& pool = g_pools[device];
  void* p = nullptr;
  auto it = pool.free_blocks.find(cls);
  if (it != pool.free_blocks.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    pool.cached -= cls;
  } else {
    cuda::DeviceGuard guard(device);
    cudaError_t e = cudaMalloc(&p, cls);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_cache_locked(device, pool);
      e = cudaMalloc(&p, cls);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      detail::throw_error(
          __FILE__, __LINE__, __func__, nullptr,
          detail::cat("[cuda alloc] out of memory on cuda:", device, " allocating ", mib(nbytes),
                      " MiB (in use by tensors ", mib(pool.stats.in_use), " MiB, driver reports ",
                      mib(free_b), " MiB free of ", mib(total_b), " MiB): ", cudaGetErrorString(e)),
          e == cudaErrorMemoryAllocation ? ErrorKind::out_of_memory : ErrorKind::runtime);
    }
    pool.stats.reserved += cls;
    pool.stats.num_device_allocs += 1;
  }
  pool.live[p] = cls;
  pool.stats.in_use += cls;
  if (pool.stats.in_use > pool.stats.peak) pool.stats.peak = pool.stats.in_use;
  return p;
}

void release(void* ptr, size_t /*nbytes*/, int device) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(g_mu);
  DevicePool& pool = g_pools[device];
  auto it = pool.live.find(ptr);
  if (it == pool.live.end()) return;  // not ours; never happens for Storage-owned memory
  const size_t cls = it->second;
  pool.live.erase(it);
  pool.stats.in_use -= cls;
  pool.free_blocks[cls].push_back(ptr);
  pool.cached += cls;
}

MemoryStats stats(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_pools[device].stats;
}

void reset_peak(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& s = g_pools[device].stats;
  s.peak = s.in_use;
}

void empty_cache(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  release_cache_locked(device, g_pools[device]);
}

}  // namespace ffn::cuda_alloc
