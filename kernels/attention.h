// kernels/attention.h — fused causal multi-head attention (flash-style: the [T, T] scores
// and probabilities never reach global memory), forward and backward, with the attention
// dropout drawn in-kernel and regenerated in backward.
//
// Layouts are the ones the projections produce and consume, so no head split/merge copies:
//   qkv [B, T, 3·H·D]  (q | k | v, each H heads of D columns), y and dy [B, T, H·D],
//   lse [B·H, T] f32   (the row log-sum-exp of the scaled scores, saved for backward).
// For head h of batch b (bh = b·H + h), query i, key j ≤ i:
//   s_ij = scale·q_i·k_j;  p_ij = exp(s_ij − lse_i);  lse_i = log Σ_{j≤i} exp(s_ij)
//   pd_ij = p_ij · mask_ij/(1−p_drop);  y_i = Σ_j pd_ij v_j
// backward (D_i = dy_i·y_i = Σ_j pd_ij·dpd_ij):
//   dpd_ij = dy_i·v_j;  ds_ij = p_ij (dpd_ij·mask_ij/(1−p_drop) − D_i)
//   dq_i = scale Σ_j ds_ij k_j;  dk_j = scale Σ_i ds_ij q_i;  dv_j = Σ_i pd_ij dy_i
// The mask of (bh, i, j) is draw (bh·T + i)·T + j of the spec's stream (Note [Dropout RNG]):
// the same element numbering as causal_softmax on [B·H, T, T] scores, so this op and the
// composite path (bmm + causal_softmax + bmm) drop the same entries.
//
// The CPU reference recomputes everything in f64 (it ignores y and lse in backward). The
// CUDA kernels take bf16/f16 with head_dim 32, 64 or 128 (fused_attention_supported); they
// keep scores and probabilities in registers (tensor cores, fp32 accumulation), so T is not
// bounded by shared memory, and are deterministic (no atomics: dQ and dK/dV come from two
// kernels that each recompute the probabilities). Two implementations: mma.sync for any
// GPU (kernels/cuda/attention.cu), wgmma + TMA on Hopper for head_dim 64
// (kernels/cuda/attention_sm90*.cu, Note [Hopper attention]).
#pragma once

#include "core/philox.h"
#include "core/tensor.h"

namespace ffn {

// True when the CUDA kernels cover this dtype, head_dim and sequence length.
bool fused_attention_supported(DType dt, int64_t t, int64_t head_dim);
// True when they are also the faster choice than batched GEMMs + causal softmax: wherever
// they run (shakespeare_char at T=256 and gpt2_small at T=1024 on the H100,
// bench/RESULTS-2026-11-22.md).
bool fused_attention_preferred(DType dt, int64_t t, int64_t head_dim);

void fused_attention(const Tensor& qkv, int64_t heads, double scale, const DropoutSpec& d,
                     Tensor& y, Tensor& lse);
// rope_base > 0: q and k of qkv were rotated by rotary embeddings of that base (kernels/rope.h,
// with kv_heads = heads) before this attention, and dq and dk leave rotated back, as the
// gradient with respect to the unrotated q and k (the CUDA kernels rotate them before their
// stores; Note [Fused rotary embeddings] in layers/attention.cpp). head_dim must be even.
// dqkv_sum (optional, [3·H·D], qkv's dtype and device) gets dqkv's column sums over all B·T
// rows, the QKV projection's bias gradient: the Hopper kernels sum the values they store
// (Note [QKV bias gradient in the attention backward], kernels/cuda/attention_sm90_bwd.cu),
// the others run bias_grad over dqkv. Deterministic either way.
// row_scale (optional, f32 [B·T], never with dqkv_sum): row r of dqkv leaves multiplied by
// row_scale[r] (after the rotation back; Note [RMSNorm folded into the QKV GEMM] in
// layers/attention.cpp). The Hopper kernels scale before they round; the others run
// scale_rows over dqkv afterwards.
void fused_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& dy,
                              const Tensor& lse, int64_t heads, double scale, const DropoutSpec& d,
                              Tensor& dqkv, double rope_base = 0, Tensor* dqkv_sum = nullptr,
                              const Tensor& row_scale = {});

namespace cpu {
void fused_attention(const Tensor& qkv, int64_t heads, double scale, const DropoutSpec& d,
                     Tensor& y, Tensor& lse);
void fused_attention_backward(const Tensor& qkv, const Tensor& dy, int64_t heads, double scale,
                              const DropoutSpec& d, Tensor& dqkv);
}  // namespace cpu
namespace cuda {
// Which CUDA kernels run: automatic takes the Hopper (wgmma + TMA) ones where they apply
// (sm90_attention_supported: an sm_90a build on a Hopper GPU, head_dim 64) and measure faster
// (T ≥ 256; kernels/cuda/attention.cu) and the mma.sync ones
// elsewhere (the environment variable FFN_ATTENTION_KERNEL = mma_sync | sm90 overrides
// it, for A/B runs of whole programs); the others force one (tests and benchmarks).
enum class AttentionKernel : uint8_t { automatic, mma_sync, sm90 };
bool fused_attention_supported(DType dt, int64_t t, int64_t head_dim);
bool fused_attention_preferred(DType dt, int64_t t, int64_t head_dim);
void fused_attention(const Tensor& qkv, int64_t heads, double scale, const DropoutSpec& d,
                     Tensor& y, Tensor& lse, AttentionKernel kernel = AttentionKernel::automatic);
void fused_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& dy,
                              const Tensor& lse, int64_t heads, double scale, const DropoutSpec& d,
                              Tensor& dqkv, double rope_base = 0,
                              AttentionKernel kernel = AttentionKernel::automatic,
                              Tensor* dqkv_sum = nullptr, const Tensor& row_scale = {});
}  // namespace cuda

}  // namespace ffn
