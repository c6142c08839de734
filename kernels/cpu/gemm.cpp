// kernels/cpu/gemm.cpp — the CPU reference of kernels/gemm.h (plain loops or Eigen,
// sums in f64): what the CPU runs, and the yardstick the CUDA kernels are tested against.
#include "kernels/gemm.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/dispatch.h"
#include "kernels/activation.h"
#include "kernels/cpu/eigen.h"

namespace ffn {

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
    switch (args.epilogue) {
      case GemmEpilogue::none:
        break;
      case GemmEpilogue::gelu_aux_bias: {
        as_matrix<T>(args.aux) = C;
        for (int64_t i = 0; i < C.rows(); ++i)
          for (int64_t j = 0; j < C.cols(); ++j)
            C(i, j) = act_math::value(C(i, j), Activation::gelu_tanh);
        break;
      }
      case GemmEpilogue::dgelu_bgrad: {
        auto aux = as_cmatrix<T>(args.aux);
        std::vector<double> acc(C.cols(), 0.0);
        for (int64_t i = 0; i < C.rows(); ++i)
          for (int64_t j = 0; j < C.cols(); ++j) {
            C(i, j) *= act_math::grad(aux(i, j), Activation::gelu_tanh);
            acc[j] += static_cast<double>(C(i, j));
          }
        if (args.bias_grad.defined())
          for (int64_t j = 0; j < C.cols(); ++j)
            args.bias_grad.data<T>()[j] = static_cast<T>(acc[j]);
        break;
      }
      case GemmEpilogue::bgrad_a: {  // the rows of op(a), summed along k
        T* out = args.bias_grad.data<T>();
        const int64_t k = args.trans_a ? A.rows() : A.cols();
        for (int64_t i = 0; i < C.rows(); ++i) {
          double sum = 0;
          for (int64_t p = 0; p < k; ++p)
            sum += static_cast<double>(args.trans_a ? A(p, i) : A(i, p));
          out[i] = static_cast<T>(sum);
        }
        break;
      }
    }
  });
}

}  // namespace cpu
}  // namespace ffn
