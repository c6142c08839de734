// kernels/cpu/mse_loss.cpp — front door and CPU reference of the MSE loss.
#include "kernels/mse_loss.h"

#include "core/dispatch.h"

namespace ffn {

namespace {
void check_pair(const Tensor& pred, const Tensor& target, const char* op) {
  check_defined(pred, op, "pred");
  check_defined(target, op, "target");
  FFN_CHECK(pred.shape() == target.shape(), "[", op, "] pred.shape=", shape_str(pred.shape()),
            " != target.shape=", shape_str(target.shape()));
  check_same_device(pred, target, op, "pred", "target");
  check_same_dtype(pred, target, op, "pred", "target");
  FFN_CHECK(pred.numel() > 0, "[", op, "] needs at least one element, got shape ",
            shape_str(pred.shape()));
}
}  // namespace

void mse_loss(const Tensor& pred, const Tensor& target, Tensor& loss) {
  check_pair(pred, target, "mse_loss");
  check_defined(loss, "mse_loss", "loss");
  FFN_CHECK(loss.numel() == 1, "[mse_loss] loss must have one element, got ", loss.desc());
  check_same_device(loss, pred, "mse_loss", "loss", "pred");
  check_same_dtype(loss, pred, "mse_loss", "loss", "pred");
  const Tensor p = pred.contiguous(), t = target.contiguous();
  if (pred.is_cuda()) {
#if FFN_WITH_CUDA
    return cuda::mse_loss(p, t, loss);
#endif
  }
  cpu::mse_loss(p, t, loss);
}

void mse_loss_backward(const Tensor& pred, const Tensor& target, const Tensor& d_loss,
                       Tensor& d_pred) {
  check_pair(pred, target, "mse_loss_backward");
  check_defined(d_loss, "mse_loss_backward", "d_loss");
  FFN_CHECK(d_loss.numel() == 1, "[mse_loss_backward] d_loss must have one element, got ",
            d_loss.desc());
  check_same_device(d_loss, pred, "mse_loss_backward", "d_loss", "pred");
  check_same_dtype(d_loss, pred, "mse_loss_backward", "d_loss", "pred");
  check_shape(d_pred, pred.shape(), "mse_loss_backward", "d_pred");
  check_same_dtype(d_pred, pred, "mse_loss_backward", "d_pred", "pred");
  FFN_CHECK(d_pred.is_contiguous(), "[mse_loss_backward] d_pred must be contiguous");
  const Tensor p = pred.contiguous(), t = target.contiguous();
  if (pred.is_cuda()) {
#if FFN_WITH_CUDA
    return cuda::mse_loss_backward(p, t, d_loss, d_pred);
#endif
  }
  cpu::mse_loss_backward(p, t, d_loss, d_pred);
}

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
