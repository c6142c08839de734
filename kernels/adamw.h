// kernels/adamw.h — the fused AdamW step over many tensors at once, and the global
// gradient norm (for clipping and non-finite detection).
//
// For every tensor (PyTorch's AdamW, decoupled weight decay):
//   g  = grad · grad_scale                      (clip coefficient, 1/loss-scale)
//   w  = w · (1 - lr·wd)                        (wd = weight_decay if decay else 0)
//   m  = β1·m + (1-β1)·g;   v = β2·v + (1-β2)·g²
//   w -= lr · (m / (1-β1^t)) / (√(v / (1-β2^t)) + eps)
// w is the fp32 master when one is given (Note [Master weights]); the parameter then
// receives w rounded once. m, v and the master are in acc_dtype(param) and updated in
// place; grad is read. On the GPU one launch covers up to 64 tensors and 2048 blocks
// (pointers passed as kernel parameters), so a whole model's step is a handful of launches.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace ffn {

struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

struct AdamWSlot {
  Tensor param;   // the parameter the layers compute with (updated)
  Tensor grad;    // its gradient (same shape and dtype)
  Tensor master;  // fp32 master copy of a 16-bit param, or undefined
  Tensor m, v;    // state, acc_dtype(param)
  bool decay = true;
};

// step is 1-based (bias correction). All slots live on one device and share a dtype.
void adamw_step(const std::vector<AdamWSlot>& slots, const AdamWHyper& h, int64_t step,
                double grad_scale);
// The same update with step, grad_scale and the learning rate taken from a decision tensor
// written by adamw_decide on the device (the rate from its [7]: h.lr is not used); a step the
// decision skips leaves every tensor untouched.
void adamw_step(const std::vector<AdamWSlot>& slots, const AdamWHyper& h,
                const Tensor& decision);
// Σ over all tensors of Σ g², accumulated in fp32 (f64 for f64) in a fixed order, as a
// one-element tensor on the grads' device (nothing waits for the device); NaN/Inf when any
// entry is non-finite.
Tensor global_grad_sumsq(const std::vector<Tensor>& grads);
// √ of global_grad_sumsq; synchronizes to return the value.
double global_grad_norm(const std::vector<Tensor>& grads);

// Note [Device-side step decision]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Whether a step is applied (loss and gradient norm finite), its clip coefficient and its
// bias corrections are decided by one tiny kernel from device values, so a training step
// never waits for the host to read the loss or the norm (AdamW::finish in optim/adamw.cpp
// reads them through a Readback; the trainer calls it after queueing the next step). The
// decision is an f64 tensor [kDecisionSize]:
//   [0] updates applied so far, this step included (the bias-correction step t)
//   [1] 1 when this step is applied, 0 when skipped   [2] 1-β1^t   [3] 1-β2^t
//   [4] grad scale: 1/grad_divisor, times grad_clip/(norm+1e-6) when norm > grad_clip
//   [5] the loss   [6] the gradient norm √sumsq / grad_divisor   [7] the learning rate
// [0] carries over from step to step (the caller seeds it, e.g. from a checkpoint); [7] is
// written by the caller before each step (AdamW::set_lr), so a step captured into a CUDA
// graph reads each step's rate from the device (Note [CUDA graph step]); the rest is
// rewritten by every adamw_decide. The arithmetic is f64 on both backends, the same
// expressions as the CPU reference.
constexpr int64_t kDecisionSize = 8;
struct AdamWDecide {
  double grad_divisor = 1.0;  // the loss scale (1 without one)
  double grad_clip = 0.0;     // 0 = no clipping
  double beta1 = 0.9, beta2 = 0.999;
};
void adamw_decide(const Tensor& loss, const Tensor& sumsq, const AdamWDecide& d,
                  Tensor& decision);

namespace cpu {
void adamw_step(const std::vector<AdamWSlot>& slots, const AdamWHyper& h, int64_t step,
                double grad_scale);
Tensor global_grad_sumsq(const std::vector<Tensor>& grads);
void adamw_decide(const Tensor& loss, const Tensor& sumsq, const AdamWDecide& d,
                  Tensor& decision);
}  // namespace cpu
namespace cuda {
void adamw_step(const std::vector<AdamWSlot>& slots, const AdamWHyper& h, int64_t step,
                double grad_scale, const double* decision = nullptr);
Tensor global_grad_sumsq(const std::vector<Tensor>& grads);
void adamw_decide(const Tensor& loss, const Tensor& sumsq, const AdamWDecide& d,
                  Tensor& decision);
}  // namespace cuda

}  // namespace ffn
