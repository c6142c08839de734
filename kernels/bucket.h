// kernels/bucket.h — a data-parallel gradient bucket's two passes beside the copy-engine
// all-gather that reduces it (Note [Copy-engine gradient reduction], train/dist/comm.h):
//
//   bucket_pack:  flat[off_k + i] = parts[k][i]                                     (=)
//   bucket_mean:  parts[k][i] = Σ_{r < world} slots[r·S + off_k + i]  (/ world)      (=)
//
// parts are contiguous tensors of flat's / slots' dtype on its device, in any number;
// offsets[k] places part k (numel n_k) in a slot: off_k + n_k ≤ S, the ranges disjoint. slots
// is 1-D with numel world·S (rank r's copy of the bucket at r·S). The sum runs over the ranks
// in rank order in fp32 (f64 for f64 tensors) and is rounded once after the division by
// world, so every rank computes the same bits, and the CPU reference the same as the kernel.
// On the GPU the pack runs on `stream` (a cudaStream_t; null: the compute stream) as one
// device-to-device copy per part (the copy engines: no SM, beside backward's kernels); the
// mean is one kernel per 32 parts on the compute stream, at the width of the whole GPU.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace ffn {

void bucket_pack(const std::vector<Tensor>& parts, const std::vector<int64_t>& offsets,
                 Tensor& flat, void* stream = nullptr);
void bucket_mean(const Tensor& slots, int64_t world, const std::vector<int64_t>& offsets,
                 std::vector<Tensor>& parts, bool average);

namespace cpu {
void bucket_pack(const std::vector<Tensor>& parts, const std::vector<int64_t>& offsets,
                 Tensor& flat);
void bucket_mean(const Tensor& slots, int64_t world, const std::vector<int64_t>& offsets,
                 std::vector<Tensor>& parts, bool average);
}  // namespace cpu
namespace cuda {
void bucket_pack(const std::vector<Tensor>& parts, const std::vector<int64_t>& offsets,
                 Tensor& flat, void* stream);
void bucket_mean(const Tensor& slots, int64_t world, const std::vector<int64_t>& offsets,
                 std::vector<Tensor>& parts, bool average);
}  // namespace cuda

}  // namespace ffn
