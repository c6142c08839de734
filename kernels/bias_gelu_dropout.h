// kernels/bias_gelu_dropout.h — the fused middle of the plain FFN, forward and backward.
//
//   forward:  hd   = dropout(act(z + b))                 z, hd: [M, h];  b: [h] (optional)
//   backward: dpre = dhd ⊙ mask·1/(1-p) ⊙ act'(z + b)    (=)
//             db   = Σ_rows dpre                          (=, optional; fused, deterministic)
//             hd   = dropout(act(z + b))                  (=, optional: fc2's input recomputed
//                                                          for dW2 instead of saved)
// z is fc1's GEMM output without bias; it is the one activation the FFN saves.
// act is gelu_erf or gelu_tanh (silu works too). The mask comes from the
// DropoutSpec (Note [Dropout RNG]) in both directions. 16-bit tensors are
// computed in fp32 and rounded once on store.
#pragma once

#include "core/philox.h"
#include "core/tensor.h"
#include "kernels/activation.h"

namespace ffn {

void bias_gelu_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                       Tensor& hd);
void dropout_dgelu_dbias(const Tensor& dhd, const Tensor& z, const Tensor& b, Activation act,
                         const DropoutSpec& d, Tensor& dpre, Tensor* db, Tensor* hd);

// Plain activation (no bias, no dropout) and its gradient dx = dy ⊙ act'(x).
inline void activation_forward(const Tensor& x, Activation act, Tensor& y) {
  bias_gelu_dropout(x, {}, act, {}, y);
}
inline void activation_backward(const Tensor& dy, const Tensor& x, Activation act, Tensor& dx) {
  dropout_dgelu_dbias(dy, x, {}, act, {}, dx, nullptr, nullptr);
}

namespace cpu {
void bias_gelu_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                       Tensor& hd);
void dropout_dgelu_dbias(const Tensor& dhd, const Tensor& z, const Tensor& b, Activation act,
                         const DropoutSpec& d, Tensor& dpre, Tensor* db, Tensor* hd);
}  // namespace cpu
namespace cuda {
void bias_gelu_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                       Tensor& hd);
void dropout_dgelu_dbias(const Tensor& dhd, const Tensor& z, const Tensor& b, Activation act,
                         const DropoutSpec& d, Tensor& dpre, Tensor* db, Tensor* hd);
}  // namespace cuda

}  // namespace ffn
