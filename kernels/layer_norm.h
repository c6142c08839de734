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
//   rms_norm_backward, prescaled: dy is given as rstd ⊙ dy (each row scaled by its rstd),
//                dx = g - x̂ ⊙ mean_j(g ⊙ x̂) with g = dy ⊙ w (the same dx), dw = Σ_rows dy ⊙ x
//                (the same dw): Note [RMSNorm folded into the QKV GEMM] in
//                layers/attention.cpp, where the GEMM that makes dy can only make it scaled.
// The forwards write only the statistics (and a) where y is undefined: that note's norm,
// whose output the next GEMM computes from x and rstd instead.
//
// Mixed precision (GPU): x (and dx) may be in acc_dtype(w) while w, b, y, dy, dw, db are in
// w's 16-bit dtype: the residual stream of a bf16 model stays fp32 (as under PyTorch's
// autocast) and the normalized output feeds the bf16 GEMMs. Statistics follow acc_dtype(w).
//
// Note [Residual add and norm]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// In a pre-norm block every residual add a = x + dropout(h) (kernels/dropout_add.h) is read by
// the next norm, so the two share their passes over memory:
//   add_layer_norm: forward a = x + dropout(h) with dropout_add's arithmetic and mask, then
//                   the norm of a, in one pass (x and h read once, a written and not read
//                   back);
//   BranchGrad:     the norm's backward, which finishes a's gradient dx (it accumulates last,
//                   Note [Accumulating backward]; or, for the last block's add, whose only
//                   user is the final norm, writes all of it), also writes dh =
//                   dropout_add_backward(dx),
//                   the branch's gradient, so the add's backward needs no pass of its own;
//                   and, asked for dh_sum, the column sums of dh: the bias gradient of the
//                   Linear (attention's projection) or FFN (fc2) that made h, so that
//                   gradient needs no column-sum pass over dh either (layers/functional.cpp,
//                   Note [Branch bias gradient]).
// Results equal the separate ops' bit for bit (same arithmetic, same mask bits), except
// dh_sum, which the CUDA kernel sums over its blocks of 64 rows and then over the blocks in
// order: deterministic and independent of the launch, but not bias_grad's order.
#pragma once

#include "core/philox.h"
#include "core/tensor.h"

namespace ffn {

// The gradient of the branch h added into the norm's input (Note [Residual add and norm]).
struct BranchGrad {
  Tensor* dh = nullptr;      // [M, C] in w's dtype, written (=)
  DropoutSpec d;             // the add's dropout
  Tensor* dh_sum = nullptr;  // optional [C] in w's dtype: Σ over rows of dh, written (=)
};

// a = x + dropout(h), then the norm of a (mean undefined: RMSNorm, and b undefined too):
// a, y, mean, rstd written (=). x and a in w's dtype or acc_dtype(w); h in w's dtype.
void add_layer_norm(const Tensor& x, const Tensor& h, const DropoutSpec& d, const Tensor& w,
                    const Tensor& b, double eps, Tensor& a, Tensor& y, Tensor& mean, Tensor& rstd);

// add_layer_norm with h = xin·wlᵀ + bl made in the same GEMM and never stored (Note [Residual
// add and norm in the epilogue] in kernels/cuda/gemm/norm_epilogue.cuh): xin [M, K], wl [C, K],
// bl optional [C], all in w's 16-bit dtype; x and a fp32 [M, C]. a is add_layer_norm's bit for
// bit given the same product; y, mean and rstd to rounding (the row sums run in another
// order). Returns false, writing nothing, where that kernel does not run (the CPU, other
// GPUs and dtypes, norm_epilogue() or gemm_epilogues() off, unaligned rows): the caller then
// runs the GEMM and add_layer_norm.
bool linear_add_layer_norm(const Tensor& xin, const Tensor& wl, const Tensor& bl, const Tensor& x,
                           const DropoutSpec& d, const Tensor& w, const Tensor& b, double eps,
                           Tensor& a, Tensor& y, Tensor& mean, Tensor& rstd);
void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
                Tensor& mean, Tensor& rstd);
// Any of dx, dw, db may be null (not needed). With accumulate_dx the gradient is added to
// what dx holds (autograd's residual-stream sums, Note [Accumulating backward]).
// With branch (needs dx), branch->dh = dropout_add_backward of the final dx as well.
void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                         const Tensor& rstd, Tensor* dx, Tensor* dw, Tensor* db,
                         bool accumulate_dx = false, const BranchGrad* branch = nullptr);

void rms_norm(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd);
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                       Tensor* dx, Tensor* dw, bool accumulate_dx = false,
                       const BranchGrad* branch = nullptr, bool prescaled = false);

namespace cpu {
void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
                Tensor& mean, Tensor& rstd);
void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                         const Tensor& rstd, Tensor* dx, Tensor* dw, Tensor* db, bool accumulate_dx,
                         bool prescaled = false);
}  // namespace cpu
// The CUDA backend fuses the add (h defined) and the branch gradient (dh set) into its
// register-resident kernels where they run, else runs dropout_add(_backward) beside them.
namespace cuda {
void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
                Tensor& mean, Tensor& rstd, const Tensor& h = {}, const DropoutSpec& d = {},
                Tensor* a = nullptr);
void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                         const Tensor& rstd, Tensor* dx, Tensor* dw, Tensor* db, bool accumulate_dx,
                         Tensor* dh = nullptr, const DropoutSpec& dh_d = {},
                         Tensor* dh_sum = nullptr, bool prescaled = false);
}  // namespace cuda

}  // namespace ffn
