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
// place; grad is read. On the GPU one launch covers up to 24 tensors (pointers passed as
// kernel parameters), so a whole model's step is a handful of launches.
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
// √(Σ over all tensors of Σ g²), accumulated in fp32 (f64 for f64) in a fixed order;
// NaN/Inf when any entry is non-finite. Synchronizes to return the value.
double global_grad_norm(const std::vector<Tensor>& grads);

namespace cpu {
void adamw_step(const std::vector<AdamWSlot>& slots, const AdamWHyper& h, int64_t step,
                double grad_scale);
double global_grad_norm(const std::vector<Tensor>& grads);
}  // namespace cpu
namespace cuda {
void adamw_step(const std::vector<AdamWSlot>& slots, const AdamWHyper& h, int64_t step,
                double grad_scale);
double global_grad_norm(const std::vector<Tensor>& grads);
}  // namespace cuda

}  // namespace ffn
