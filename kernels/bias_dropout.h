// kernels/bias_dropout.h — bias add + dropout, forward and backward (one stem).
//
//   forward:  y  = dropout(z + b)             z, y: [M, N];  b: [N] (optional)
//   backward: dz = dy ⊙ mask · 1/(1-p)        (=, optional output)
//             db = Σ_rows dz                   (=, optional output; no float atomics)
// The mask is regenerated from the DropoutSpec (Note [Dropout RNG]), never stored.
// p = 0 makes these a plain bias add and a bias gradient (bias_add, bias_grad below).
#pragma once

#include "core/philox.h"
#include "core/tensor.h"

namespace ffn {

void bias_dropout(const Tensor& z, const Tensor& b, const DropoutSpec& d, Tensor& y);
void dropout_dbias(const Tensor& dy, const DropoutSpec& d, Tensor* dz, Tensor* db);

inline void bias_add(const Tensor& z, const Tensor& b, Tensor& y) {
  bias_dropout(z, b, {}, y);
}
inline void bias_grad(const Tensor& dy, Tensor& db) {
  dropout_dbias(dy, {}, nullptr, &db);
}

namespace cpu {
void bias_dropout(const Tensor& z, const Tensor& b, const DropoutSpec& d, Tensor& y);
void dropout_dbias(const Tensor& dy, const DropoutSpec& d, Tensor* dz, Tensor* db);
}  // namespace cpu
namespace cuda {
void bias_dropout(const Tensor& z, const Tensor& b, const DropoutSpec& d, Tensor& y);
void dropout_dbias(const Tensor& dy, const DropoutSpec& d, Tensor* dz, Tensor* db);
}  // namespace cuda

}  // namespace ffn
