// kernels/dropout_add.h — the residual add of a dropped-out branch, forward and backward
// (one stem): the pre-LN block's `x + dropout(branch)` as one pass each way.
//
//   forward:  out = res + dropout(y)               y: [M, N];  res, out: [M, N]
//   backward: dy  = dout ⊙ mask · 1/(1−p)          (=; dres = dout needs no kernel)
// res/out/dout are in y's dtype, or (GPU) fp32 for a 16-bit y: the residual stream of a
// 16-bit model (Note [Mixed-precision residual stream]); then y's values enter the sum
// unrounded and dy is rounded once, to y's dtype. The mask of element (r, c) is draw
// r·N + c of the spec, as in bias_dropout (Note [Dropout RNG]), so with equal dtypes
// dropout_add(res, y) == res + bias_dropout(y) with the same spec.
#pragma once

#include "core/philox.h"
#include "core/tensor.h"

namespace ffn {

void dropout_add(const Tensor& res, const Tensor& y, const DropoutSpec& d, Tensor& out);
void dropout_add_backward(const Tensor& dout, const DropoutSpec& d, Tensor& dy);

namespace cpu {
void dropout_add(const Tensor& res, const Tensor& y, const DropoutSpec& d, Tensor& out);
void dropout_add_backward(const Tensor& dout, const DropoutSpec& d, Tensor& dy);
}  // namespace cpu
namespace cuda {
void dropout_add(const Tensor& res, const Tensor& y, const DropoutSpec& d, Tensor& out);
void dropout_add_backward(const Tensor& dout, const DropoutSpec& d, Tensor& dy);
}  // namespace cuda

}  // namespace ffn
