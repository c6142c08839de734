// kernels/scale.cpp — front door of kernels/scale.h: argument checks, then the CPU reference
// (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
#include "kernels/scale.h"

#include "core/dispatch.h"
#include "kernels/checks.h"

namespace ffn {

namespace {
// x a float matrix; s a contiguous [len] vector of dtype sd on x's device; out x's twin
// (contiguous: the kernels index it flat).
void check_scale(const Tensor& x, const Tensor& s, const Tensor& out, int64_t len, DType sd,
                 const char* op) {
  detail::check_matrix(x, op, "x");
  FFN_CHECK(is_float(x.dtype()), "[", op, "] x must be a float tensor, got ",
            dtype_name(x.dtype()));
  check_defined(s, op, "s");
  check_shape(s, {len}, op, "s");
  check_same_device(s, x, op, "s", "x");
  FFN_CHECK(s.dtype() == sd, "[", op, "] s must be ", dtype_name(sd), " for ",
            dtype_name(x.dtype()), " x, got ", dtype_name(s.dtype()));
  FFN_CHECK(s.is_contiguous(), "[", op, "] s must be contiguous");
  detail::check_like(out, x, x.shape(), op, "out");
  FFN_CHECK(out.is_contiguous(), "[", op, "] out must be contiguous");
}
}  // namespace

void scale_rows(const Tensor& x, const Tensor& s, Tensor& out) {
  const char* op = "scale_rows";
  check_scale(x, s, out, x.dim() == 2 ? x.size(0) : 0, acc_dtype(x.dtype()), op);
  const Tensor xc = x.contiguous();
  if (x.is_cuda()) return cuda::scale_rows(xc, s, out);
  cpu::scale_rows(xc, s, out);
}

void scale_columns(const Tensor& x, const Tensor& s, Tensor& out) {
  const char* op = "scale_columns";
  check_scale(x, s, out, x.dim() == 2 ? x.size(1) : 0, x.dtype(), op);
  const Tensor xc = x.contiguous();
  if (x.is_cuda()) return cuda::scale_columns(xc, s, out);
  cpu::scale_columns(xc, s, out);
}

}  // namespace ffn
