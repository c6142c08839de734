// kernels/mse_loss.h — mean squared error, the regression loss of tests and the demo.
//
//   forward:  loss   = Σ (pred - target)² / N         loss: shape [] (one element)
//   backward: d_pred = d_loss · 2 (pred - target) / N  (=)
// d_loss is a one-element tensor on the same device (no host round trip).
// The sum is accumulated in double on the CPU and in a fixed order on the GPU.
#pragma once

#include "core/tensor.h"

namespace ffn {

void mse_loss(const Tensor& pred, const Tensor& target, Tensor& loss);
void mse_loss_backward(const Tensor& pred, const Tensor& target, const Tensor& d_loss,
                       Tensor& d_pred);

namespace cpu {
void mse_loss(const Tensor& pred, const Tensor& target, Tensor& loss);
void mse_loss_backward(const Tensor& pred, const Tensor& target, const Tensor& d_loss,
                       Tensor& d_pred);
}  // namespace cpu
namespace cuda {
void mse_loss(const Tensor& pred, const Tensor& target, Tensor& loss);
void mse_loss_backward(const Tensor& pred, const Tensor& target, const Tensor& d_loss,
                       Tensor& d_pred);
}  // namespace cuda

}  // namespace ffn
