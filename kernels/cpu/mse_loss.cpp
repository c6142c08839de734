// kernels/cpu/mse_loss.cpp — the CPU reference of kernels/mse_loss.h (plain loops or Eigen,
// sums in f64): what the CPU runs, and the yardstick the CUDA kernels are tested against.
#include "kernels/mse_loss.h"

#include "core/dispatch.h"

namespace ffn {

namespace cpu {

void mse_loss(const Tensor& pred, const Tensor& target, Tensor& loss) {
  FFN_DISPATCH_FLOAT(pred.dtype(), "mse_loss", [&]<class T>() {
    const T* p = pred.data<T>();
    const T* t = target.data<T>();
    const int64_t n = pred.numel();
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double e = static_cast<double>(p[i]) - static_cast<double>(t[i]);
      acc += e * e;
    }
    *loss.data<T>() = static_cast<T>(acc / static_cast<double>(n));
  });
}

void mse_loss_backward(const Tensor& pred, const Tensor& target, const Tensor& d_loss,
                       Tensor& d_pred) {
  FFN_DISPATCH_FLOAT(pred.dtype(), "mse_loss_backward", [&]<class T>() {
    const T* p = pred.data<T>();
    const T* t = target.data<T>();
    T* g = d_pred.data<T>();
    const int64_t n = pred.numel();
    const T k = *d_loss.data<T>() * T(2) / static_cast<T>(n);
    for (int64_t i = 0; i < n; ++i) g[i] = k * (p[i] - t[i]);
  });
}

}  // namespace cpu
}  // namespace ffn
