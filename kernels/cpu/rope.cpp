// kernels/cpu/rope.cpp — the CPU reference of kernels/rope.h (angles and rotation in f64):
// what the CPU runs, and the yardstick the CUDA kernel is tested against.
#include "kernels/rope.h"

#include <cmath>

#include "core/dispatch.h"

namespace ffn::cpu {

void rope(const Tensor& qkv, int64_t heads, int64_t kv_heads, double base, bool inverse,
          Tensor& out) {
  FFN_DISPATCH_FLOAT(qkv.dtype(), "rope", [&]<class T>() {
    const int64_t b = qkv.size(0), t = qkv.size(1), width = qkv.size(2);
    const int64_t d = width / (heads + 2 * kv_heads), half = d / 2;
    const int64_t rotated = (heads + kv_heads) * d;  // q and k columns
    const T* x = qkv.data<T>();
    T* y = out.data<T>();
    const double sign = inverse ? -1.0 : 1.0;
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t ti = 0; ti < t; ++ti) {
        const int64_t row = (bi * t + ti) * width;
        for (int64_t j = rotated; j < width; ++j) y[row + j] = x[row + j];
        for (int64_t h0 = 0; h0 < rotated; h0 += d)
          for (int64_t i = 0; i < half; ++i) {
            const double theta =
                static_cast<double>(ti) * std::pow(base, -2.0 * static_cast<double>(i) / d);
            const double cs = std::cos(theta), sn = sign * std::sin(theta);
            const double x1 = x[row + h0 + i], x2 = x[row + h0 + i + half];
            y[row + h0 + i] = static_cast<T>(x1 * cs - x2 * sn);
            y[row + h0 + i + half] = static_cast<T>(x2 * cs + x1 * sn);
          }
      }
  });
}

}  // namespace ffn::cpu
