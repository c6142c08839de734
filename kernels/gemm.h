// kernels/gemm.h — matrix products, the FLOP-heavy half of every layer.
//
//   c = alpha · op(a) · op(b) + beta · c  (+ bias broadcast over rows, if given)
// op(x) = xᵀ when the matching trans flag is set. All tensors 2-D and
// row-major; a and b may be any (contiguous) views, c must be contiguous. c is
// overwritten when beta = 0 and accumulated into (+=) otherwise.
// CPU: Eigen, f64/f32. CUDA: cuBLASLt, f32/bf16/f16 with fp32 accumulation
// (bias through the BIAS epilogue).
#pragma once

#include "core/tensor.h"

namespace ffn {

struct GemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  double alpha = 1.0;
  double beta = 0.0;
  Tensor bias;  // optional, shape [c.cols]
};

void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args = {});

// Allocating convenience: returns op(a)·op(b) (+ bias).
Tensor matmul(const Tensor& a, const Tensor& b, const GemmArgs& args = {});

namespace cpu {
void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args);
}
namespace cuda {
void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args);
}

}  // namespace ffn
