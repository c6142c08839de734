// core/storage.cpp — CPU allocation and the device dispatch of Storage.
#include "core/storage.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "core/cuda/allocator.h"
#include "core/error.h"

namespace ffn {

namespace {
std::mutex g_cpu_mu;
MemoryStats g_cpu_stats;
}  // namespace

std::shared_ptr<Storage> allocate_storage(size_t nbytes, Device device) {
  if (device.is_cpu()) {
    const size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
    if (!p && rounded != 0) {
      size_t in_use = 0;
      {
        std::lock_guard<std::mutex> lock(g_cpu_mu);
        in_use = g_cpu_stats.in_use;
      }
      detail::throw_error(__FILE__, __LINE__, __func__, nullptr,
                          detail::cat("[alloc] out of host memory allocating ", nbytes,
                                      " bytes (", in_use, " bytes in use by tensors)"),
                          ErrorKind::out_of_memory);
    }
    {
      std::lock_guard<std::mutex> lock(g_cpu_mu);
      g_cpu_stats.in_use += rounded;
      g_cpu_stats.reserved += rounded;
      g_cpu_stats.num_device_allocs += 1;
      if (g_cpu_stats.in_use > g_cpu_stats.peak) g_cpu_stats.peak = g_cpu_stats.in_use;
    }
    return std::make_shared<Storage>(p, rounded, device);
  }
  void* p = cuda_alloc::allocate(nbytes, device.index);
  return std::make_shared<Storage>(p, nbytes, device);
}

Storage::~Storage() {
  if (borrowed_) return;
  if (device_.is_cpu()) {
    std::free(data_);
    std::lock_guard<std::mutex> lock(g_cpu_mu);
    g_cpu_stats.in_use -= nbytes_;
    g_cpu_stats.reserved -= nbytes_;
    return;
  }
  cuda_alloc::release(data_, nbytes_, device_.index);
}

MemoryStats memory_stats(Device device) {
  if (device.is_cpu()) {
    std::lock_guard<std::mutex> lock(g_cpu_mu);
    return g_cpu_stats;
  }
  return cuda_alloc::stats(device.index);
}

void reset_peak_memory(Device device) {
  if (device.is_cpu()) {
    std::lock_guard<std::mutex> lock(g_cpu_mu);
    g_cpu_stats.peak = g_cpu_stats.in_use;
    return;
  }
  cuda_alloc::reset_peak(device.index);
}

void empty_cache(Device device) {
  if (device.is_cuda()) cuda_alloc::empty_cache(device.index);
}

}  // namespace ffn
