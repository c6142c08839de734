// kernels/cpu/gemm.cpp — gemm's front door (validation, dispatch) and its Eigen reference.
#include "kernels/gemm.h"

#include "core/dispatch.h"
#include "kernels/cpu/eigen.h"

namespace ffn {

namespace {
void validate(const Tensor& a, const Tensor& b, const Tensor& c, const GemmArgs& args) {
  check_defined(a, "gemm", "a");
  check_defined(b, "gemm", "b");
  check_defined(c, "gemm", "c");
  check_dim(a, 2, "gemm", "a");
  check_dim(b, 2, "gemm", "b");
  check_dim(c, 2, "gemm", "c");
  check_same_device(a, b, "gemm", "a", "b");
  check_same_device(a, c, "gemm", "a", "c");
  check_same_dtype(a, b, "gemm", "a", "b");
  check_same_dtype(a, c, "gemm", "a", "c");
  const int64_t m = args.trans_a ? a.size(1) : a.size(0);
  const int64_t k = args.trans_a ? a.size(0) : a.size(1);
  const int64_t kb = args.trans_b ? b.size(1) : b.size(0);
  const int64_t n = args.trans_b ? b.size(0) : b.size(1);
  FFN_CHECK(k == kb, "[gemm] inner dimensions differ: op(a) is [", m, ", ", k,
            "] (a.shape=", shape_str(a.shape()), (args.trans_a ? ", transposed" : ""),
            ") but op(b) is [", kb, ", ", n, "] (b.shape=", shape_str(b.shape()),
            (args.trans_b ? ", transposed" : ""), ")");
  FFN_CHECK(c.size(0) == m && c.size(1) == n, "[gemm] c.shape=", shape_str(c.shape()),
            " but op(a)·op(b) is [", m, ", ", n, "]");
  FFN_CHECK(c.is_contiguous(), "[gemm] c must be contiguous");
  if (args.bias.defined()) {
    check_shape(args.bias, {n}, "gemm", "bias");
    check_same_device(args.bias, c, "gemm", "bias", "c");
    check_same_dtype(args.bias, c, "gemm", "bias", "c");
  }
}
}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args) {
  validate(a, b, c, args);
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  GemmArgs cargs = args;
  if (cargs.bias.defined()) cargs.bias = cargs.bias.contiguous();
  if (c.is_cuda()) {
#if FFN_WITH_CUDA
    cuda::gemm(ac, bc, c, cargs);
    return;
#endif
  }
  cpu::gemm(ac, bc, c, cargs);
}

Tensor matmul(const Tensor& a, const Tensor& b, const GemmArgs& args) {
  check_dim(a, 2, "matmul", "a");
  check_dim(b, 2, "matmul", "b");
  const int64_t m = args.trans_a ? a.size(1) : a.size(0);
  const int64_t n = args.trans_b ? b.size(0) : b.size(1);
  Tensor c = Tensor::empty({m, n}, a.dtype(), a.device());
  GemmArgs g = args;
  g.beta = 0.0;
  gemm(a, b, c, g);
  return c;
}

namespace cpu {

void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args) {
  FFN_DISPATCH_FLOAT(c.dtype(), "gemm", [&]<class T>() {
    auto A = as_cmatrix<T>(a);
    auto B = as_cmatrix<T>(b);
    auto C = as_matrix<T>(c);
    const T alpha = static_cast<T>(args.alpha), beta = static_cast<T>(args.beta);
    MatRM<T> prod;
    if (!args.trans_a && !args.trans_b)
      prod.noalias() = A * B;
    else if (args.trans_a && !args.trans_b)
      prod.noalias() = A.transpose() * B;
    else if (!args.trans_a && args.trans_b)
      prod.noalias() = A * B.transpose();
    else
      prod.noalias() = A.transpose() * B.transpose();
    if (beta == T(0))
      C = alpha * prod;  // beta = 0 ignores C (it may hold NaN garbage)
    else
      C = alpha * prod + beta * C;
    if (args.bias.defined()) {
      const T* bias = args.bias.data<T>();
      for (int64_t i = 0; i < C.rows(); ++i)
        for (int64_t j = 0; j < C.cols(); ++j) C(i, j) += bias[j];
    }
  });
}

}  // namespace cpu
}  // namespace ffn
