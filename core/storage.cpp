// core/storage.cpp — CPU allocation and the device dispatch of Storage.
#include "core/storage.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "core/error.h"

namespace ffn {

namespace cuda_alloc {  // defined in core/cuda/allocator.cpp when built with CUDA
void* allocate(size_t nbytes, int device);
void release(void* ptr, size_t nbytes, int device);
MemoryStats stats(int device);
void reset_peak(int device);
void empty_cache(int device);
}  // namespace cuda_alloc

namespace {
std::mutex g_cpu_mu;
MemoryStats g_cpu_stats;

#if !FFN_WITH_CUDA
[[noreturn]] void no_cuda(const char* what) {
  FFN_THROW("[", what, "] a CUDA tensor was requested but ", cuda_unavailable_reason());
}
#endif
}  // namespace

std::shared_ptr<Storage> allocate_storage(size_t nbytes, Device device) {
  if (device.is_cpu()) {
    const size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
    FFN_CHECK(p || rounded == 0, "[alloc] out of host memory allocating ", nbytes, " bytes");
    {
      std::lock_guard<std::mutex> lock(g_cpu_mu);
      g_cpu_stats.in_use += rounded;
      g_cpu_stats.reserved += rounded;
      g_cpu_stats.num_device_allocs += 1;
      if (g_cpu_stats.in_use > g_cpu_stats.peak) g_cpu_stats.peak = g_cpu_stats.in_use;
    }
    return std::make_shared<Storage>(p, rounded, device);
  }
#if FFN_WITH_CUDA
  void* p = cuda_alloc::allocate(nbytes, device.index);
  return std::make_shared<Storage>(p, nbytes, device);
#else
  no_cuda("alloc");
#endif
}

Storage::~Storage() {
  if (device_.is_cpu()) {
    std::free(data_);
    std::lock_guard<std::mutex> lock(g_cpu_mu);
    g_cpu_stats.in_use -= nbytes_;
    g_cpu_stats.reserved -= nbytes_;
    return;
  }
#if FFN_WITH_CUDA
  cuda_alloc::release(data_, nbytes_, device_.index);
#endif
}

MemoryStats memory_stats(Device device) {
  if (device.is_cpu()) {
    std::lock_guard<std::mutex> lock(g_cpu_mu);
    return g_cpu_stats;
  }
#if FFN_WITH_CUDA
  return cuda_alloc::stats(device.index);
#else
  no_cuda("memory_stats");
#endif
}

void reset_peak_memory(Device device) {
  if (device.is_cpu()) {
    std::lock_guard<std::mutex> lock(g_cpu_mu);
    g_cpu_stats.peak = g_cpu_stats.in_use;
    return;
  }
#if FFN_WITH_CUDA
  cuda_alloc::reset_peak(device.index);
#else
  no_cuda("reset_peak_memory");
#endif
}

void empty_cache(Device device) {
#if FFN_WITH_CUDA
  if (device.is_cuda()) cuda_alloc::empty_cache(device.index);
#else
  (void)device;
#endif
}

}  // namespace ffn
