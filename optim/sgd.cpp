// optim/sgd.cpp — SGD over a parameter list; momentum buffers are created lazily.
#include "optim/sgd.h"

namespace ffn {

SGD::SGD(std::vector<Var> params, const SgdHyper& hyper)
    : params_(std::move(params)), momentum_(params_.size()), started_(params_.size(), false),
      hyper_(hyper) {
  for (size_t i = 0; i < params_.size(); ++i)
    FFN_CHECK(params_[i].defined() && params_[i].requires_grad(), "[sgd] parameter ", i,
              " is undefined or does not require grad");
}

void SGD::step() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    Var& p = params_[i];
    if (!p.grad().defined()) continue;
    Tensor* buf = nullptr;
    if (hyper_.momentum > 0) {
      if (!momentum_[i].defined())
        momentum_[i] = Tensor::empty(p.value().shape(), p.value().dtype(), p.value().device());
      buf = &momentum_[i];
    }
    sgd_step(p.mutable_value(), p.grad(), buf, hyper_, !started_[i]);
    started_[i] = true;
  }
  ++steps_;
}

void SGD::zero_grad() {
  for (Var& p : params_) p.zero_grad();
}

}  // namespace ffn
