// optim/sgd.h — stochastic gradient descent with momentum and weight decay.
//
// Note [Master weights]
// ~~~~~~~~~~~~~~~~~~~~~
// For bf16/f16 parameters the optimizer keeps an fp32 master copy and fp32 state:
// a step casts the 16-bit gradient to fp32, updates the master, and writes the
// master back, rounded once, into the parameter the layers compute with. Updates
// far below the 16-bit spacing of a weight therefore still accumulate. f32/f64
// parameters are updated in place.
#pragma once

#include <vector>

#include "core/autograd.h"
#include "kernels/sgd.h"

namespace ffn {

class SGD {
 public:
  SGD(std::vector<Var> params, const SgdHyper& hyper);
  // Updates every parameter that has a gradient (kernels/sgd.h). Not recorded by autograd.
  void step();
  void zero_grad();
  SgdHyper& hyper() { return hyper_; }
  int64_t steps() const { return steps_; }

 private:
  std::vector<Var> params_;
  std::vector<Tensor> master_;  // fp32 copies of 16-bit parameters (Note [Master weights])
  std::vector<Tensor> momentum_;
  std::vector<bool> started_;
  SgdHyper hyper_;
  int64_t steps_ = 0;
};

}  // namespace ffn
