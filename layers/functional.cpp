// layers/functional.cpp — the autograd Nodes behind layers/functional.h.
#include "layers/functional.h"

#include "kernels/bias_dropout.h"
#include "kernels/gemm.h"
#include "kernels/mse_loss.h"

namespace ffn::fn {

namespace {

Shape with_last(const Shape& s, int64_t last) {
  Shape out = s;
  out.back() = last;
  return out;
}

class LinearNode final : public Node {
 public:
  const char* name() const override { return "linear"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    const Tensor& x = inputs[0].value();
    const Tensor& w = inputs[1].value();
    const Tensor x2 = x.view_2d(), dy = d_out.view_2d();
    std::vector<Tensor> g(3);
    if (inputs[0].requires_grad()) g[0] = matmul(dy, w).reshape(x.shape());
    if (inputs[1].requires_grad()) g[1] = matmul(dy, x2, {.trans_a = true});
    if (inputs[2].requires_grad()) {
      g[2] = Tensor::empty({w.size(0)}, dy.dtype(), dy.device());
      bias_grad(dy, g[2]);
    }
    return g;
  }
  void release() override {}
};

class DropoutNode final : public Node {
 public:
  explicit DropoutNode(const DropoutSpec& d) : d_(d) {}
  const char* name() const override { return "dropout"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    const Tensor dy = d_out.view_2d();
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    dropout_dbias(dy, d_, &dx, nullptr);
    return {dx.reshape(d_out.shape())};
  }
  void release() override {}

 private:
  DropoutSpec d_;
};

class AddNode final : public Node {
 public:
  const char* name() const override { return "add"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    return {d_out, d_out.clone()};  // Note [Gradient ownership]
  }
  void release() override {}
};

class MseNode final : public Node {
 public:
  explicit MseNode(Tensor target) : target_(std::move(target)) {}
  const char* name() const override { return "mse_loss"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    const Tensor& pred = inputs[0].value();
    Tensor g = Tensor::empty(pred.shape(), pred.dtype(), pred.device());
    mse_loss_backward(pred, target_, d_out, g);
    return {g};
  }
  void release() override { target_ = Tensor(); }

 private:
  Tensor target_;
};

// Inputs: x, w1, b1, w2, b2 (absent ones are undefined Vars). Saves z (Note [FFN saved state]).
class FfnNode final : public Node {
 public:
  FfnNode(const FfnConfig& cfg, const FfnDropout& d, FfnForward saved)
      : cfg_(cfg), d_(d), saved_(std::move(saved)) {
    saved_.y = Tensor();  // the output belongs to the caller
  }
  const char* name() const override { return cfg_.gated ? "gated_feed_forward" : "feed_forward"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    const Tensor& x = inputs[0].value();
    const FfnParams p = params();
    const FfnGrads g =
        ffn_backward(d_out.view_2d(), x.view_2d(), saved_, p, cfg_, d_, inputs[0].requires_grad());
    return {g.dx.defined() ? g.dx.reshape(x.shape()) : Tensor(), g.dw1, g.db1, g.dw2, g.db2};
  }
  void release() override { saved_.z = Tensor(); }
  size_t saved_bytes() const override { return saved_.z.defined() ? saved_.z.nbytes() : 0; }

 private:
  FfnParams params() const {
    auto val = [&](int i) { return inputs[i].defined() ? inputs[i].value() : Tensor(); };
    return FfnParams{val(1), val(2), val(3), val(4)};
  }
  FfnConfig cfg_;
  FfnDropout d_;
  FfnForward saved_;  // z (and whether it includes b1); never y
};

Tensor value_or_empty(const Var& v) {
  return v.defined() ? v.value() : Tensor();
}

}  // namespace

Var linear(const Var& x, const Var& w, const Var& b) {
  const Tensor& xv = x.value();
  const Tensor& wv = w.value();
  check_dim(wv, 2, "linear", "weight");
  FFN_CHECK(xv.dim() >= 1 && xv.size(-1) == wv.size(1),
            "[linear] x.shape[-1]=", xv.dim() ? xv.size(-1) : 0, " != in_features=", wv.size(1),
            " (x.shape=", shape_str(xv.shape()), ", weight.shape=", shape_str(wv.shape()), ")");
  const Tensor y = matmul(xv.view_2d(), wv, {.trans_b = true, .bias = value_or_empty(b)});
  return make_output(y.reshape(with_last(xv.shape(), wv.size(0))), std::make_shared<LinearNode>(),
                     {x, w, b});
}

Var dropout(const Var& x, const DropoutSpec& d) {
  const Tensor& xv = x.value();
  if (xv.dim() == 0) return dropout(Var(xv.reshape({1})), d);
  const Tensor x2 = xv.view_2d();
  Tensor y = Tensor::empty(x2.shape(), x2.dtype(), x2.device());
  bias_dropout(x2, Tensor(), d, y);
  return make_output(y.reshape(xv.shape()), std::make_shared<DropoutNode>(d), {x});
}

Var add(const Var& a, const Var& b) {
  FFN_CHECK(a.shape() == b.shape(), "[add] a.shape=", shape_str(a.shape()),
            " != b.shape=", shape_str(b.shape()));
  check_same_dtype(a.value(), b.value(), "add", "a", "b");
  check_same_device(a.value(), b.value(), "add", "a", "b");
  Tensor y = a.value().clone();
  y.add_(b.value());
  return make_output(y, std::make_shared<AddNode>(), {a, b});
}

Var mse_loss(const Var& pred, const Tensor& target) {
  Tensor loss = Tensor::empty({}, pred.value().dtype(), pred.value().device());
  ffn::mse_loss(pred.value(), target, loss);
  return make_output(loss, std::make_shared<MseNode>(target), {pred});
}

Var ffn(const Var& x, const Var& w1, const Var& b1, const Var& w2, const Var& b2,
        const FfnConfig& cfg, const FfnDropout& d) {
  const Tensor& xv = x.value();
  FFN_CHECK(xv.dim() >= 1, "[ffn] x must have at least one dimension");
  const FfnParams p{value_or_empty(w1), value_or_empty(b1), value_or_empty(w2), value_or_empty(b2)};
  FfnForward f = ffn_forward(xv.view_2d(), p, cfg, d);
  const Tensor y = f.y.reshape(with_last(xv.shape(), f.y.size(1)));
  return make_output(y, std::make_shared<FfnNode>(cfg, d, std::move(f)), {x, w1, b1, w2, b2});
}

}  // namespace ffn::fn
