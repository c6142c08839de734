// kernels/rope.h — rotary position embeddings (RoPE) on the q and k heads of a qkv tensor, in
// the half-split layout of HuggingFace's Llama (rotate_half): dimension i of a head is paired
// with dimension i + D/2.
//
// qkv is [B, T, (H + 2·KV)·D]: H query heads, then KV key heads, then KV value heads, D
// columns each (KV = H without grouped-query attention). For every q and k head vector x at
// position t (0 for a sequence's first token) and i < D/2, with θ_i = t·base^(−2i/D):
//   y[i]       = x[i]·cos θ_i − x[i + D/2]·sin θ_i
//   y[i + D/2] = x[i + D/2]·cos θ_i + x[i]·sin θ_i                                    (=)
// and the value heads are copied unchanged. inverse = true rotates by −θ, which is the
// backward (a rotation's gradient is its transpose). D must be even. The CPU reference
// computes the angles and the rotation in f64; the CUDA kernel reads cos/sin from an f32 table
// computed in f64 on the host (so a large t·θ keeps its accuracy) and rotates in fp32.
#pragma once

#include "core/tensor.h"

namespace ffn {

void rope(const Tensor& qkv, int64_t heads, int64_t kv_heads, double base, bool inverse,
          Tensor& out);

// The projection and the rotation in one: out = rope(x·wᵀ) as [B, T, (H + 2·KV)·D] (x [B, T,
// C], w [(H + 2·KV)·D, C]), the forward rotation. Where the own Hopper GEMM runs it (bf16/f16,
// D = 64, sm90_gemm's alignment rules) and gemm_epilogues() is on, one GEMM rotates its
// accumulators before they are rounded (Note [Fused rotary embeddings] in
// layers/attention.cpp); elsewhere gemm() then rope(), whose results it matches within one
// rounding. row_scale (optional, f32 [B·T]): out = rope(diag(row_scale)·x·wᵀ), the scale
// applied to the accumulators in the same epilogue (Note [RMSNorm folded into the QKV GEMM]
// in layers/attention.cpp); elsewhere a scale_rows pass between the GEMM and the rotation.
void linear_rope(const Tensor& x, const Tensor& w, int64_t heads, int64_t kv_heads, double base,
                 Tensor& out, const Tensor& row_scale = {});

namespace cpu {
void rope(const Tensor& qkv, int64_t heads, int64_t kv_heads, double base, bool inverse,
          Tensor& out);
}  // namespace cpu
namespace cuda {
void rope(const Tensor& qkv, int64_t heads, int64_t kv_heads, double base, bool inverse,
          Tensor& out);
}  // namespace cuda

}  // namespace ffn
