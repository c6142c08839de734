// kernels/cpu/causal_softmax.cpp — the CPU reference of kernels/causal_softmax.h (plain loops or Eigen,
// sums in f64): what the CPU runs, and the yardstick the CUDA kernels are tested against.
#include "kernels/causal_softmax.h"

#include <cmath>
#include <limits>

#include "core/dispatch.h"
#include "kernels/checks.h"
#include "kernels/cpu/mask.h"

namespace ffn {

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
