// kernels/bias_act_dropout.h — bias + activation + dropout, the fused middle of the plain FFN,
// forward and backward; bias + dropout (the residual/output dropout) is the same stem with
// the identity activation.
//
//   forward:  hd   = dropout(act(z + b))                 z, hd: [M, h];  b: [h] (optional)
//   backward: dpre = dhd ⊙ mask·1/(1-p) ⊙ act'(z + b)    (=)
//             db   = Σ_rows dpre                          (=, optional; fused, deterministic)
//             hd   = dropout(act(z + b))                  (=, optional: fc2's input recomputed
//                                                          for dW2 instead of saved)
// z is fc1's GEMM output without bias; it is the one activation the FFN saves.
// act is gelu_erf, gelu_tanh, silu or identity. The mask comes from the DropoutSpec
// (Note [Dropout RNG]) in both directions. 16-bit tensors are computed in fp32 and rounded
// once on store.
#pragma once

#include "core/philox.h"
#include "core/tensor.h"
#include "kernels/activation.h"

namespace ffn {

void bias_act_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                      Tensor& hd);
void bias_act_dropout_backward(const Tensor& dhd, const Tensor& z, const Tensor& b,
                               Activation act, const DropoutSpec& d, Tensor& dpre, Tensor* db,
                               Tensor* hd);

// The same folded into the GEMM next to it where the GPU can (the own Hopper GEMM's
// activation warpgroups, Note [Activation warpgroup]; on while gemm_epilogues() is):
//   linear_act:          z = x·wᵀ (x [M, K], w [h, K]) and hd = dropout(act(z + b))
//   linear_act_backward: dz = dropout'(dy·w) ⊙ act'(z + b) (dy [M, N], w [N, h]) and
//                        hd = dropout(act(z + b))
// with the arithmetic and the mask of gemm followed by bias_act_dropout(_backward). They
// return false and compute nothing where the fused kernels do not run or were measured
// slower (the CPU, f32, non-Hopper GPUs, shapes they do not take, K below 768): the caller
// then runs gemm and the kernels above.
bool linear_act(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                const DropoutSpec& d, Tensor& z, Tensor& hd);
// db (optional): Σ_rows dz (deterministic), from the same kernel (the activation
// warpgroups' per-tile partials).
bool linear_act_backward(const Tensor& dy, const Tensor& w, const Tensor& z, const Tensor& b,
                         Activation act, const DropoutSpec& d, Tensor& dz, Tensor& hd,
                         Tensor* db = nullptr);

// fc2 of an FFN with output dropout in one Hopper GEMM: y = dropout(x·wᵀ + b) (x [M, K],
// w [N, K], b [N] optional), the GEMM's output rounded before the bias as gemm followed by
// bias_dropout rounds it, and the same mask (Note [Output dropout in the GEMM]). Returns false
// and computes nothing where that kernel does not run or was measured slower (as linear_act);
// the caller then runs gemm and bias_dropout.
bool linear_dropout(const Tensor& x, const Tensor& w, const Tensor& b, const DropoutSpec& d,
                    Tensor& y);

// Plain activation (no bias, no dropout) and its gradient dx = dy ⊙ act'(x).
inline void activation_forward(const Tensor& x, Activation act, Tensor& y) {
  bias_act_dropout(x, {}, act, {}, y);
}
inline void activation_backward(const Tensor& dy, const Tensor& x, Activation act, Tensor& dx) {
  bias_act_dropout_backward(dy, x, {}, act, {}, dx, nullptr, nullptr);
}

// Bias + dropout (act = identity):
//   forward:  y  = dropout(z + b)             z, y: [M, N];  b: [N] (optional)
//   backward: dz = dy ⊙ mask · 1/(1-p)        (=, optional output)
//             db = Σ_rows dz                   (=, optional output; no float atomics)
// p = 0 makes these a plain bias add and a bias gradient (bias_add, bias_grad).
inline void bias_dropout(const Tensor& z, const Tensor& b, const DropoutSpec& d, Tensor& y) {
  bias_act_dropout(z, b, Activation::identity, d, y);
}
void bias_dropout_backward(const Tensor& dy, const DropoutSpec& d, Tensor* dz, Tensor* db);
inline void bias_add(const Tensor& z, const Tensor& b, Tensor& y) {
  bias_dropout(z, b, {}, y);
}
inline void bias_grad(const Tensor& dy, Tensor& db) {
  bias_dropout_backward(dy, {}, nullptr, &db);
}

// The backends. z is undefined only with act = identity (then hd must be null); dpre and db
// are optional outputs.
namespace cpu {
void bias_act_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                      Tensor& hd);
void bias_act_dropout_backward(const Tensor& dhd, const Tensor& z, const Tensor& b,
                               Activation act, const DropoutSpec& d, Tensor* dpre, Tensor* db,
                               Tensor* hd);
}  // namespace cpu
namespace cuda {
void bias_act_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                      Tensor& hd);
void bias_act_dropout_backward(const Tensor& dhd, const Tensor& z, const Tensor& b,
                               Activation act, const DropoutSpec& d, Tensor* dpre, Tensor* db,
                               Tensor* hd);
}  // namespace cuda

}  // namespace ffn
