// kernels/cpu/scale.cpp — the CPU reference of kernels/scale.h (plain loops): what the CPU
// runs, and the yardstick the CUDA kernels are tested against.
#include "kernels/scale.h"

#include "core/dispatch.h"

namespace ffn {

namespace cpu {

void scale_rows(const Tensor& x, const Tensor& s, Tensor& out) {
  FFN_DISPATCH_FLOAT(x.dtype(), "scale_rows", [&]<class T>() {
    const int64_t m = x.size(0), n = x.size(1);
    const T* xp = x.data<T>();
    const T* sp = s.data<T>();
    T* op = out.data<T>();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) op[i * n + j] = xp[i * n + j] * sp[i];
  });
}

void scale_columns(const Tensor& x, const Tensor& s, Tensor& out) {
  FFN_DISPATCH_FLOAT(x.dtype(), "scale_columns", [&]<class T>() {
    const int64_t m = x.size(0), n = x.size(1);
    const T* xp = x.data<T>();
    const T* sp = s.data<T>();
    T* op = out.data<T>();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) op[i * n + j] = xp[i * n + j] * sp[j];
  });
}

}  // namespace cpu
}  // namespace ffn
