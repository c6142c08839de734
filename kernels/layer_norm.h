// kernels/layer_norm.h — layer normalization over the last dimension, fp32 statistics, and
// its uncentered variant RMSNorm (one stem, one set of kernels: RMSNorm is LayerNorm with the
// mean held at 0, no bias, and no mean term in the backward).
//
//   layer_norm:  mean_i = Σ_j x_ij / C,  rstd_i = 1/√(Σ_j (x_ij - mean_i)²/C + eps)
//                y_ij = (x_ij - mean_i)·rstd_i·w_j + b_j                             (=)
//   backward:    x̂ = (x - mean)·rstd,  g = dy ⊙ w
//                dx = rstd·(g - mean_j(g) - x̂ ⊙ mean_j(g ⊙ x̂))                       (=)
//                dw = Σ_rows dy ⊙ x̂,  db = Σ_rows dy                                 (=)
// x, dy, y, dx: [M, C]; w, b, dw, db: [C] (b may be undefined: no bias); mean and rstd:
// [M] in f32 (f64 for f64 inputs), written by the forward and read by the backward.
// dw/db are reduced without atomics in a fixed order (Note [Deterministic column sums]).
//
//   rms_norm:    rstd_i = 1/√(Σ_j x_ij²/C + eps),  y_ij = x_ij·rstd_i·w_j               (=)
//   backward:    x̂ = x·rstd,  g = dy ⊙ w,  dx = rstd·(g - x̂ ⊙ mean_j(g ⊙ x̂)),
//                dw = Σ_rows dy ⊙ x̂                                                  (=)
// The backends take an undefined mean for RMSNorm.
//
// Mixed precision (GPU): x (and dx) may be in acc_dtype(w) while w, b, y, dy, dw, db are in
// w's 16-bit dtype: the residual stream of a bf16 model stays fp32 (as under PyTorch's
// autocast) and the normalized output feeds the bf16 GEMMs. Statistics follow acc_dtype(w).
#pragma once

#include "core/tensor.h"

namespace ffn {

void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
                Tensor& mean, Tensor& rstd);
// Any of dx, dw, db may be null (not needed). With accumulate_dx the gradient is added to
// what dx holds (autograd's residual-stream sums, Note [Accumulating backward]).
void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                         const Tensor& rstd, Tensor* dx, Tensor* dw, Tensor* db,
                         bool accumulate_dx = false);

void rms_norm(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd);
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                       Tensor* dx, Tensor* dw, bool accumulate_dx = false);

namespace cpu {
void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
                Tensor& mean, Tensor& rstd);
void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                         const Tensor& rstd, Tensor* dx, Tensor* dw, Tensor* db,
                         bool accumulate_dx);
}  // namespace cpu
namespace cuda {
void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
                Tensor& mean, Tensor& rstd);
void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                         const Tensor& rstd, Tensor* dx, Tensor* dw, Tensor* db,
                         bool accumulate_dx);
}  // namespace cuda

}  // namespace ffn
