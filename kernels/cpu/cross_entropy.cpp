// kernels/cpu/cross_entropy.cpp — the CPU reference of kernels/cross_entropy.h (plain loops or
// Eigen, sums in f64): what the CPU runs, and the yardstick the CUDA kernels are tested against.
#include "kernels/cross_entropy.h"

#include <cmath>
#include <limits>

#include "core/dispatch.h"
#include "kernels/checks.h"

namespace ffn {

namespace cpu {

void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                   int64_t classes) {
  FFN_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&]<class T>() {
    const int64_t n = logits.size(0), v = logits.size(1), c = classes;
    const T* x = logits.data<T>();
    const int32_t* t = targets.data<int32_t>();
    T* l = lse.data<T>();
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      const T* row = x + i * v;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < c; ++j) mx = std::max(mx, static_cast<double>(row[j]));
      double s = 0;
      for (int64_t j = 0; j < c; ++j) s += std::exp(row[j] - mx);
      const double lsei = mx + std::log(s);
      l[i] = static_cast<T>(lsei);
      total += lsei - row[t[i]];
    }
    *loss.data<T>() = static_cast<T>(total / static_cast<double>(n));
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& d_loss, Tensor& d_logits, int64_t classes) {
  FFN_DISPATCH_FLOAT(logits.dtype(), "cross_entropy_backward", [&]<class T>() {
    const int64_t n = logits.size(0), v = logits.size(1), c = classes;
    const T* x = logits.data<T>();
    const int32_t* t = targets.data<int32_t>();
    const T* l = lse.data<T>();
    const double scale = static_cast<double>(*d_loss.data<T>()) / static_cast<double>(n);
    T* d = d_logits.data<T>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < v; ++j) {
        const double p = j < c ? std::exp(static_cast<double>(x[i * v + j]) - l[i]) : 0.0;
        d[i * v + j] = static_cast<T>((p - (j == t[i] ? 1.0 : 0.0)) * scale);
      }
  });
}

void cross_entropy_rows(Tensor& logits, const Tensor& targets, Tensor& row_loss, int64_t classes,
                        std::optional<double> grad_scale) {
  FFN_DISPATCH_FLOAT(logits.dtype(), "cross_entropy_rows", [&]<class T>() {
    const int64_t n = logits.size(0), v = logits.size(1), c = classes;
    T* x = logits.data<T>();
    const int32_t* t = targets.data<int32_t>();
    T* rl = row_loss.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      T* row = x + i * v;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < c; ++j) mx = std::max(mx, static_cast<double>(row[j]));
      double s = 0;
      for (int64_t j = 0; j < c; ++j) s += std::exp(row[j] - mx);
      const double lse = mx + std::log(s);
      rl[i] = static_cast<T>(lse - row[t[i]]);
      if (!grad_scale) continue;
      for (int64_t j = 0; j < v; ++j) {
        const double p = j < c ? std::exp(static_cast<double>(row[j]) - lse) : 0.0;
        row[j] = static_cast<T>((p - (j == t[i] ? 1.0 : 0.0)) * *grad_scale);
      }
    }
  });
}

void mean_rows(const Tensor& row_loss, Tensor& loss) {
  FFN_DISPATCH_FLOAT(loss.dtype(), "mean_rows", [&]<class T>() {
    const T* r = row_loss.data<T>();
    double total = 0;
    for (int64_t i = 0; i < row_loss.size(0); ++i) total += r[i];
    *loss.data<T>() = static_cast<T>(total / static_cast<double>(row_loss.size(0)));
  });
}

void scale_by(const Tensor& x, const Tensor& s, Tensor& y) {
  FFN_DISPATCH_FLOAT(y.dtype(), "scale_by", [&]<class T>() {
    const double k = static_cast<double>(*s.data<T>());
    const T* in = x.data<T>();  // the CPU has no 16-bit dtypes: x is y's dtype
    T* out = y.data<T>();
    for (int64_t i = 0; i < y.numel(); ++i) out[i] = static_cast<T>(in[i] * k);
  });
}

}  // namespace cpu
}  // namespace ffn
