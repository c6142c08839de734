// core/cuda/allocator.h — the CUDA caching allocator behind Storage (core/cuda/allocator.cpp),
// called by core/storage.cpp for CUDA storages. A build without CUDA links
// core/cuda_stub.cpp instead. Plain C++: no CUDA header is needed to include it.
#pragma once

#include <cstddef>

#include "core/storage.h"  // MemoryStats

namespace ffn::cuda_alloc {

void* allocate(size_t nbytes, int device);
void release(void* ptr, size_t nbytes, int device);
MemoryStats stats(int device);
void reset_peak(int device);
void empty_cache(int device);

}  // namespace ffn::cuda_alloc
