// kernels/scale.h — a matrix scaled by a vector along its rows or its columns (one stem): the
// two diagonal products Note [RMSNorm folded into the QKV GEMM] (layers/attention.cpp) needs
// around the GEMMs it moves the norm into.
//
//   scale_rows:     out_ij = x_ij·s_i        x, out: [M, N];  s: [M]                    (=)
//   scale_columns:  out_ij = x_ij·s_j        x, out: [M, N];  s: [N]                    (=)
// x and out share a dtype; s is in acc_dtype(x) (fp32 for 16-bit x) for scale_rows (a row's
// statistic, e.g. RMSNorm's rstd) and in x's dtype for scale_columns (a weight vector, e.g.
// RMSNorm's gain). Each product is computed in acc_dtype(x) and rounded once to x's dtype,
// so the CUDA kernels equal the CPU reference bit for bit in f32 and f64. out may be x
// (in place).
#pragma once

#include "core/tensor.h"

namespace ffn {

void scale_rows(const Tensor& x, const Tensor& s, Tensor& out);
void scale_columns(const Tensor& x, const Tensor& s, Tensor& out);

namespace cpu {
void scale_rows(const Tensor& x, const Tensor& s, Tensor& out);
void scale_columns(const Tensor& x, const Tensor& s, Tensor& out);
}  // namespace cpu
namespace cuda {
void scale_rows(const Tensor& x, const Tensor& s, Tensor& out);
void scale_columns(const Tensor& x, const Tensor& s, Tensor& out);
}  // namespace cuda

}  // namespace ffn
