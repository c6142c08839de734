// core/cuda_stub.cpp — the CUDA side of core (core/cuda/copy.h, core/cuda/allocator.h) in a
// build without CUDA. Allocating on a GPU is the one way in, and it says why it cannot; the
// rest is unreachable without a CUDA storage (release and empty_cache do nothing).
#include "core/cuda/allocator.h"
#include "core/cuda/copy.h"
#include "core/error.h"

namespace ffn {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  FFN_THROW("[", what, "] a CUDA tensor was requested but ", cuda_unavailable_reason());
}
}  // namespace

namespace cuda_alloc {
void* allocate(size_t, int) {
  no_cuda("alloc");
}
void release(void*, size_t, int) {}
MemoryStats stats(int) {
  no_cuda("memory_stats");
}
void reset_peak(int) {
  no_cuda("reset_peak_memory");
}
void empty_cache(int) {}
void begin_private_pool(int) {
  no_cuda("graph");
}
void end_capture(int) {}
void release_private_pool(int) {}
size_t private_pool_blocks(int) {
  return 0;
}
bool is_private_block(const void*, int) {
  return false;
}
}  // namespace cuda_alloc

namespace cuda_copy {
void copy_same_device(const Tensor&, const Tensor&) {
  no_cuda("copy");
}
void memcpy_between(void*, Device, const void*, Device, size_t) {
  no_cuda("copy");
}
void fill(const Tensor&, double) {
  no_cuda("fill");
}
void axpy(const Tensor&, const Tensor&, double) {
  no_cuda("add_");
}
void add(const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("plus");
}
void fill_normal(const Tensor&, uint64_t, uint64_t, double, double) {
  no_cuda("randn");
}
}  // namespace cuda_copy

}  // namespace ffn
