// layers/attention.cpp — fn::causal_attention: the multi-head causal attention core as one
// autograd node, built from batched cuBLASLt GEMMs and the fused causal softmax + dropout; and
// fn::rope_attention, the Llama attention's projection, rotary embeddings and attention
// (Note [Fused rotary embeddings] below).
//
// Forward:  [q|k|v] = split_heads(qkv)            [3, B·H, T, D] (one strided copy)
//           s = q·kᵀ;  p, pd = causal_softmax(s, 1/√D, dropout)
//           y = merge_heads(pd·v)                  [B, T, C]
// Backward: pd is rebuilt from p by bias_dropout (same mask, Note [Dropout RNG]), then
//           dv = pdᵀ·dy,  dpd = dy·vᵀ,  ds = causal_softmax_backward(p, dpd),
//           dq = ds·k,  dk = dsᵀ·q,  dqkv = merge of [dq|dk|dv].
// Saved between the passes: the head-split q, k, v and p (never s, pd or the mask).
//
// On the GPU, for bf16/f16 and the head sizes and lengths where kernels/attention.h's kernels
// are the faster choice (fused_attention_preferred), the same math runs as one fused
// (flash-style) kernel per pass instead: it reads q, k, v straight from qkv,
// writes y in [B, T, C], and saves only qkv, y and the row log-sum-exp. Both paths drop the
// same attention entries for the same spec.
//
// Note [Fused rotary embeddings]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A Llama attention rotates q and k by RoPE (kernels/rope.h) between the QKV projection and
// the attention; unfused that is two passes over 2/3 of qkv, the rotation after the GEMM and
// its inverse on the gradient after the attention's backward. fn::rope_attention removes
// both: forward, kernels/rope.h's linear_rope runs the projection on the own Hopper GEMM with
// the rotation applied to the accumulators before they are rounded (gemm/epilogue.cuh,
// StoreCTma<T, true>: the lane that holds column i of a head also holds column i + 32, so
// the pair rotates in registers); backward, both fused attention backward kernels (mma.sync
// and Hopper) rotate dq and dk back in registers before their stores
// (fused_attention_backward's rope_base), so dqkv is already the gradient of the projection's
// output and goes straight into its two GEMMs. One node owns the projection's gradients, so
// nothing else ever sees the rotated gradient. Where the own GEMM cannot run the product
// (another GPU, head size ≠ 64) linear_rope is the GEMM then the rope kernel and only the
// backward's pass is saved. The fused results differ from the composition's by the
// rounding the composition does between the GEMM and the rotation (and between the
// attention's dq/dk and the inverse rotation): tests/layers compare them within the
// low-precision rule; the CPU path is the composition itself.
//
// Note [RMSNorm folded into the QKV GEMM]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A Llama block's attention starts with y = rms_norm(x)·g and qkv = rope(y·Wᵀ). Unfused, the
// residual add before the norm writes y (add_layer_norm) and the GEMM reads it back; the graph
// keeps y for the weight gradient. Since a row scale commutes with a product,
//   y·Wᵀ = diag(rstd)·x·(W·diag(g))ᵀ,
// fn::rms_norm_rope_attention computes the projection from x itself where x is the 16-bit
// residual stream (runtime.fp32_residual = false; with the fp32 stream the GEMM would need a
// 16-bit copy of x, as many bytes as y):
//   forward:  the add writes x and rstd only (add_rms_stats); W' = scale_columns(W, g), a
//             weight-sized pass; the projection's GEMM scales each row of its accumulators
//             by rstd before the rotation (linear_rope's row_scale, StoreCTma<T, true>).
//             y is never stored.
//   backward: with dqkv' = diag(rstd)·dqkv (the attention backward stores its rows scaled,
//             fused_attention_backward's row_scale):
//               dW  = dqkvᵀ·y = (dqkv'ᵀ·x)·diag(g)        (the usual GEMM on x, then a
//                                                        column scale of the weight-sized
//                                                        result)
//               dy' = dqkv'·W = diag(rstd)·dy             (the usual GEMM)
//             and rms_norm_backward in its prescaled form takes dy' (dx = dy'⊙g - x̂ ⊙
//             mean(dy'⊙g⊙x̂), dg = Σ dy'⊙x), with the residual add's branch gradient in
//             the same pass as unfused (Note [Residual add and norm]).
// So the forward saves y's write and the graph y's memory (2 bytes an element of x per
// block), the backward moves the same bytes as unfused, and two weight-sized passes are added.
// Measured (H200, session 50; ncu per kernel at B·T = 16384, C = 768): the add's pass 30.9 ->
// 26.0 us, the two scale_columns passes 4.2 + 4.5 us, the attention backward 347.0 -> 351.8
// us (its row scales loaded a product ahead; loaded at the stores, 353.2 -> 367.0 in another
// run). So it is no faster: ffn-bench --rms-fold, folded / unfused 1.006 (d768), 1.012
// (d2048), 1.02-1.05 (llama_char, dropout 0.3); llama_char's bf16-stream step 1-3% slower.
// Hence off by default (rms_fold(), kernels/gemm.h). What would make it pay: the two weight
// passes folded into passes that run anyway (W·diag(g) into the per-forward concat_rows copy
// of the QKV weight, the dW column scale into the weight-gradient GEMM's epilogue), and more
// tokens a step, where y's write outweighs W's passes (B·T ≫ 3C).
// The gradient reaches the norm through its usual node (fn::rms_norm_unstored: the
// norm's node with an output that is never computed), which only this node feeds. The results
// differ from the unfused path's by where the rounding happens (W·g and dqkv' rounded to 16
// bits instead of y and dqkv): tests/test_attention_layers.cpp compares them within the
// low-precision rule. rms_fold() (kernels/gemm.h) switches it on, with the MLP's norm folded
// into its fc1 likewise (Note [RMSNorm folded into the FFN] in layers/ffn_nodes.cpp).
#include <cmath>

#include "kernels/attention.h"
#include "kernels/bias_act_dropout.h"
#include "kernels/causal_softmax.h"
#include "kernels/gemm.h"
#include "kernels/rope.h"
#include "kernels/scale.h"
#include "layers/branch_bias_grad.h"
#include "layers/functional.h"

namespace ffn::fn {

namespace {

struct Dims {
  int64_t b, t, c, h, d;
};

class AttentionNode final : public Node {
 public:
  AttentionNode(Dims dims, DropoutSpec drop, Tensor split, Tensor p)
      : dims_(dims), drop_(drop), split_(std::move(split)), p_(std::move(p)) {}
  const char* name() const override { return "causal_attention"; }

  std::vector<Tensor> backward(Tensor d_out) override {
    const auto [b, t, c, h, d] = dims_;
    const int64_t bh = b * h;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const DType dt = p_.dtype();
    const Device dev = p_.device();
    const Tensor q = split_.narrow(0, 0, 1).reshape({bh, t, d});
    const Tensor k = split_.narrow(0, 1, 1).reshape({bh, t, d});
    const Tensor v = split_.narrow(0, 2, 1).reshape({bh, t, d});
    const Tensor dy =
        d_out.reshape({b, t, h, d}).permute({0, 2, 1, 3}).contiguous().reshape({bh, t, d});
    Tensor pd = p_;
    if (drop_.active()) {
      pd = Tensor::empty(p_.shape(), dt, dev);
      Tensor pd2 = pd.reshape({bh * t, t});
      bias_dropout(p_.reshape({bh * t, t}), Tensor(), drop_, pd2);
    }
    Tensor dsplit = Tensor::empty({3, bh, t, d}, dt, dev);
    Tensor dq = dsplit.narrow(0, 0, 1).reshape({bh, t, d});
    Tensor dk = dsplit.narrow(0, 1, 1).reshape({bh, t, d});
    Tensor dv = dsplit.narrow(0, 2, 1).reshape({bh, t, d});
    gemm_batched(pd, dy, dv, {.trans_a = true});
    pd = Tensor();
    const Tensor dpd = bmm(dy, v, {.trans_b = true});
    Tensor ds = Tensor::empty(p_.shape(), dt, dev);
    causal_softmax_backward(p_, dpd, scale, drop_, ds);
    gemm_batched(ds, k, dq);
    gemm_batched(ds, q, dk, {.trans_a = true});
    Tensor dqkv = Tensor::empty({b, t, 3, h, d}, dt, dev);
    dqkv.copy_(dsplit.reshape({3, b, h, t, d}).permute({1, 3, 0, 2, 4}));
    return {dqkv.reshape({b, t, 3 * c})};
  }
  void release() override { split_ = p_ = Tensor(); }
  size_t saved_bytes() const override {
    return split_.defined() ? split_.nbytes() + p_.nbytes() : 0;
  }

 private:
  Dims dims_;
  DropoutSpec drop_;
  Tensor split_;  // [3, B·H, T, D]
  Tensor p_;      // [B·H, T, T], before dropout
};

class FusedAttentionNode final : public Node {
 public:
  FusedAttentionNode(int64_t heads, DropoutSpec drop, Tensor qkv, Tensor y, Tensor lse)
      : heads_(heads), drop_(drop), qkv_(std::move(qkv)), y_(std::move(y)), lse_(std::move(lse)) {}
  const char* name() const override { return "causal_attention(fused)"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    const double scale = 1.0 / std::sqrt(static_cast<double>(y_.size(2) / heads_));
    Tensor dqkv = Tensor::empty(qkv_.shape(), qkv_.dtype(), qkv_.device());
    // Note [Branch bias gradient]: the QKV projection's bias gradient from the kernels that
    // write dqkv, when dqkv is all of qkv's gradient.
    const bool alone = !sums.empty() && sums[0] == nullptr && sums_final[0];
    auto* maker =
        alone ? dynamic_cast<BranchBiasGrad*>(inputs[0].grad_fn().get()) : nullptr;
    Tensor db;
    if (maker && maker->wants_bias_grad_of_output())
      db = Tensor::empty({qkv_.size(2)}, qkv_.dtype(), qkv_.device());
    fused_attention_backward(qkv_, y_, d_out, lse_, heads_, scale, drop_, dqkv, 0,
                             db.defined() ? &db : nullptr);
    if (db.defined()) maker->set_bias_grad_of_output(db, dqkv.data_ptr());
    return {dqkv};
  }
  void release() override { qkv_ = y_ = lse_ = Tensor(); }
  size_t saved_bytes() const override {
    return qkv_.defined() ? qkv_.nbytes() + y_.nbytes() + lse_.nbytes() : 0;
  }

 private:
  int64_t heads_;
  DropoutSpec drop_;
  Tensor qkv_, y_, lse_;
};

// Note [Fused rotary embeddings]: inputs x [B, T, C] and w [3C, C]; qkv is rope(x·wᵀ).
class RopeAttentionNode final : public Node {
 public:
  RopeAttentionNode(int64_t heads, double base, DropoutSpec drop, Tensor qkv, Tensor y, Tensor lse)
      : heads_(heads),
        base_(base),
        drop_(drop),
        qkv_(std::move(qkv)),
        y_(std::move(y)),
        lse_(std::move(lse)) {}
  const char* name() const override { return "rope_attention(fused)"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    const Tensor& x = inputs[0].value();
    const Tensor& w = inputs[1].value();
    const double scale = 1.0 / std::sqrt(static_cast<double>(y_.size(2) / heads_));
    Tensor dqkv = Tensor::empty(qkv_.shape(), qkv_.dtype(), qkv_.device());
    fused_attention_backward(qkv_, y_, d_out, lse_, heads_, scale, drop_, dqkv, base_);
    const Tensor d2 = dqkv.view_2d();
    std::vector<Tensor> g(2);
    if (inputs[0].requires_grad()) g[0] = matmul(d2, w).reshape(x.shape());
    if (inputs[1].requires_grad()) g[1] = matmul(d2, x.contiguous().view_2d(), {.trans_a = true});
    return g;
  }
  void release() override { qkv_ = y_ = lse_ = Tensor(); }
  size_t saved_bytes() const override {
    return qkv_.defined() ? qkv_.nbytes() + y_.nbytes() + lse_.nbytes() : 0;
  }

 private:
  int64_t heads_;
  double base_;
  DropoutSpec drop_;
  Tensor qkv_, y_, lse_;
};

// Note [RMSNorm folded into the QKV GEMM]: inputs the unstored norm's output (its node takes
// the prescaled gradient) and w [3C, C]; qkv = rope(diag(rstd)·x·(w·diag(g))ᵀ).
class RmsRopeAttentionNode final : public Node {
 public:
  RmsRopeAttentionNode(int64_t heads, double base, DropoutSpec drop, Tensor qkv, Tensor y,
                       Tensor lse, Tensor x, Tensor g, Tensor rstd)
      : heads_(heads),
        base_(base),
        drop_(drop),
        qkv_(std::move(qkv)),
        y_(std::move(y)),
        lse_(std::move(lse)),
        x_(std::move(x)),
        g_(std::move(g)),
        rstd_(std::move(rstd)) {}
  const char* name() const override { return "rms_norm_rope_attention(fused)"; }
  std::vector<Tensor> backward(Tensor d_out) override {
    const Tensor& w = inputs[1].value();
    const double scale = 1.0 / std::sqrt(static_cast<double>(y_.size(2) / heads_));
    Tensor dqkv = Tensor::empty(qkv_.shape(), qkv_.dtype(), qkv_.device());
    fused_attention_backward(qkv_, y_, d_out, lse_, heads_, scale, drop_, dqkv, base_, nullptr,
                             rstd_);  // rows scaled by rstd
    const Tensor d2 = dqkv.view_2d();
    std::vector<Tensor> g(2);
    if (inputs[0].requires_grad()) g[0] = matmul(d2, w).reshape(x_.shape());  // rstd ⊙ dy
    if (inputs[1].requires_grad()) {
      Tensor dw = matmul(d2, x_.view_2d(), {.trans_a = true});
      scale_columns(dw, g_, dw);
      g[1] = dw;
    }
    return g;
  }
  void release() override { qkv_ = y_ = lse_ = x_ = g_ = rstd_ = Tensor(); }
  size_t saved_bytes() const override {  // x, g and rstd are the stream's and the norm's
    return qkv_.defined() ? qkv_.nbytes() + y_.nbytes() + lse_.nbytes() : 0;
  }

 private:
  int64_t heads_;
  double base_;
  DropoutSpec drop_;
  Tensor qkv_, y_, lse_, x_, g_, rstd_;
};

}  // namespace

Var causal_attention(const Var& qkv, int64_t heads, const DropoutSpec& attn_dropout, bool fused) {
  const Tensor& x = qkv.value();
  FFN_CHECK(x.dim() == 3, "[causal_attention] qkv must be [B, T, 3C], got ", x.desc());
  FFN_CHECK(heads > 0 && x.size(2) % (3 * heads) == 0,
            "[causal_attention] qkv.shape[-1]=", x.size(2),
            " is not 3·heads·head_dim for heads=", heads);
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2) / 3, d = c / heads, bh = b * heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  if (fused && x.is_cuda() && fused_attention_preferred(x.dtype(), t, d)) {
    const Tensor xc = x.contiguous();
    Tensor y = Tensor::empty({b, t, c}, x.dtype(), x.device());
    Tensor lse = Tensor::empty({bh, t}, DType::f32, x.device());
    fused_attention(xc, heads, scale, attn_dropout, y, lse);
    return make_output(y, std::make_shared<FusedAttentionNode>(heads, attn_dropout, xc, y, lse),
                       {qkv});
  }
  const Tensor split =
      x.reshape({b, t, 3, heads, d}).permute({2, 0, 3, 1, 4}).contiguous().reshape({3, bh, t, d});
  const Tensor q = split.narrow(0, 0, 1).reshape({bh, t, d});
  const Tensor k = split.narrow(0, 1, 1).reshape({bh, t, d});
  const Tensor v = split.narrow(0, 2, 1).reshape({bh, t, d});
  const Tensor s = bmm(q, k, {.trans_b = true});
  Tensor p = Tensor::empty(s.shape(), x.dtype(), x.device());
  Tensor pd;
  if (attn_dropout.active()) pd = Tensor::empty(s.shape(), x.dtype(), x.device());
  causal_softmax(s, scale, attn_dropout, p, pd.defined() ? &pd : nullptr);
  const Tensor y = bmm(pd.defined() ? pd : p, v);
  const Tensor out =
      y.reshape({b, heads, t, d}).permute({0, 2, 1, 3}).contiguous().reshape({b, t, c});
  return make_output(
      out,
      std::make_shared<AttentionNode>(Dims{b, t, c, heads, d}, attn_dropout, split, std::move(p)),
      {qkv});
}

Var rope_attention(const Var& x, const Var& w, int64_t heads, double base,
                   const DropoutSpec& attn_dropout, bool fused) {
  const Tensor& xv = x.value();
  const Tensor& wv = w.value();
  FFN_CHECK(xv.dim() == 3 && wv.dim() == 2 && xv.size(2) == wv.size(1),
            "[rope_attention] x must "
            "be [B, T, C] and w [3·heads·head_dim, C]; got x ",
            xv.desc(), ", w ", wv.desc());
  FFN_CHECK(heads > 0 && wv.size(0) % (3 * heads) == 0, "[rope_attention] w's ", wv.size(0),
            " rows are not 3·heads·head_dim for heads=", heads);
  const int64_t b = xv.size(0), t = xv.size(1), c = wv.size(0) / 3, d = c / heads;
  if (fused && xv.is_cuda() && gemm_epilogues() && d % 2 == 0 &&
      fused_attention_preferred(xv.dtype(), t, d)) {
    Tensor qkv = Tensor::empty({b, t, 3 * c}, xv.dtype(), xv.device());
    linear_rope(xv, wv, heads, heads, base, qkv);
    Tensor y = Tensor::empty({b, t, c}, xv.dtype(), xv.device());
    Tensor lse = Tensor::empty({b * heads, t}, DType::f32, xv.device());
    fused_attention(qkv, heads, 1.0 / std::sqrt(static_cast<double>(d)), attn_dropout, y, lse);
    return make_output(
        y, std::make_shared<RopeAttentionNode>(heads, base, attn_dropout, qkv, y, lse), {x, w});
  }
  return causal_attention(rope(linear(x, w, Var()), heads, heads, base), heads, attn_dropout,
                          fused);
}

Var rms_norm_rope_attention(const Var& x, const Var& g, const Tensor& rstd, double eps,
                            const Var& w, int64_t heads, double base,
                            const DropoutSpec& attn_dropout, bool fused) {
  const Tensor& xv = x.value();
  const Tensor& wv = w.value();
  FFN_CHECK(xv.dim() == 3 && wv.dim() == 2 && xv.size(2) == wv.size(1),
            "[rms_norm_rope_attention] x must be [B, T, C] and w [3·heads·head_dim, C]; got x ",
            xv.desc(), ", w ", wv.desc());
  FFN_CHECK(heads > 0 && wv.size(0) % (3 * heads) == 0, "[rms_norm_rope_attention] w's ",
            wv.size(0), " rows are not 3·heads·head_dim for heads=", heads);
  const int64_t b = xv.size(0), t = xv.size(1), c = wv.size(0) / 3, d = c / heads;
  const Tensor& gv = g.value();
  if (fused && xv.is_cuda() && gemm_epilogues() && rms_fold() && d % 2 == 0 &&
      is_half(xv.dtype()) && xv.dtype() == wv.dtype() && gv.dtype() == wv.dtype() &&
      xv.is_contiguous() && rstd.defined() && fused_attention_preferred(xv.dtype(), t, d)) {
    FFN_CHECK(rstd.dtype() == DType::f32 && rstd.numel() == b * t && rstd.is_contiguous(),
              "[rms_norm_rope_attention] rstd must be a contiguous f32 [", b * t, "] tensor, got ",
              rstd.desc());
    const Tensor r = rstd.reshape({b * t});
    Tensor wg = Tensor::empty(wv.shape(), wv.dtype(), wv.device());
    scale_columns(wv, gv, wg);
    Tensor qkv = Tensor::empty({b, t, 3 * c}, xv.dtype(), xv.device());
    linear_rope(xv, wg, heads, heads, base, qkv, r);
    Tensor y = Tensor::empty({b, t, c}, xv.dtype(), xv.device());
    Tensor lse = Tensor::empty({b * heads, t}, DType::f32, xv.device());
    fused_attention(qkv, heads, 1.0 / std::sqrt(static_cast<double>(d)), attn_dropout, y, lse);
    const Var xn = rms_norm_unstored(x, g, r);
    return make_output(
        y,
        std::make_shared<RmsRopeAttentionNode>(heads, base, attn_dropout, qkv, y, lse, xv, gv, r),
        {xn, w});
  }
  return rope_attention(rms_norm(x, g, eps), w, heads, base, attn_dropout, fused);
}

}  // namespace ffn::fn
