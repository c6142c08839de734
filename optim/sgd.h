// optim/sgd.h — stochastic gradient descent with momentum and weight decay.
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
  std::vector<Tensor> momentum_;
  std::vector<bool> started_;
  SgdHyper hyper_;
  int64_t steps_ = 0;
};

}  // namespace ffn
