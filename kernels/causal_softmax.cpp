// kernels/causal_softmax.cpp — front door of kernels/causal_softmax.h: argument checks, then the
// CPU reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
#include "kernels/causal_softmax.h"

#include <cmath>
#include <limits>

#include "core/dispatch.h"
#include "kernels/checks.h"

namespace ffn {

namespace {
void check_scores(const Tensor& s, const char* op, const char* name) {
  check_defined(s, op, name);
  check_dim(s, 3, op, name);
  FFN_CHECK(s.size(1) == s.size(2), "[", op, "] ", name, " must be [B, T, T], got ",
            shape_str(s.shape()));
  FFN_CHECK(is_float(s.dtype()), "[", op, "] ", name, " must be a float tensor");
}
}  // namespace

void causal_softmax(const Tensor& s, double scale, const DropoutSpec& d, Tensor& p, Tensor* pd) {
  check_scores(s, "causal_softmax", "s");
  detail::check_dropout(d, "causal_softmax");
  FFN_CHECK(std::isfinite(scale), "[causal_softmax] scale must be finite, got ", scale);
  detail::check_like(p, s, s.shape(), "causal_softmax", "p");
  if (pd) detail::check_like(*pd, s, s.shape(), "causal_softmax", "pd");
  const Tensor sc = s.contiguous();
  if (s.is_cuda()) {
    return cuda::causal_softmax(sc, scale, d, p, pd);
  }
  cpu::causal_softmax(sc, scale, d, p, pd);
}

void causal_softmax_backward(const Tensor& p, const Tensor& dpd, double scale,
                             const DropoutSpec& d, Tensor& ds) {
  check_scores(p, "causal_softmax_backward", "p");
  detail::check_dropout(d, "causal_softmax_backward");
  check_defined(dpd, "causal_softmax_backward", "dpd");
  check_shape(dpd, p.shape(), "causal_softmax_backward", "dpd");
  check_same_dtype(dpd, p, "causal_softmax_backward", "dpd", "p");
  check_same_device(dpd, p, "causal_softmax_backward", "dpd", "p");
  detail::check_like(ds, p, p.shape(), "causal_softmax_backward", "ds");
  const Tensor pc = p.contiguous(), gc = dpd.contiguous();
  if (p.is_cuda()) {
    return cuda::causal_softmax_backward(pc, gc, scale, d, ds);
  }
  cpu::causal_softmax_backward(pc, gc, scale, d, ds);
}

}  // namespace ffn
