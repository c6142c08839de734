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

// A CUDA graph's private pool (Note [CUDA graph step], core/graph.h): from begin to
// end_capture the device's allocations come from it; its blocks stay its own (freed ones
// are handed out again only to a capture) until release_private_pool gives the free ones
// to the shared cache and lets the live ones go there when freed. One per device.
void begin_private_pool(int device);
void end_capture(int device);
void release_private_pool(int device);
size_t private_pool_blocks(int device);            // blocks the pool owns (tests)
bool is_private_block(const void* ptr, int device);  // whether `ptr` is one of them (tests)

}  // namespace ffn::cuda_alloc
