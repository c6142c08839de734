// kernels/cuda/gemm/tensor_map.h — host side of the Hopper kernels (the GEMM, the attention):
// TMA tensor maps over 16-bit tensors with 128-byte swizzling, and whether this build holds
// sm_90a machine code for a device at all.
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "core/tensor.h"

namespace ffn::cuda::gemm {

// A row-major [rows, cols] bf16/f16 matrix as boxes of box_rows rows × 64 columns.
CUtensorMap tensor_map_2d(const Tensor& t, int box_rows, const char* op);

// A bf16/f16 tensor at base viewed as [dims[2]][dims[1]][dims[0]] (dims[0] contiguous), with
// strides[0] elements between consecutive indices of dims[1] and strides[1] between those of
// dims[2], as boxes of {64, box_rows, 1}. Out-of-bounds box elements load as zeros.
CUtensorMap tensor_map_3d(const void* base, DType dt, const uint64_t (&dims)[3],
                          const uint64_t (&strides)[2], int box_rows, const char* op);

// True when the kernels were compiled to sm_90a machine code that runs on device `dev` (a
// Hopper GPU and a build whose CUDA architectures include 90a; Note [sm_90a code]). Asked
// once per device with a one-thread probe kernel.
bool sm90a_code_on(int dev);

}  // namespace ffn::cuda::gemm
