// optim/sgd.cpp — SGD over a parameter list; momentum buffers are created lazily.
#include "optim/sgd.h"

namespace ffn {

SGD::SGD(std::vector<Var> params, const SgdHyper& hyper)
    : params_(std::move(params)),
      master_(params_.size()),
      momentum_(params_.size()),
      started_(params_.size(), false),
      hyper_(hyper) {
  for (size_t i = 0; i < params_.size(); ++i) {
    FFN_CHECK(params_[i].defined() && params_[i].requires_grad(), "[sgd] parameter ", i,
              " is undefined or does not require grad");
    if (is_half(params_[i].value().dtype())) master_[i] = params_[i].value().to(DType::f32);
  }
}

void SGD::step() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    Var& p = params_[i];
    if (!p.grad().defined()) continue;
    const bool mixed = master_[i].defined();
    Tensor& w = mixed ? master_[i] : p.mutable_value();
    Tensor* buf = nullptr;
    if (hyper_.momentum > 0) {
      if (!momentum_[i].defined()) momentum_[i] = Tensor::empty(w.shape(), w.dtype(), w.device());
      buf = &momentum_[i];
    }
    sgd_step(w, mixed ? p.grad().to(DType::f32) : p.grad(), buf, hyper_, !started_[i]);
    if (mixed) p.mutable_value().copy_(w);  // round the master once into the compute copy
    started_[i] = true;
  }
  ++steps_;
}

void SGD::zero_grad() {
  for (Var& p : params_) p.zero_grad();
}

}  // namespace ffn
