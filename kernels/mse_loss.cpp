// kernels/mse_loss.cpp — front door of kernels/mse_loss.h: argument checks, then the
// CPU reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
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
    return cuda::mse_loss(p, t, loss);
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
    return cuda::mse_loss_backward(p, t, d_loss, d_pred);
  }
  cpu::mse_loss_backward(p, t, d_loss, d_pred);
}

}  // namespace ffn
