// kernels/causal_softmax.h — causal softmax with in-kernel attention dropout, for attention scores.
//
//   causal_softmax:  for row i of each [T, T] matrix (T = s.size(1) = s.size(2)):
//                    p_ij = exp(scale·s_ij - m_i) / Σ_{k≤i} exp(scale·s_ik - m_i)  for j ≤ i,
//                    p_ij = 0 for j > i;   pd = p ⊙ mask / (1-p_drop)                     (=)
//   backward:        dp = dpd ⊙ mask / (1-p_drop)   (the mask is regenerated, never stored)
//                    ds_ij = scale · p_ij · (dp_ij - Σ_k dp_ik p_ik)                      (=)
// s, p, pd, dpd, ds: [B, T, T] contiguous. The mask of element e (its index in the
// row-major [B·T, T] view) is draw e of the spec's stream (Note [Dropout RNG]), the same
// as bias_dropout on that view, so pd can be rebuilt from p by bias_dropout. pd may be
// null when the caller does not need it (dropout off: pd = p).
#pragma once

#include "core/philox.h"
#include "core/tensor.h"

namespace ffn {

void causal_softmax(const Tensor& s, double scale, const DropoutSpec& d, Tensor& p, Tensor* pd);
void causal_softmax_backward(const Tensor& p, const Tensor& dpd, double scale,
                             const DropoutSpec& d, Tensor& ds);

namespace cpu {
void causal_softmax(const Tensor& s, double scale, const DropoutSpec& d, Tensor& p, Tensor* pd);
void causal_softmax_backward(const Tensor& p, const Tensor& dpd, double scale,
                             const DropoutSpec& d, Tensor& ds);
}  // namespace cpu
namespace cuda {
void causal_softmax(const Tensor& s, double scale, const DropoutSpec& d, Tensor& p, Tensor* pd);
void causal_softmax_backward(const Tensor& p, const Tensor& dpd, double scale,
                             const DropoutSpec& d, Tensor& ds);
}  // namespace cuda

}  // namespace ffn
