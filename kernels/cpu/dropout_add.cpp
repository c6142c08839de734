// kernels/cpu/dropout_add.cpp — the CPU reference of kernels/dropout_add.h (plain loops or Eigen,
// sums in f64): what the CPU runs, and the yardstick the CUDA kernels are tested against.
#include "kernels/dropout_add.h"

#include "core/dispatch.h"
#include "kernels/checks.h"
#include "kernels/cpu/mask.h"

namespace ffn {

namespace cpu {

void dropout_add(const Tensor& res, const Tensor& y, const DropoutSpec& d, Tensor& out) {
  FFN_DISPATCH_FLOAT(y.dtype(), "dropout_add", [&]<class T>() {
    const int64_t n = y.numel();
    const T* rp = res.data<T>();
    const T* yp = y.data<T>();
    T* op = out.data<T>();
    MaskCursor mask(d);
    for (int64_t i = 0; i < n; ++i) {
      const T v = yp[i] * static_cast<T>(mask.factor(static_cast<uint64_t>(i)));
      op[i] = rp[i] + v;
    }
  });
}

void dropout_add_backward(const Tensor& dout, const DropoutSpec& d, Tensor& dy) {
  FFN_DISPATCH_FLOAT(dy.dtype(), "dropout_add_backward", [&]<class T>() {
    const int64_t n = dy.numel();
    const T* g = dout.data<T>();
    T* out = dy.data<T>();
    MaskCursor mask(d);
    for (int64_t i = 0; i < n; ++i)
      out[i] = g[i] * static_cast<T>(mask.factor(static_cast<uint64_t>(i)));
  });
}

}  // namespace cpu
}  // namespace ffn
