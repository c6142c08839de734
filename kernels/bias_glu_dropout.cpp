// kernels/bias_glu_dropout.cpp — front door of kernels/bias_glu_dropout.h: argument checks, then the
// CPU reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
#include "kernels/bias_glu_dropout.h"

#include <vector>

#include "core/dispatch.h"
#include "kernels/checks.h"

namespace ffn {

namespace {
int64_t half_width(const Tensor& z, const char* op) {
  FFN_CHECK(z.size(1) % 2 == 0, "[", op, "] z.shape[-1]=", z.size(1),
            " must be even ([value | gate] halves)");
  return z.size(1) / 2;
}
}  // namespace

void bias_glu_dropout(const Tensor& z, const Tensor& b, Activation act, const DropoutSpec& d,
                      Tensor& out) {
  const char* op = "bias_glu_dropout";
  detail::check_matrix(z, op, "z");
  detail::check_dropout(d, op);
  const int64_t h = half_width(z, op);
  if (b.defined()) detail::check_like(b, z, {2 * h}, op, "b");
  detail::check_like(out, z, {z.size(0), h}, op, "out");
  const Tensor zc = z.contiguous(), bc = b.defined() ? b.contiguous() : b;
  if (z.is_cuda()) {
    return cuda::bias_glu_dropout(zc, bc, act, d, out);
  }
  cpu::bias_glu_dropout(zc, bc, act, d, out);
}

void bias_glu_dropout_backward(const Tensor& dout, const Tensor& z, const Tensor& b, Activation act,
                        const DropoutSpec& d, Tensor& dz, Tensor* db, Tensor* out) {
  const char* op = "bias_glu_dropout_backward";
  detail::check_matrix(z, op, "z");
  detail::check_dropout(d, op);
  const int64_t h = half_width(z, op);
  detail::check_like(dout, z, {z.size(0), h}, op, "dout");
  if (b.defined()) detail::check_like(b, z, {2 * h}, op, "b");
  detail::check_like(dz, z, z.shape(), op, "dz");
  if (db) detail::check_like(*db, z, {2 * h}, op, "db");
  if (out) detail::check_like(*out, z, {z.size(0), h}, op, "out");
  const Tensor zc = z.contiguous(), gc = dout.contiguous(), bc = b.defined() ? b.contiguous() : b;
  if (z.is_cuda()) {
    return cuda::bias_glu_dropout_backward(gc, zc, bc, act, d, dz, db, out);
  }
  cpu::bias_glu_dropout_backward(gc, zc, bc, act, d, dz, db, out);
}

}  // namespace ffn
