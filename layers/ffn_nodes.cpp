// layers/ffn_nodes.cpp — the fused FFN block as one autograd node (fn::ffn, on
// layers/ffn_functional.h's forward and backward) and with the RMSNorm before it folded into
// its fc1 (fn::rms_norm_ffn); declared in layers/functional.h.
#include "kernels/gemm.h"
#include "kernels/scale.h"
#include "layers/branch_bias_grad.h"
#include "layers/functional.h"

namespace ffn::fn {

namespace {

Tensor value_or_empty(const Var& v) {
  return v.defined() ? v.value() : Tensor();
}
// x's shape with its last dimension `last`.
Shape with_last(const Shape& s, int64_t last) {
  Shape out = s;
  out.back() = last;
  return out;
}

// Note [RMSNorm folded into the FFN]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A Llama block's MLP starts with y = rms_norm(x)·g and z = y·W1ᵀ; as for the attention's
// norm (Note [RMSNorm folded into the QKV GEMM] in layers/attention.cpp) a row scale commutes
// with the product:
//   z = diag(rstd)·x·(W1·diag(g))ᵀ
// so fn::rms_norm_ffn runs the FFN on x itself with W1' = scale_columns(W1, g) and rstd as
// FfnParams::row_scale: on Hopper the gated fc1's GEMM scales its accumulators' rows before
// rounding z (linear_glu's row_scale), and the GLU backward stores dz' = diag(rstd)·dz
// (linear_glu_backward's), so no pass is added there; elsewhere a scale_rows pass follows the
// product (and dz). The backward needs nothing else of the norm:
//   dW1 = dzᵀ·y = (dz'ᵀ·x)·diag(g)      ffn_backward's dw1, then a column scale
//   dy' = dz'·W1 = diag(rstd)·dy          ffn_backward's dx with the unscaled W1
// and the norm's node (rms_norm_unstored) takes dy' in its prescaled form. y is never
// stored. The fused GLU backward cannot also sum db1 of the unscaled dz, so with a bias the
// backward's dz is scaled by its own pass (the Llama MLP has none). The results differ from
// the composition's by where the rounding happens (W1·g and dz' rounded instead of y and dz):
// tests/test_layers.cpp compares them within the low-precision rule.
// Measured (H200, session 51, ncu per kernel, llama_char's MLP branch: B·T = 16384, C = 384,
// SwiGLU width 1024): the add's pass 21.7 -> 19.1 us, the GLU forward 62.8 -> 66.7 (its
// consumer's 128 multiplies a tile as it stages), the GLU backward 82.7 -> 83.2, the two
// scale_columns passes +6.7: 408.1 -> 416.5 us. So it is no faster (ffn-bench --rms-fold:
// folded / unfused 1.025 at llama_char's shape, 1.021 at C = 768, 1.039 at C = 2048) and,
// as the attention's fold, off by default (rms_fold()); it holds 2 bytes an element of x less
// per block (the branch's peak 258.3 -> 245.7 MB at llama_char's shape).
struct FfnFold {
  Tensor g, rstd;  // the norm's gain and the rows' statistics; undefined: no fold
};

// Inputs: x, w1, b1, w2, b2 (absent ones are undefined Vars). Saves z (Note [FFN saved state]).
// With a fold (Note [RMSNorm folded into the FFN]) x is the unstored norm's output (its
// value: the stream x's memory), w1 the unscaled W1, and dx is the norm's prescaled gradient.
class FfnNode final : public Node, public BranchBiasGrad {
 public:
  FfnNode(const FfnConfig& cfg, const FfnDropout& d, FfnForward saved, FfnFold fold = {})
      : cfg_(cfg), d_(d), saved_(std::move(saved)), fold_(std::move(fold)) {
    saved_.y = Tensor();  // the output belongs to the caller
  }
  const char* name() const override {
    if (fold_.rstd.defined())
      return cfg_.gated ? "rms_norm_gated_feed_forward(folded)" : "rms_norm_feed_forward(folded)";
    return cfg_.gated ? "gated_feed_forward" : "feed_forward";
  }
  std::vector<Tensor> backward(Tensor d_out) override {
    const Tensor& x = inputs[0].value();
    FfnParams p = params();
    p.row_scale = fold_.rstd;
    const Tensor dy = d_out.view_2d();
    FfnGrads g = ffn_backward(dy, x.view_2d(), saved_, p, cfg_, d_, inputs[0].requires_grad(),
                              take_given_db(dy));
    if (fold_.rstd.defined() && g.dw1.defined()) scale_columns(g.dw1, fold_.g, g.dw1);
    return {g.dx.defined() ? g.dx.reshape(x.shape()) : Tensor(), g.dw1, g.db1, g.dw2, g.db2};
  }
  void release() override {
    saved_.z = Tensor();
    fold_ = {};
    forget_given_db();
  }
  // fc2's bias gradient is the column sum of dy when fc2's own output dropout is off (with it
  // on, db2 sums the dropout's output in its pass).
  bool wants_bias_grad_of_output() const override {
    return inputs[3].defined() && inputs[4].defined() && inputs[4].requires_grad() &&
           !d_.out.active();
  }
  size_t saved_bytes() const override { return saved_.z.defined() ? saved_.z.nbytes() : 0; }

 private:
  FfnParams params() const {
    auto val = [&](int i) { return inputs[i].defined() ? inputs[i].value() : Tensor(); };
    return FfnParams{val(1), val(2), val(3), val(4)};
  }
  FfnConfig cfg_;
  FfnDropout d_;
  FfnForward saved_;  // z (and whether it includes b1); never y
  FfnFold fold_;
};

}  // namespace

Var ffn(const Var& x, const Var& w1, const Var& b1, const Var& w2, const Var& b2,
        const FfnConfig& cfg, const FfnDropout& d) {
  const Tensor& xv = x.value();
  FFN_CHECK(xv.dim() >= 1, "[ffn] x must have at least one dimension");
  const FfnParams p{value_or_empty(w1), value_or_empty(b1), value_or_empty(w2), value_or_empty(b2)};
  FfnForward f = ffn_forward(xv.view_2d(), p, cfg, d);
  const Tensor y = f.y.reshape(with_last(xv.shape(), f.y.size(1)));
  return make_output(y, std::make_shared<FfnNode>(cfg, d, std::move(f)), {x, w1, b1, w2, b2});
}

Var rms_norm_ffn(const Var& x, const Var& g, const Tensor& rstd, double eps, const Var& w1,
                 const Var& b1, const Var& w2, const Var& b2, const FfnConfig& cfg,
                 const FfnDropout& d) {
  const Tensor& xv = x.value();
  const Tensor& gv = g.value();
  const bool fold = rms_fold() && rstd.defined() && w1.defined() && !cfg.recompute &&
                    xv.dtype() == gv.dtype() && w1.value().dtype() == gv.dtype() &&
                    xv.is_contiguous() && xv.dim() >= 1 &&
                    (!xv.is_cuda() || (gemm_epilogues() && is_half(xv.dtype())));
  if (!fold) return ffn(rms_norm(x, g, eps), w1, b1, w2, b2, cfg, d);
  const Tensor x2 = xv.view_2d();
  FFN_CHECK(
      rstd.dtype() == acc_dtype(xv.dtype()) && rstd.numel() == x2.size(0) && rstd.is_contiguous(),
      "[rms_norm_ffn] rstd must be a contiguous ", dtype_name(acc_dtype(xv.dtype())), " [",
      x2.size(0), "] tensor for x ", xv.desc(), ", got ", rstd.desc());
  const Tensor r = rstd.reshape({x2.size(0)});
  const Tensor& w1v = w1.value();
  Tensor w1s = Tensor::empty(w1v.shape(), w1v.dtype(), w1v.device());
  scale_columns(w1v, gv, w1s);  // checks g against W1's columns
  FfnParams p{w1s, value_or_empty(b1), value_or_empty(w2), value_or_empty(b2)};
  p.row_scale = r;
  FfnForward f = ffn_forward(x2, p, cfg, d);
  const Tensor y = f.y.reshape(with_last(xv.shape(), f.y.size(1)));
  const Var xn = rms_norm_unstored(x, g, r);
  return make_output(y, std::make_shared<FfnNode>(cfg, d, std::move(f), FfnFold{gv, r}),
                     {xn, w1, b1, w2, b2});
}

}  // namespace ffn::fn
