// kernels/cross_entropy.h — fused softmax + cross-entropy over class logits.
//
//   cross_entropy:           lse_i = log Σ_{j<C} exp(logits_ij)
//                            loss  = (1/N) Σ_i (lse_i - logits[i, t_i])              (=)
//   cross_entropy_backward:  d_logits = (exp(logits - lse) - onehot(t)) · d_loss / N  (=)
//                            for j < C, 0 for j ≥ C (C = classes, below)
// logits, d_logits: [N, V]; targets: i32 [N] (an entry outside [0, V) is an error naming
// the position and value); loss and d_loss: [] and lse: [N] in acc_dtype(logits) (f32 for
// 16-bit logits). d_loss is read on the device, so the backward does not synchronize. The
// mean over rows is summed in a fixed order: results are bitwise reproducible.
// check_targets = false skips the range check (a device sync on the GPU); only for targets
// the caller knows are in range.
// classes > 0: only the first `classes` columns are classes (Note [Padded vocabulary]); the
// others are padding: left out of the softmax, d_logits 0 there, a target there is an error.
// 0: every column is a class.
//
// The fused classifier's pieces (fn::linear_cross_entropy, Note [Fused classifier]):
//   cross_entropy_rows:  row_loss[i] = lse_i - logits[i, t_i]; with a grad_scale, logits is
//                        then overwritten in place by (softmax(logits_i) - onehot(t_i)) ·
//                        grad_scale (0 in padding columns): the forward and the backward
//                        in one read of the row, and no second [N, V] buffer.
//   mean_rows:           loss = (1/n) Σ_i row_loss[i], summed in a fixed order.
//   scale_by:            y = x · s, s a one-element tensor in acc_dtype(y) read on the device
//                        (no sync): the classifier's gradients, made in the forward for
//                        d_loss = 1, times the d_loss that backward brings. x is y's dtype or
//                        acc_dtype(y); y may be x (then s = 1 exactly writes nothing).
#pragma once

#include <optional>

#include "core/tensor.h"

namespace ffn {

void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                   bool check_targets = true, int64_t classes = 0);
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& d_loss, Tensor& d_logits, int64_t classes = 0);
void cross_entropy_rows(Tensor& logits, const Tensor& targets, Tensor& row_loss, bool check_targets,
                        int64_t classes, std::optional<double> grad_scale = std::nullopt);
void mean_rows(const Tensor& row_loss, Tensor& loss);
void scale_by(const Tensor& x, const Tensor& s, Tensor& y);

// The backends take classes in [1, V].
namespace cpu {
void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                   int64_t classes);
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& d_loss, Tensor& d_logits, int64_t classes);
void cross_entropy_rows(Tensor& logits, const Tensor& targets, Tensor& row_loss, int64_t classes,
                        std::optional<double> grad_scale);
void mean_rows(const Tensor& row_loss, Tensor& loss);
void scale_by(const Tensor& x, const Tensor& s, Tensor& y);
}  // namespace cpu
namespace cuda {
void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                   int64_t classes);
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& d_loss, Tensor& d_logits, int64_t classes);
void cross_entropy_rows(Tensor& logits, const Tensor& targets, Tensor& row_loss, int64_t classes,
                        std::optional<double> grad_scale);
void mean_rows(const Tensor& row_loss, Tensor& loss);
void scale_by(const Tensor& x, const Tensor& s, Tensor& y);
}  // namespace cuda

}  // namespace ffn
