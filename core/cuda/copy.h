// core/cuda/copy.h — the device side of Tensor's copies and fills (core/cuda/copy.cu), called
// by core/tensor.cpp for CUDA tensors. A build without CUDA links core/cuda_stub.cpp instead.
// Plain C++: no CUDA header is needed to include it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace ffn {
class Tensor;
}

namespace ffn::cuda_copy {

// dst = src (same device; any strides, dtype converted).
void copy_same_device(const Tensor& dst, const Tensor& src);
// Raw bytes between devices (host<->device or peer); small host->device copies are staged
// through pinned memory and return before the device has them.
void memcpy_between(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes);
void fill(const Tensor& dst, double value);
void axpy(const Tensor& dst, const Tensor& src, double alpha);  // dst += alpha·src
void add(const Tensor& dst, const Tensor& a, const Tensor& b);  // dst = a + b
// N(mean, std²) from Philox(seed, offset), the same words as the host's philox_normal4.
void fill_normal(const Tensor& dst, uint64_t seed, uint64_t offset, double mean, double std);

}  // namespace ffn::cuda_copy
