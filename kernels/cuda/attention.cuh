// kernels/cuda/attention.cuh — device pieces shared by the two implementations of the fused
// causal attention (kernels/attention.h): the mma.sync kernels (attention.cu) and the Hopper
// wgmma + TMA ones (attention_sm90*.cu): rounding to 16 bits, exp2, and the dropout keep bits
// of Note [Attention mask draws] (attention.cu), which both draw the same way, so both drop
// the same entries as the CPU reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/philox.h"
#include "kernels/cuda/rowwise.cuh"  // DeviceMask

namespace ffn::cuda::attn {

using u32 = uint32_t;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float ex2(float x) {  // 2^x; ex2(−inf) = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Keep bits of draws e0 … e0+7 (bit j for e0 + j).
__device__ __forceinline__ u32 keep_bits8(const DeviceMask& m, uint64_t e0) {
  uint64_t blk = e0 >> 3;
  const uint64_t off = m.off();
  U32x4 r = philox_block(m.keys, off, blk);
  u32 bits = 0;
  if ((e0 & 7) == 0) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      bits |= static_cast<u32>(((r.v[j >> 1] >> (16 * (j & 1))) & 0xffffu) >= m.thr) << j;
    return bits;
  }
  for (int j = 0; j < 8; ++j) {
    const uint64_t e = e0 + j;
    if ((e >> 3) != blk) r = philox_block(m.keys, off, blk = e >> 3);
    // mask_draw's word, picked by selects: a run-time index into r would put it in local memory.
    const uint32_t q = static_cast<uint32_t>(e & 7) >> 1;
    const uint32_t w = q == 0 ? r.v[0] : q == 1 ? r.v[1] : q == 2 ? r.v[2] : r.v[3];
    bits |= static_cast<u32>(((w >> (16 * (e & 1))) & 0xffffu) >= m.thr) << j;
  }
  return bits;
}

struct QueryKeys {  // query i and keys [j0, j0+8)
  int64_t i, j0;
};

// Fills the warp's 32·U mask bytes: byte idx covers query qk(idx).i, keys [qk(idx).j0, +8);
// entries with no key ≤ query (or query ≥ T) are 0.
template <int U, class QK>
__device__ __forceinline__ void draw_bytes(uint8_t* mb, const DeviceMask& m, int64_t bh, int64_t t,
                                           int lane, const QK& qk) {
  __syncwarp();  // the previous tile's bytes have been read
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int idx = lane + 32 * u;
    const QueryKeys at = qk(idx);
    mb[idx] = at.i < t && at.j0 <= at.i
                  ? static_cast<uint8_t>(
                        keep_bits8(m, (static_cast<uint64_t>(bh) * t + at.i) * t + at.j0))
                  : uint8_t{0};
  }
  __syncwarp();
}

}  // namespace ffn::cuda::attn
