// kernels/cpu/gemm.cpp — gemm's front door (validation, dispatch) and its Eigen reference.
#include "kernels/gemm.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/dispatch.h"
#include "kernels/activation.h"
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
  FFN_CHECK(is_float(c.dtype()), "[gemm] needs a float dtype, got ", dtype_name(c.dtype()));
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
  auto check_vec = [&](const Tensor& t, const Shape& shape, const char* name) {
    check_shape(t, shape, "gemm", name);
    check_same_device(t, c, "gemm", name, "c");
    check_same_dtype(t, c, "gemm", name, "c");
    FFN_CHECK(t.is_contiguous(), "[gemm] ", name, " must be contiguous");
  };
  if (args.bias.defined()) check_vec(args.bias, {n}, "bias");
  switch (args.epilogue) {
    case GemmEpilogue::none:
      break;
    case GemmEpilogue::gelu_aux_bias:
    case GemmEpilogue::dgelu_bgrad:
      FFN_CHECK(args.beta == 0.0, "[gemm] the GELU epilogues need beta = 0, got ", args.beta);
      check_defined(args.aux, "gemm", "aux");
      check_vec(args.aux, {m, n}, "aux");
      if (args.epilogue == GemmEpilogue::dgelu_bgrad) {
        FFN_CHECK(!args.bias.defined(), "[gemm] dgelu_bgrad takes no bias");
        if (args.bias_grad.defined()) check_vec(args.bias_grad, {n}, "bias_grad");
      }
      break;
    case GemmEpilogue::bgrad_a:
      check_defined(args.bias_grad, "gemm", "bias_grad");
      check_vec(args.bias_grad, {m}, "bias_grad");
      break;
  }
}
}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args) {
  validate(a, b, c, args);
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  if (c.is_cuda()) {
#if FFN_WITH_CUDA
    cuda::gemm(ac, bc, c, args);
    return;
#endif
  }
  cpu::gemm(ac, bc, c, args);
}

namespace {
std::atomic<int> g_autotune{-1};  // -1: not decided yet (read FFN_GEMM_TUNE)
}  // namespace

void set_gemm_autotune(bool on) {
  g_autotune = on ? 1 : 0;
}

bool gemm_autotune() {
  int v = g_autotune.load();
  if (v < 0) {
    const char* e = std::getenv("FFN_GEMM_TUNE");
    v = (e && std::strcmp(e, "0") == 0) ? 0 : 1;
    g_autotune = v;
  }
  return v == 1;
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

void gemm_batched(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args) {
  check_dim(a, 3, "bmm", "a");
  check_dim(b, 3, "bmm", "b");
  check_dim(c, 3, "bmm", "c");
  FFN_CHECK(a.size(0) == b.size(0) && a.size(0) == c.size(0), "[bmm] batch sizes differ: a ",
            shape_str(a.shape()), ", b ", shape_str(b.shape()), ", c ", shape_str(c.shape()));
  FFN_CHECK(!args.bias.defined() && args.epilogue == GemmEpilogue::none,
            "[bmm] batched products take no bias or epilogue");
  FFN_CHECK(c.is_contiguous(), "[bmm] c must be contiguous");
  const int64_t batch = c.size(0);
  if (batch == 0) return;
  // Shapes, dtypes and devices are checked on the first entry (the others are alike).
  Tensor c0 = c.narrow(0, 0, 1).reshape({c.size(1), c.size(2)});
  validate(a.narrow(0, 0, 1).reshape({a.size(1), a.size(2)}),
           b.narrow(0, 0, 1).reshape({b.size(1), b.size(2)}), c0, args);
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  if (c.is_cuda()) {
#if FFN_WITH_CUDA
    cuda::gemm_batched(ac, bc, c, args);
    return;
#endif
  }
  for (int64_t i = 0; i < batch; ++i) {
    Tensor ci = c.narrow(0, i, 1).reshape({c.size(1), c.size(2)});
    cpu::gemm(ac.narrow(0, i, 1).reshape({a.size(1), a.size(2)}),
              bc.narrow(0, i, 1).reshape({b.size(1), b.size(2)}), ci, args);
  }
}

Tensor bmm(const Tensor& a, const Tensor& b, const GemmArgs& args) {
  check_dim(a, 3, "bmm", "a");
  check_dim(b, 3, "bmm", "b");
  const int64_t m = args.trans_a ? a.size(2) : a.size(1);
  const int64_t n = args.trans_b ? b.size(1) : b.size(2);
  Tensor c = Tensor::empty({a.size(0), m, n}, a.dtype(), a.device());
  GemmArgs g = args;
  g.beta = 0.0;
  gemm_batched(a, b, c, g);
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
