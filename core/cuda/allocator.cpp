// core/cuda/allocator.cpp — the CUDA caching allocator behind Storage.
//
// Sizes are rounded up to a size class (512 B granules below 1 MiB; above, four
// classes per power of two, so at most 25% slack). Freed blocks go to a per-device,
// per-class free list and are handed out again without cudaMalloc; this is safe
// because of Note [One compute stream] (core/cuda/context.h). When cudaMalloc
// fails, the cache is returned to the driver and the call retried once; if it
// still fails, the error says how much was asked, in use, cached and free.
//
// While a CUDA graph is captured (Note [CUDA graph step], core/graph.h) the device has a
// private pool: what the capture allocates is taken from the private free list, else from
// the shared one (changing owner), else from cudaMalloc, and a private block freed at any
// time goes back to the private list. Allocations outside the capture never get a private
// block, so nothing the host queues between two replays can sit in memory a replay writes.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
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
  // The private pool of a CUDA graph (see the header comment), when one exists.
  bool has_private = false, capturing = false;
  std::unordered_set<void*> private_blocks;               // every block the graph owns
  std::map<size_t, std::vector<void*>> private_free;      // size class -> free private blocks
};

// Pops a block of class `cls` from `lists`, or nullptr.
void* pop(std::map<size_t, std::vector<void*>>& lists, size_t cls) {
  auto it = lists.find(cls);
  if (it == lists.end() || it->second.empty()) return nullptr;
  void* p = it->second.back();
  it->second.pop_back();
  return p;
}

// cudaMalloc, also while this thread captures a graph: the capture's mode would refuse it
// (an allocation is not a stream operation, and nothing it does needs to be replayed).
cudaError_t device_malloc(void** p, size_t bytes, bool capturing) {
  if (!capturing) return cudaMalloc(p, bytes);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  const cudaError_t e = cudaMalloc(p, bytes);
  cudaThreadExchangeStreamCaptureMode(&mode);
  return e;
}

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
  if (pool.capturing) p = pop(pool.private_free, cls);
  if (!p && (p = pop(pool.free_blocks, cls)) != nullptr) pool.cached -= cls;
  if (!p) {
    cuda::DeviceGuard guard(device);
    cudaError_t e = device_malloc(&p, cls, pool.capturing);
    if (e == cudaErrorMemoryAllocation && !pool.capturing) {  // no synchronizing in a capture
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
  if (pool.capturing) pool.private_blocks.insert(p);
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
  if (pool.has_private && pool.private_blocks.count(ptr)) {
    pool.private_free[cls].push_back(ptr);
    return;
  }
  pool.free_blocks[cls].push_back(ptr);
  pool.cached += cls;
}

void begin_private_pool(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  DevicePool& pool = g_pools[device];
  FFN_CHECK(!pool.has_private, "[cuda alloc] cuda:", device,
            " already has a CUDA graph's private pool (one captured graph per device at a time)");
  pool.has_private = pool.capturing = true;
}

void end_capture(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_pools[device].capturing = false;
}

void release_private_pool(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  DevicePool& pool = g_pools[device];
  for (auto& [cls, blocks] : pool.private_free)
    for (void* p : blocks) {
      pool.free_blocks[cls].push_back(p);
      pool.cached += cls;
    }
  pool.private_free.clear();
  pool.private_blocks.clear();  // live ones go to the shared list when freed
  pool.has_private = pool.capturing = false;
}

size_t private_pool_blocks(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_pools[device].private_blocks.size();
}

bool is_private_block(const void* ptr, int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_pools[device].private_blocks.count(const_cast<void*>(ptr)) != 0;
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
