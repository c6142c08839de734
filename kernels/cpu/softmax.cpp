// kernels/cpu/softmax.cpp — front door and CPU reference of the causal softmax.
#include "kernels/softmax.h"

#include <cmath>
#include <limits>

#include "core/dispatch.h"
#include "kernels/checks.h"
#include "kernels/cpu/mask.h"

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
#if FFN_WITH_CUDA
    return cuda::causal_softmax(sc, scale, d, p, pd);
#endif
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
#if FFN_WITH_CUDA
    return cuda::causal_softmax_backward(pc, gc, scale, d, ds);
#endif
  }
  cpu::causal_softmax_backward(pc, gc, scale, d, ds);
}

namespace cpu {

void causal_softmax(const Tensor& s, double scale, const DropoutSpec& d, Tensor& p, Tensor* pd) {
  FFN_DISPATCH_FLOAT(s.dtype(), "causal_softmax", [&]<class T>() {
    const int64_t rows = s.size(0) * s.size(1), t = s.size(2);
    const T* x = s.data<T>();
    T* out = p.data<T>();
    T* outd = pd ? pd->data<T>() : nullptr;
    MaskCursor mask(d);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r % t;  // query position
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, scale * x[r * t + j]);
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j) sum += std::exp(scale * x[r * t + j] - mx);
      for (int64_t j = 0; j < t; ++j) {
        const double v = j <= i ? std::exp(scale * x[r * t + j] - mx) / sum : 0.0;
        out[r * t + j] = static_cast<T>(v);
        if (outd)
          outd[r * t + j] = static_cast<T>(
              static_cast<T>(v) * static_cast<T>(mask.factor(static_cast<uint64_t>(r * t + j))));
      }
    }
  });
}

void causal_softmax_backward(const Tensor& p, const Tensor& dpd, double scale,
                             const DropoutSpec& d, Tensor& ds) {
  FFN_DISPATCH_FLOAT(p.dtype(), "causal_softmax_backward", [&]<class T>() {
    const int64_t rows = p.size(0) * p.size(1), t = p.size(2);
    const T* pp = p.data<T>();
    const T* g = dpd.data<T>();
    T* out = ds.data<T>();
    MaskCursor mask(d);
    for (int64_t r = 0; r < rows; ++r) {
      double dot = 0;
      for (int64_t j = 0; j < t; ++j)
        dot += static_cast<double>(g[r * t + j]) * mask.factor(static_cast<uint64_t>(r * t + j)) *
               pp[r * t + j];
      for (int64_t j = 0; j < t; ++j) {
        const double dp =
            static_cast<double>(g[r * t + j]) * mask.factor(static_cast<uint64_t>(r * t + j));
        out[r * t + j] = static_cast<T>(scale * pp[r * t + j] * (dp - dot));
      }
    }
  });
}

}  // namespace cpu
}  // namespace ffn
