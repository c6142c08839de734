// layers/functional.cpp — the autograd Nodes behind layers/functional.h (the fused FFN block's:
// layers/ffn_nodes.cpp).
#include "layers/functional.h"

#include "kernels/bias_act_dropout.h"
#include "kernels/checks.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout_add.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/layer_norm.h"
#include "kernels/mse_loss.h"
#include "kernels/rope.h"
#include "layers/branch_bias_grad.h"

namespace ffn::fn {

namespace {

Shape with_last(const Shape& s, int64_t last) {
  Shape out = s;
  out.back() = last;
  return out;
}

// The [rows, last] view the elementwise kernels take; a scalar is [1, 1].
Tensor as_2d(const Tensor& t) {
  return t.dim() == 0 ? t.reshape({1, 1}) : t.view_2d();
}

class LinearNode final : public Node, public BranchBiasGrad {
 public:
  const char* name() const override { return "linear"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    const Tensor& x = inputs[0].value();
    const Tensor& w = inputs[1].value();
    const Tensor x2 = x.view_2d(), dy = d_out.view_2d();
    std::vector<Tensor> g(3);
    if (inputs[0].requires_grad()) g[0] = matmul(dy, w).reshape(x.shape());
    // The bias gradient as a column-sum pass of its own beside the weight gradient: on an
    // H100 that pass plus the bare GEMM beat cuBLASLt's BGRADB epilogue (a kernel of its own
    // too) at GPT-2's qkv, proj and fc2 shapes (bench/RESULTS-2026-11-24-s14-16.md, session 14); or
    // summed by the norm's backward that wrote dy (Note [Branch bias gradient]).
    const bool with_dw = inputs[1].requires_grad(), with_db = inputs[2].requires_grad();
    const Tensor given = take_given_db(dy);
    if (with_db)
      g[2] = given.defined() ? given : Tensor::empty({w.size(0)}, dy.dtype(), dy.device());
    if (with_dw) g[1] = matmul(dy, x2, {.trans_a = true});
    if (with_db && !given.defined()) bias_grad(dy, g[2]);
    return g;
  }
  void release() override { forget_given_db(); }
  bool wants_bias_grad_of_output() const override {
    return inputs[2].defined() && inputs[2].requires_grad();
  }
};

class DropoutNode final : public Node {
 public:
  explicit DropoutNode(const DropoutSpec& d) : d_(d) {}
  const char* name() const override { return "dropout"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    const Tensor dy = as_2d(d_out);
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    bias_dropout_backward(dy, d_, &dx, nullptr);
    return {dx.reshape(d_out.shape())};
  }
  void release() override {}

 private:
  DropoutSpec d_;
};

class DropoutAddNode final : public Node {
 public:
  explicit DropoutAddNode(const DropoutSpec& d) : d_(d) {}
  const char* name() const override { return "dropout_add"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    const Tensor& y = inputs[1].value();
    Tensor dy;
    if (inputs[1].requires_grad()) {
      const bool from_norm = branch_.defined() && d_out.data_ptr() == branch_src_;
      // Note [Branch bias gradient]: h's producer gets exactly dh only if nothing else feeds h.
      const bool alone = sums.size() > 1 && sums[1] == nullptr && sums_final[1];
      if (!(from_norm && alone))
        if (auto* maker = dynamic_cast<BranchBiasGrad*>(inputs[1].grad_fn().get()))
          maker->withdraw_bias_grad_of_output();
      if (from_norm) {
        dy = branch_;  // the norm's backward computed it (Note [Residual add and norm])
      } else {
        dy = Tensor::empty(y.shape(), y.dtype(), y.device());
        Tensor dy2 = as_2d(dy);
        dropout_add_backward(as_2d(d_out), d_, dy2);
      }
    }
    const DType dr = inputs[0].value().dtype();
    return {dr == d_out.dtype() ? d_out : d_out.to(dr), dy};  // Note [Gradient ownership]
  }
  void release() override { branch_ = Tensor(); }

  // For the norm that reads this add's output: whether it should write the branch gradient,
  // and where. `src` is the final gradient sum it was derived from (the d_out to expect).
  bool wants_branch_grad() const { return inputs[1].requires_grad(); }
  const DropoutSpec& spec() const { return d_; }
  void set_branch_grad(Tensor dy, const void* src) {
    branch_ = std::move(dy);
    branch_src_ = src;
  }

 private:
  DropoutSpec d_;
  Tensor branch_;
  const void* branch_src_ = nullptr;
};

class AddNode final : public Node {
 public:
  const char* name() const override { return "add"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    // Each input gets the gradient in its own dtype (mixed adds: fp32 stream + 16-bit branch).
    const DType da = inputs[0].value().dtype(), db = inputs[1].value().dtype();
    Tensor gb = db == d_out.dtype() ? d_out.clone() : d_out.to(db);  // Note [Gradient ownership]
    Tensor ga = da == d_out.dtype() ? d_out : d_out.to(da);
    return {ga, gb};
  }
  void release() override {}
};

class CastNode final : public Node {
 public:
  const char* name() const override { return "cast"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    return {d_out.to(inputs[0].value().dtype())};
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

// The table's gradient goes into what the engine already summed for it when there is such a
// sum (a tied LM head's, Note [Accumulating backward]): no zeroed table, no separate add.
Tensor table_grad(const Node& node, const Tensor& ids, const Tensor& d2) {
  const Tensor& table = node.inputs[0].value();
  Tensor* sum = node.sums.empty() ? nullptr : node.sums[0];
  if (sum && sum->dtype() == table.dtype() && sum->shape() == table.shape() &&
      sum->is_contiguous()) {
    // The forward checked these ids (or its caller vouched for them): no second check.
    embedding_backward(ids, d2, *sum, /*check_ids=*/false, /*accumulate=*/true);
    return Tensor();
  }
  Tensor d = Tensor::empty(table.shape(), table.dtype(), table.device());
  embedding_backward(ids, d2, d, /*check_ids=*/false);
  return d;
}

class EmbeddingNode final : public Node {
 public:
  explicit EmbeddingNode(Tensor ids) : ids_(std::move(ids)) {}
  const char* name() const override { return "embedding"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    return {table_grad(*this, ids_, d_out.reshape({ids_.numel(), inputs[0].value().size(1)}))};
  }
  void release() override { ids_ = Tensor(); }

 private:
  Tensor ids_;  // flattened
};

// inputs: table and pos (maybe undefined). Note [Embeddings in one pass].
class EmbeddingSumNode final : public Node {
 public:
  EmbeddingSumNode(Tensor ids, int64_t t) : ids_(std::move(ids)), t_(t) {}
  const char* name() const override { return "embedding_sum"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    const Tensor d2 = d_out.reshape({ids_.numel(), inputs[0].value().size(1)});
    std::vector<Tensor> g(2);
    if (inputs[0].requires_grad()) g[0] = table_grad(*this, ids_, d2);
    if (inputs[1].defined() && inputs[1].requires_grad()) {
      const Tensor& pos = inputs[1].value();
      g[1] = Tensor::empty(pos.shape(), pos.dtype(), pos.device());
      position_grad(d2, t_, g[1]);
    }
    return g;
  }
  void release() override { ids_ = Tensor(); }

 private:
  Tensor ids_;  // flattened
  int64_t t_;
};

// LayerNorm, or RMSNorm when there is no mean (inputs x, w and an undefined b).
class LayerNormNode final : public Node {
 public:
  // prescaled (RMSNorm only): the d_out it is given is rstd ⊙ dy (kernels/layer_norm.h), as
  // the folded norm's consumer makes it (Note [RMSNorm folded into the QKV GEMM]).
  LayerNormNode(Tensor mean, Tensor rstd, bool prescaled = false)
      : rms_(!mean.defined()),
        prescaled_(prescaled),
        mean_(std::move(mean)),
        rstd_(std::move(rstd)) {}
  const char* name() const override { return rms_ ? "rms_norm" : "layer_norm"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    const Tensor& x = inputs[0].value();
    const Tensor& w = inputs[1].value();
    const Tensor x2 = x.view_2d();
    std::vector<Tensor> g(3);
    Tensor dx, dw, db;
    // Add dx straight into the sum the engine already holds for x when there is one (the
    // residual stream; Note [Accumulating backward]): no separate gradient-sum pass.
    const Tensor* sum = sums.empty() ? nullptr : sums[0];
    const bool into_sum = inputs[0].requires_grad() && sum && sum->dtype() == x.dtype() &&
                          sum->shape() == x.shape() && sum->is_contiguous();
    if (into_sum)
      dx = sum->view_2d();
    else if (inputs[0].requires_grad())
      dx = Tensor::empty(x2.shape(), x.dtype(), x.device());
    if (inputs[1].requires_grad()) dw = Tensor::empty(w.shape(), w.dtype(), w.device());
    if (inputs[2].defined() && inputs[2].requires_grad())
      db = Tensor::empty(w.shape(), w.dtype(), w.device());
    // x = res + dropout(h) and this sum is final: the add's branch gradient comes out of the
    // same pass (Note [Residual add and norm]). Also where dx is all of x's gradient and
    // written fresh (no sum yet, no node left that feeds x: the last block's add before the
    // final norm); the add then gets dx itself as its d_out.
    auto* add = dx.defined() && !sums_final.empty() && sums_final[0] && (into_sum || !sum)
                    ? dynamic_cast<DropoutAddNode*>(inputs[0].grad_fn().get())
                    : nullptr;
    Tensor dh;
    BranchGrad branch;
    if (add && add->wants_branch_grad() && add->inputs[1].value().dtype() == w.dtype()) {
      const Tensor& h = add->inputs[1].value();
      dh = Tensor::empty(h.shape(), h.dtype(), h.device());
      branch.d = add->spec();
    }
    Tensor dh2 = dh.defined() ? dh.view_2d() : Tensor();
    branch.dh = &dh2;
    // Note [Branch bias gradient]: the bias gradient of the layer that made h, in this pass.
    auto* maker =
        dh.defined() ? dynamic_cast<BranchBiasGrad*>(add->inputs[1].grad_fn().get()) : nullptr;
    Tensor dh_sum;
    if (maker && maker->wants_bias_grad_of_output() && dh.dim() >= 1 && dh.size(-1) == w.numel()) {
      dh_sum = Tensor::empty(w.shape(), w.dtype(), w.device());
      branch.dh_sum = &dh_sum;
    }
    const BranchGrad* br = dh.defined() ? &branch : nullptr;
    if (rms_)
      rms_norm_backward(d_out.view_2d(), x2, w, rstd_, dx.defined() ? &dx : nullptr,
                        dw.defined() ? &dw : nullptr, into_sum, br, prescaled_);
    else
      layer_norm_backward(d_out.view_2d(), x2, w, mean_, rstd_, dx.defined() ? &dx : nullptr,
                          dw.defined() ? &dw : nullptr, db.defined() ? &db : nullptr, into_sum, br);
    if (br) add->set_branch_grad(dh, into_sum ? sum->data_ptr() : dx.data_ptr());
    if (dh_sum.defined()) maker->set_bias_grad_of_output(dh_sum, dh.data_ptr());
    if (dx.defined() && !into_sum) g[0] = dx.reshape(x.shape());
    g[1] = dw;
    g[2] = db;
    return g;
  }
  void release() override { mean_ = rstd_ = Tensor(); }
  size_t saved_bytes() const override {
    return (mean_.defined() ? mean_.nbytes() : 0) + (rstd_.defined() ? rstd_.nbytes() : 0);
  }

 private:
  bool rms_, prescaled_;
  Tensor mean_, rstd_;
};

class RopeNode final : public Node {
 public:
  RopeNode(int64_t heads, int64_t kv_heads, double base)
      : heads_(heads), kv_heads_(kv_heads), base_(base) {}
  const char* name() const override { return "rope"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    Tensor d = Tensor::empty(d_out.shape(), d_out.dtype(), d_out.device());
    ffn::rope(d_out, heads_, kv_heads_, base_, /*inverse=*/true, d);
    return {d};
  }
  void release() override {}

 private:
  int64_t heads_, kv_heads_;
  double base_;
};

// inputs: the distinct Vars of the pieces; parts_ index them.
class ConcatRowsNode final : public Node {
 public:
  struct Part {
    size_t input;
    int64_t begin, count, offset;
  };
  explicit ConcatRowsNode(std::vector<Part> parts) : parts_(std::move(parts)) {}
  const char* name() const override { return "concat_rows"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    std::vector<Tensor> g(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].requires_grad())
        g[i] = Tensor::zeros(inputs[i].value().shape(), d_out.dtype(), d_out.device());
    for (const Part& p : parts_)
      if (g[p.input].defined())
        g[p.input].narrow(0, p.begin, p.count).add_(d_out.narrow(0, p.offset, p.count));
    return g;
  }
  void release() override {}

 private:
  std::vector<Part> parts_;
};

class LeadingColumnsNode final : public Node {
 public:
  const char* name() const override { return "leading_columns"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    const Tensor& x = inputs[0].value();
    Tensor d = Tensor::zeros(x.shape(), d_out.dtype(), x.device());
    d.narrow(x.dim() - 1, 0, d_out.size(-1)).copy_(d_out);
    return {d};
  }
  void release() override {}
};

class CrossEntropyNode final : public Node {
 public:
  CrossEntropyNode(Tensor targets, Tensor lse, int64_t classes)
      : targets_(std::move(targets)), lse_(std::move(lse)), classes_(classes) {}
  const char* name() const override { return "cross_entropy"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    const Tensor& logits = inputs[0].value();
    const Tensor l2 = logits.view_2d();
    Tensor d = Tensor::empty(l2.shape(), l2.dtype(), l2.device());
    cross_entropy_backward(l2, targets_, lse_, d_out, d, classes_);
    return {d.reshape(logits.shape())};
  }
  void release() override { targets_ = lse_ = Tensor(); }

 private:
  Tensor targets_, lse_;
  int64_t classes_;
};

// Holds the gradients the forward already made for d_loss = 1 (Note [Fused classifier]).
class LinearCrossEntropyNode final : public Node {
 public:
  LinearCrossEntropyNode(Tensor dx, Tensor dw) : dx_(std::move(dx)), dw_(std::move(dw)) {}
  const char* name() const override { return "linear_cross_entropy"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    std::vector<Tensor> g(2);
    if (dx_.defined()) {
      scale_by(dx_, d_out, dx_);
      g[0] = dx_.reshape(inputs[0].shape());
    }
    if (dw_.defined()) {
      const Tensor& w = inputs[1].value();
      g[1] = Tensor::empty(w.shape(), w.dtype(), w.device());
      scale_by(dw_, d_out, g[1]);
    }
    return g;
  }
  void release() override { dx_ = dw_ = Tensor(); }
  size_t saved_bytes() const override {
    return (dx_.defined() ? dx_.nbytes() : 0) + (dw_.defined() ? dw_.nbytes() : 0);
  }

 private:
  Tensor dx_, dw_;
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
  const Tensor x2 = as_2d(xv);
  Tensor y = Tensor::empty(x2.shape(), x2.dtype(), x2.device());
  bias_dropout(x2, Tensor(), d, y);
  return make_output(y.reshape(xv.shape()), std::make_shared<DropoutNode>(d), {x});
}

Var dropout_add(const Var& res, const Var& y, const DropoutSpec& d) {
  FFN_CHECK(res.shape() == y.shape(), "[dropout_add] res.shape=", shape_str(res.shape()),
            " != y.shape=", shape_str(y.shape()));
  const Tensor& rv = res.value();
  Tensor out = Tensor::empty(rv.shape(), rv.dtype(), rv.device());
  Tensor out2 = as_2d(out);
  ffn::dropout_add(as_2d(rv), as_2d(y.value()), d, out2);
  return make_output(out, std::make_shared<DropoutAddNode>(d), {res, y});
}

Var add(const Var& a, const Var& b) {
  FFN_CHECK(a.shape() == b.shape(), "[add] a.shape=", shape_str(a.shape()),
            " != b.shape=", shape_str(b.shape()));
  const DType da = a.value().dtype(), db = b.value().dtype();
  FFN_CHECK(da == db || (is_half(db) && da == acc_dtype(db)) || (is_half(da) && db == acc_dtype(da)),
            "[add] dtype mismatch: a is ", dtype_name(da), " but b is ", dtype_name(db),
            " (only a 16-bit tensor may be added to an fp32 one)");
  check_same_device(a.value(), b.value(), "add", "a", "b");
  const bool a_wide = da == db || !is_half(da);
  const Tensor& wide = a_wide ? a.value() : b.value();
  const Tensor& narrow = a_wide ? b.value() : a.value();
  // One pass, converting the narrow operand on the fly (no clone + add_).
  return make_output(wide.plus(narrow), std::make_shared<AddNode>(), {a, b});
}

Var cast(const Var& x, DType dtype) {
  if (x.value().dtype() == dtype) return x;
  return make_output(x.value().to(dtype), std::make_shared<CastNode>(), {x});
}

Var mse_loss(const Var& pred, const Tensor& target) {
  Tensor loss = Tensor::empty({}, pred.value().dtype(), pred.value().device());
  ffn::mse_loss(pred.value(), target, loss);
  return make_output(loss, std::make_shared<MseNode>(target), {pred});
}

Var embedding(const Tensor& ids, const Var& table, bool check_ids) {
  const Tensor& t = table.value();
  check_dim(t, 2, "embedding", "table");
  check_defined(ids, "embedding", "ids");
  const Tensor flat = ids.contiguous().reshape({ids.numel()});
  Tensor out = Tensor::empty({flat.numel(), t.size(1)}, t.dtype(), t.device());
  ffn::embedding(flat, t, out, check_ids);
  Shape shape = ids.shape();
  shape.push_back(t.size(1));
  return make_output(out.reshape(shape), std::make_shared<EmbeddingNode>(flat), {table});
}

Var embedding_sum(const Tensor& ids, const Var& table, const Var& pos, DType dtype,
                  bool check_ids) {
  const Tensor& t = table.value();
  check_dim(t, 2, "embedding_sum", "table");
  check_dim(ids, 2, "embedding_sum", "ids");
  const Tensor flat = ids.contiguous().reshape({ids.numel()});
  Tensor out = Tensor::empty({flat.numel(), t.size(1)}, dtype, t.device());
  ffn::embedding_sum(flat, t, pos.defined() ? pos.value() : Tensor(), ids.size(1), out, check_ids);
  return make_output(out.reshape({ids.size(0), ids.size(1), t.size(1)}),
                     std::make_shared<EmbeddingSumNode>(flat, ids.size(1)), {table, pos});
}

Var layer_norm(const Var& x, const Var& w, const Var& b, double eps) {
  const Tensor& xv = x.value();
  FFN_CHECK(xv.dim() >= 1, "[layer_norm] x must have at least one dimension");
  const Tensor x2 = xv.view_2d();
  const DType sd = acc_dtype(xv.dtype());
  Tensor y = Tensor::empty(x2.shape(), w.value().dtype(), xv.device());  // w's dtype (mixed)
  Tensor mean = Tensor::empty({x2.size(0)}, sd, xv.device());
  Tensor rstd = Tensor::empty({x2.size(0)}, sd, xv.device());
  ffn::layer_norm(x2, w.value(), value_or_empty(b), eps, y, mean, rstd);
  return make_output(y.reshape(xv.shape()),
                     std::make_shared<LayerNormNode>(std::move(mean), std::move(rstd)), {x, w, b});
}

std::pair<Var, Var> add_layer_norm(const Var& res, const Var& h, const DropoutSpec& d, const Var& w,
                                   const Var& b, double eps, bool rms) {
  FFN_CHECK(res.shape() == h.shape(), "[add_layer_norm] res.shape=", shape_str(res.shape()),
            " != h.shape=", shape_str(h.shape()));
  const Tensor& rv = res.value();
  FFN_CHECK(rv.dim() >= 1, "[add_layer_norm] res must have at least one dimension");
  const Tensor r2 = as_2d(rv);
  Tensor a = Tensor::empty(rv.shape(), rv.dtype(), rv.device());
  Tensor a2 = as_2d(a);
  const DType sd = acc_dtype(rv.dtype());
  Tensor y = Tensor::empty(r2.shape(), w.value().dtype(), rv.device());  // w's dtype (mixed)
  Tensor mean = rms ? Tensor() : Tensor::empty({r2.size(0)}, sd, rv.device());
  Tensor rstd = Tensor::empty({r2.size(0)}, sd, rv.device());
  ffn::add_layer_norm(r2, as_2d(h.value()), d, w.value(), rms ? Tensor() : value_or_empty(b), eps,
                      a2, y, mean, rstd);
  // The graph is the two ops', so their backward (and Note [Residual add and norm]) applies.
  Var av = make_output(a, std::make_shared<DropoutAddNode>(d), {res, h});
  Var yv = make_output(y.reshape(rv.shape()),
                       std::make_shared<LayerNormNode>(std::move(mean), std::move(rstd)),
                       {av, w, rms ? Var() : b});
  return {av, yv};
}

std::pair<Var, Var> linear_add_layer_norm(const Var& res, const Var& xin, const Var& wl,
                                          const Var& bl, const DropoutSpec& d, const Var& w,
                                          const Var& b, double eps, bool rms) {
  const Tensor& rv = res.value();
  const Tensor& xv = xin.value();
  const Tensor& wv = wl.value();
  const bool shapes = rv.dim() >= 1 && xv.dim() == rv.dim() && wv.dim() == 2 &&
                      xv.size(-1) == wv.size(1) && with_last(xv.shape(), wv.size(0)) == rv.shape();
  if (shapes && rv.is_cuda() && rv.numel() > 0 && rv.dtype() == DType::f32 && is_half(wv.dtype()) &&
      gemm_epilogues() && norm_epilogue()) {
    const Tensor r2 = as_2d(rv);
    Tensor a = Tensor::empty(rv.shape(), rv.dtype(), rv.device());
    Tensor a2 = as_2d(a);
    const DType sd = acc_dtype(rv.dtype());
    Tensor y = Tensor::empty(r2.shape(), w.value().dtype(), rv.device());
    Tensor mean = rms ? Tensor() : Tensor::empty({r2.size(0)}, sd, rv.device());
    Tensor rstd = Tensor::empty({r2.size(0)}, sd, rv.device());
    if (ffn::linear_add_layer_norm(xv.view_2d(), wv, value_or_empty(bl), r2, d, w.value(),
                                   rms ? Tensor() : value_or_empty(b), eps, a2, y, mean, rstd)) {
      // h was never stored: its Var carries the shape, dtype and device the graph's backward
      // asks of it and borrows a's memory, which nothing reads through it (the linear's
      // backward reads xin and wl, the add's only h's shape).
      Var hv = make_output(Tensor::borrow(a.data_ptr(), rv.shape(), wv.dtype(), rv.device()),
                           std::make_shared<LinearNode>(), {xin, wl, bl});
      Var av = make_output(a, std::make_shared<DropoutAddNode>(d), {res, hv});
      Var yv = make_output(y.reshape(rv.shape()),
                           std::make_shared<LayerNormNode>(std::move(mean), std::move(rstd)),
                           {av, w, rms ? Var() : b});
      return {av, yv};
    }
  }
  return add_layer_norm(res, linear(xin, wl, bl), d, w, b, eps, rms);
}

Var rms_norm(const Var& x, const Var& w, double eps) {
  const Tensor& xv = x.value();
  FFN_CHECK(xv.dim() >= 1, "[rms_norm] x must have at least one dimension");
  const Tensor x2 = xv.view_2d();
  Tensor y = Tensor::empty(x2.shape(), w.value().dtype(), xv.device());  // w's dtype (mixed)
  Tensor rstd = Tensor::empty({x2.size(0)}, acc_dtype(xv.dtype()), xv.device());
  ffn::rms_norm(x2, w.value(), eps, y, rstd);
  return make_output(y.reshape(xv.shape()),
                     std::make_shared<LayerNormNode>(Tensor(), std::move(rstd)), {x, w, Var()});
}

std::pair<Var, Tensor> add_rms_stats(const Var& res, const Var& h, const DropoutSpec& d,
                                     const Var& w, double eps) {
  FFN_CHECK(res.shape() == h.shape(), "[add_rms_stats] res.shape=", shape_str(res.shape()),
            " != h.shape=", shape_str(h.shape()));
  const Tensor& rv = res.value();
  FFN_CHECK(rv.dim() >= 1, "[add_rms_stats] res must have at least one dimension");
  const Tensor r2 = as_2d(rv);
  Tensor a = Tensor::empty(rv.shape(), rv.dtype(), rv.device());
  Tensor a2 = as_2d(a), y, no_mean;
  Tensor rstd = Tensor::empty({r2.size(0)}, acc_dtype(rv.dtype()), rv.device());
  ffn::add_layer_norm(r2, as_2d(h.value()), d, w.value(), Tensor(), eps, a2, y, no_mean, rstd);
  return {make_output(a, std::make_shared<DropoutAddNode>(d), {res, h}), rstd};
}

Tensor rms_stats(const Var& x, const Var& w, double eps) {
  const Tensor& xv = x.value();
  FFN_CHECK(xv.dim() >= 1, "[rms_stats] x must have at least one dimension");
  const Tensor x2 = xv.view_2d();
  Tensor rstd = Tensor::empty({x2.size(0)}, acc_dtype(xv.dtype()), xv.device()), y;
  ffn::rms_norm(x2, w.value(), eps, y, rstd);
  return rstd;
}

Var rms_norm_unstored(const Var& x, const Var& w, const Tensor& rstd) {
  const Tensor& xv = x.value();
  FFN_CHECK(xv.dtype() == w.value().dtype() && xv.is_contiguous(),
            "[rms_norm] the unstored norm needs a contiguous x in w's dtype, got x ", xv.desc(),
            ", w ", w.value().desc());
  // Nothing reads the output's memory (the node's backward reads x, w and rstd): it borrows
  // x's, which has the same shape, dtype and size.
  return make_output(Tensor::borrow(xv.data_ptr(), xv.shape(), xv.dtype(), xv.device()),
                     std::make_shared<LayerNormNode>(Tensor(), rstd, /*prescaled=*/true),
                     {x, w, Var()});
}

Var rope(const Var& qkv, int64_t heads, int64_t kv_heads, double base) {
  const Tensor& v = qkv.value();
  Tensor y = Tensor::empty(v.shape(), v.dtype(), v.device());
  ffn::rope(v, heads, kv_heads, base, /*inverse=*/false, y);
  return make_output(y, std::make_shared<RopeNode>(heads, kv_heads, base), {qkv});
}

Var concat_rows(const std::vector<RowRange>& parts) {
  FFN_CHECK(!parts.empty(), "[concat_rows] no pieces");
  const Tensor& first = parts[0].v.value();
  check_dim(first, 2, "concat_rows", "piece 0");
  std::vector<Var> inputs;
  std::vector<ConcatRowsNode::Part> placed;
  int64_t rows = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const Tensor& t = parts[k].v.value();
    FFN_CHECK(t.dim() == 2 && t.size(1) == first.size(1) && t.dtype() == first.dtype() &&
                  t.device() == first.device(),
              "[concat_rows] piece ", k, " is ", t.desc(), ", piece 0 ", first.desc());
    FFN_CHECK(parts[k].begin >= 0 && parts[k].count >= 0 &&
                  parts[k].begin + parts[k].count <= t.size(0),
              "[concat_rows] piece ", k, " asks for rows [", parts[k].begin, ", ",
              parts[k].begin + parts[k].count, ") of ", shape_str(t.shape()));
    size_t in = 0;
    while (in < inputs.size() && inputs[in].impl() != parts[k].v.impl()) ++in;
    if (in == inputs.size()) inputs.push_back(parts[k].v);
    placed.push_back({in, parts[k].begin, parts[k].count, rows});
    rows += parts[k].count;
  }
  Tensor out = Tensor::empty({rows, first.size(1)}, first.dtype(), first.device());
  for (size_t k = 0; k < parts.size(); ++k)
    out.narrow(0, placed[k].offset, placed[k].count)
        .copy_(parts[k].v.value().narrow(0, parts[k].begin, parts[k].count));
  return make_output(out, std::make_shared<ConcatRowsNode>(std::move(placed)), std::move(inputs));
}

Var leading_columns(const Var& x, int64_t n) {
  const Tensor& xv = x.value();
  FFN_CHECK(xv.dim() >= 1 && n >= 0 && n <= xv.size(-1), "[leading_columns] n=", n,
            " must be in [0, ", xv.dim() ? xv.size(-1) : 0, "] for x.shape=", shape_str(xv.shape()));
  if (n == xv.size(-1)) return x;
  return make_output(xv.narrow(xv.dim() - 1, 0, n).contiguous(),
                     std::make_shared<LeadingColumnsNode>(), {x});
}

Var cross_entropy(const Var& logits, const Tensor& targets, bool check_targets, int64_t classes) {
  const Tensor& lv = logits.value();
  FFN_CHECK(lv.dim() >= 1, "[cross_entropy] logits must have at least one dimension");
  const Tensor l2 = lv.view_2d();
  check_defined(targets, "cross_entropy", "targets");
  FFN_CHECK(targets.numel() == l2.size(0), "[cross_entropy] targets.shape=",
            shape_str(targets.shape()), " does not match logits.shape=", shape_str(lv.shape()));
  const Tensor t = targets.contiguous().reshape({targets.numel()});
  const DType ad = acc_dtype(lv.dtype());
  Tensor loss = Tensor::empty({}, ad, lv.device());
  Tensor lse = Tensor::empty({l2.size(0)}, ad, lv.device());
  ffn::cross_entropy(l2, t, loss, lse, check_targets, classes);
  return make_output(loss, std::make_shared<CrossEntropyNode>(t, std::move(lse), classes),
                     {logits});
}

Var linear_cross_entropy(const Var& x, const Var& w, const Tensor& targets, bool check_targets,
                         int64_t classes, int64_t chunk_rows) {
  const char* op = "linear_cross_entropy";
  const Tensor& xv = x.value();
  const Tensor& wv = w.value();
  check_dim(wv, 2, op, "weight");
  FFN_CHECK(xv.dim() >= 1 && xv.size(-1) == wv.size(1), "[", op,
            "] x.shape[-1]=", xv.dim() ? xv.size(-1) : 0,
            " != the weight's in_features=", wv.size(1), " (x.shape=", shape_str(xv.shape()),
            ", weight.shape=", shape_str(wv.shape()), ")");
  check_same_dtype(xv, wv, op, "x", "weight");
  check_same_device(xv, wv, op, "x", "weight");
  const Tensor x2 = xv.view_2d().contiguous();
  const int64_t n = x2.size(0), v = wv.size(0);
  FFN_CHECK(n > 0, "[", op, "] the mean over 0 rows is undefined");
  check_defined(targets, op, "targets");
  FFN_CHECK(targets.numel() == n, "[", op, "] targets.shape=", shape_str(targets.shape()),
            " does not match x.shape=", shape_str(xv.shape()), " (one target per row)");
  FFN_CHECK(chunk_rows >= 0, "[", op, "] chunk_rows must be >= 0 (0: all rows), got ", chunk_rows);
  FFN_CHECK(classes >= 0 && classes <= v, "[", op, "] classes=", classes, " must be in [0, ", v,
            "] (the weight's rows; 0: all)");
  const Tensor t = targets.contiguous().reshape({n});
  // Checked once for all rows (on the GPU, one sync); the chunks skip it.
  detail::check_indices(t, classes > 0 ? classes : v, op, "targets", check_targets);
  const DType ad = acc_dtype(xv.dtype());
  const bool grad = grad_enabled() && (x.requires_grad() || w.requires_grad());
  Tensor row_loss = Tensor::empty({n}, ad, xv.device());
  Tensor dx =
      grad && x.requires_grad() ? Tensor::empty(x2.shape(), xv.dtype(), xv.device()) : Tensor();
  Tensor dw = grad && w.requires_grad() ? Tensor::empty(wv.shape(), ad, wv.device()) : Tensor();
  const int64_t rows = chunk_rows > 0 ? std::min(chunk_rows, n) : n;
  const Tensor buf = Tensor::empty({rows, v}, xv.dtype(), xv.device());
  for (int64_t r0 = 0; r0 < n; r0 += rows) {
    const int64_t r1 = std::min(n, r0 + rows);
    const Tensor xc = x2.slice_rows(r0, r1);
    Tensor logits = buf.slice_rows(0, r1 - r0);
    gemm(xc, wv, logits, {.trans_b = true});
    Tensor rl = row_loss.slice_rows(r0, r1);
    cross_entropy_rows(logits, t.slice_rows(r0, r1), rl, /*check_targets=*/false, classes,
                       grad ? std::optional<double>(1.0 / static_cast<double>(n)) : std::nullopt);
    if (dx.defined()) {
      Tensor dxc = dx.slice_rows(r0, r1);
      gemm(logits, wv, dxc);
    }
    if (dw.defined()) gemm(logits, xc, dw, {.trans_a = true, .beta = r0 > 0 ? 1.0 : 0.0});
  }
  Tensor loss = Tensor::empty({}, ad, xv.device());
  mean_rows(row_loss, loss);
  return make_output(loss, std::make_shared<LinearCrossEntropyNode>(std::move(dx), std::move(dw)),
                     {x, w});
}

}  // namespace ffn::fn
