// kernels/bias_glu_dropout.h — the fused middle of gated FFNs (GEGLU, SwiGLU), forward and backward.
//
// z = x·Wᵀ is [M, 2h] (fc1's GEMM output without bias), b is [2h] (optional).
// With [v | g] = z + b split down the middle (value first, gate second):
//   forward:  out = dropout(v ⊙ act(g))                              [M, h]
//   backward: dz  = [dv | dg], dv = s ⊙ act(g),  dg = s ⊙ v ⊙ act'(g),
//             where s = dout ⊙ mask·1/(1-p)                          [M, 2h] (=)
//             db  = Σ_rows dz                                         [2h] (=, optional)
//             out = forward recomputed (fc2's input for dW2)          [M, h] (=, optional)
// dz is one concatenated buffer so dW = dzᵀ·x is a single GEMM. GEGLU uses
// act = gelu_tanh (or gelu_erf), SwiGLU act = silu.
#pragma once

#include "core/philox.h"
#include "core/tensor.h"
#include "kernels/activation.h"

namespace ffn {

void bias_glu_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                      Tensor& out);
void bias_glu_dropout_backward(const Tensor& dout, const Tensor& z, const Tensor& b, Activation act,
                        const DropoutSpec& d, Tensor& dz, Tensor* db, Tensor* out);

// The forward folded into fc1's GEMM where the GPU can (the own Hopper GEMM's activation
// warpgroups, Note [GLU warpgroup]; on while gemm_epilogues() is): out = bias_glu_dropout(z)
// with its arithmetic and mask, for z = x·wᵀ (x [M, K], w [2h, K] as [value | gate] rows),
// which it returns ([M, 2h], without the bias: what the backward reads). Returns an undefined
// tensor and computes nothing where it does not run or was not measured faster (the CPU,
// f32, non-Hopper GPUs, h % 64 != 0, K below 384): the caller then runs gemm and
// bias_glu_dropout. row_scale (optional, [M] in acc_dtype(x); Note [RMSNorm folded into the FFN] in
// layers/ffn_nodes.cpp): z = diag(row_scale)·x·wᵀ, each row scaled before it is rounded
// (the caller's fallback: scale_rows of the product).
Tensor linear_glu(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                  const DropoutSpec& d, Tensor& out, const Tensor& row_scale = {});
// The backward likewise, in the dhd = dy·w GEMM (w [K, h]: fc2's weight, K = dy.size(1)):
// bias_glu_dropout_backward(dy·w, z, b, act, d, dz, db, &out) with its arithmetic and mask
// (db optional, [2h], summed in the kernel). Returns false and computes nothing where it
// does not run (as linear_glu, from K = 384 and for any h % 8 == 0). row_scale: the
// forward's; dz comes out as diag(row_scale)·dz (the gradient of x·wᵀ; the caller's fallback:
// scale_rows of dz). It declines db with a row scale (db sums the unscaled dz).
bool linear_glu_backward(const Tensor& dy, const Tensor& w, const Tensor& z, const Tensor& b,
                         Activation act, const DropoutSpec& d, Tensor& dz, Tensor& out,
                         Tensor* db = nullptr, const Tensor& row_scale = {});

namespace cpu {
void bias_glu_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                      Tensor& out);
void bias_glu_dropout_backward(const Tensor& dout, const Tensor& z, const Tensor& b, Activation act,
                        const DropoutSpec& d, Tensor& dz, Tensor* db, Tensor* out);
}  // namespace cpu
namespace cuda {
void bias_glu_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                      Tensor& out);
void bias_glu_dropout_backward(const Tensor& dout, const Tensor& z, const Tensor& b, Activation act,
                        const DropoutSpec& d, Tensor& dz, Tensor* db, Tensor* out);
}  // namespace cuda

}  // namespace ffn
