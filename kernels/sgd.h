// kernels/sgd.h — one SGD step on one parameter tensor (PyTorch's SGD semantics).
//
//   g'  = g + weight_decay · w
//   buf = g'  (first step)  or  momentum · buf + g'           (only when momentum > 0)
//   w  -= lr · (nesterov ? g' + momentum · buf : buf)          (buf = g' without momentum)
// w and buf are updated in place; g is read.
#pragma once

#include "core/tensor.h"

namespace ffn {

struct SgdHyper {
  double lr = 1e-2;
  double momentum = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// `buf` may be null when momentum == 0. `first_step` initializes buf from g'.
void sgd_step(Tensor& w, const Tensor& g, Tensor* buf, const SgdHyper& h, bool first_step);

namespace cpu {
void sgd_step(Tensor& w, const Tensor& g, Tensor* buf, const SgdHyper& h, bool first_step);
}
namespace cuda {
void sgd_step(Tensor& w, const Tensor& g, Tensor* buf, const SgdHyper& h, bool first_step);
}

}  // namespace ffn
