// kernels/cross_entropy.h — fused softmax + cross-entropy over class logits.
//
//   cross_entropy:           lse_i = log Σ_j exp(logits_ij)
//                            loss  = (1/N) Σ_i (lse_i - logits[i, t_i])              (=)
//   cross_entropy_backward:  d_logits = (exp(logits - lse) - onehot(t)) · d_loss / N  (=)
// logits, d_logits: [N, V]; targets: i32 [N] (an entry outside [0, V) is an error naming
// the position and value); loss and d_loss: [] and lse: [N] in acc_dtype(logits) (f32 for
// 16-bit logits). d_loss is read on the device, so the backward does not synchronize. The
// mean over rows is summed in a fixed order: results are bitwise reproducible.
// check_targets = false skips the range check (a device sync on the GPU); only for targets
// the caller knows are in range.
#pragma once

#include "core/tensor.h"

namespace ffn {

void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                   bool check_targets = true);
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& d_loss, Tensor& d_logits);

namespace cpu {
void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse);
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& d_loss, Tensor& d_logits);
}  // namespace cpu
namespace cuda {
void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse);
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& d_loss, Tensor& d_logits);
}  // namespace cuda

}  // namespace ffn
