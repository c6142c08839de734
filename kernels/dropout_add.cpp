// kernels/dropout_add.cpp — front door of kernels/dropout_add.h: argument checks, then the
// CPU reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
#include "kernels/dropout_add.h"

#include "core/dispatch.h"
#include "kernels/checks.h"

namespace ffn {

namespace {
// `wide` (res, out, dout) is in y's dtype, or fp32 for a 16-bit y on the GPU.
void check_wide(const Tensor& wide, const Tensor& y, const char* op, const char* name) {
  const bool mixed = wide.dtype() != y.dtype();
  FFN_CHECK(!mixed || (is_half(y.dtype()) && wide.dtype() == acc_dtype(y.dtype()) && y.is_cuda()),
            "[", op, "] ", name, " is ", dtype_name(wide.dtype()), " but y is ",
            dtype_name(y.dtype()), " (", name,
            " may differ only as fp32 with a 16-bit y, on the GPU)");
}
}  // namespace

void dropout_add(const Tensor& res, const Tensor& y, const DropoutSpec& d, Tensor& out) {
  const char* op = "dropout_add";
  detail::check_matrix(y, op, "y");
  FFN_CHECK(is_float(y.dtype()), "[dropout_add] y must be a float tensor, got ",
            dtype_name(y.dtype()));
  detail::check_dropout(d, op);
  check_defined(res, op, "res");
  check_shape(res, y.shape(), op, "res");
  check_same_device(res, y, op, "res", "y");
  check_wide(res, y, op, "res");
  detail::check_like(out, res, y.shape(), op, "out");
  const Tensor rc = res.contiguous(), yc = y.contiguous();
  if (y.is_cuda()) {
    return cuda::dropout_add(rc, yc, d, out);
  }
  cpu::dropout_add(rc, yc, d, out);
}

void dropout_add_backward(const Tensor& dout, const DropoutSpec& d, Tensor& dy) {
  const char* op = "dropout_add_backward";
  detail::check_matrix(dout, op, "dout");
  detail::check_dropout(d, op);
  check_defined(dy, op, "dy");
  check_shape(dy, dout.shape(), op, "dy");
  check_same_device(dy, dout, op, "dy", "dout");
  FFN_CHECK(dy.is_contiguous(), "[dropout_add_backward] dy must be contiguous");
  check_wide(dout, dy, op, "dout");
  const Tensor gc = dout.contiguous();
  if (dout.is_cuda()) {
    return cuda::dropout_add_backward(gc, d, dy);
  }
  cpu::dropout_add_backward(gc, d, dy);
}

}  // namespace ffn
