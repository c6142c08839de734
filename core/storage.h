// core/storage.h — raw memory owned by tensors, and per-device memory statistics.
//
// CPU memory is 64-byte aligned. CUDA memory comes from the caching allocator
// (core/cuda/allocator.cpp): freed blocks go back to a per-device pool instead of
// cudaFree, so a training step does no cudaMalloc/cudaFree once warm.
#pragma once

#include <cstddef>
#include <memory>

#include "core/device.h"

namespace ffn {

class Storage {
 public:
  Storage(void* data, size_t nbytes, Device device, bool borrowed = false)
      : data_(data), nbytes_(nbytes), device_(device), borrowed_(borrowed) {}
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  size_t nbytes_;
  Device device_;
  bool borrowed_;  // memory someone else owns and frees (Tensor::borrow): never released here
};

// Allocates `nbytes` on `device` (uninitialized). Throws ffn::Error naming the size on failure.
std::shared_ptr<Storage> allocate_storage(size_t nbytes, Device device);

struct MemoryStats {
  size_t in_use = 0;             // bytes held by live tensors
  size_t peak = 0;               // max of in_use since the last reset_peak_memory
  size_t reserved = 0;           // bytes obtained from the system (CUDA: held by the cache too)
  size_t num_device_allocs = 0;  // calls into malloc/cudaMalloc so far
};
MemoryStats memory_stats(Device device);
void reset_peak_memory(Device device);
// CUDA: returns cached, unused blocks to the driver. No-op on CPU.
void empty_cache(Device device);

}  // namespace ffn
