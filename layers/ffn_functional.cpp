// layers/ffn_functional.cpp — the FFN block's forward and backward on the fused kernels.
#include "layers/ffn_functional.h"

#include "kernels/bias_act_dropout.h"
#include "kernels/bias_glu_dropout.h"
#include "kernels/gemm.h"
#include "kernels/scale.h"

namespace ffn {

namespace {
int64_t z_width(const Tensor& x, const FfnParams& p) {
  return p.w1.defined() ? p.w1.size(0) : x.size(1);
}
int64_t hidden_width(const Tensor& x, const FfnParams& p, const FfnConfig& cfg) {
  return cfg.gated ? z_width(x, p) / 2 : z_width(x, p);
}
void check_param(const Tensor& t, const Tensor& x, const Shape& shape, const char* name) {
  check_shape(t, shape, "ffn", name);
  check_same_device(t, x, "ffn", name, "x");
  check_same_dtype(t, x, "ffn", name, "x");
}
}  // namespace

void ffn_check(const Tensor& x, const FfnParams& p, const FfnConfig& cfg, const FfnDropout& d) {
  check_defined(x, "ffn", "x");
  check_dim(x, 2, "ffn", "x");
  if (p.w1.defined()) {
    check_dim(p.w1, 2, "ffn", "w1");
    FFN_CHECK(p.w1.size(1) == x.size(1), "[ffn] x.shape[-1]=", x.size(1),
              " != w1.shape[1]=", p.w1.size(1), " (in_features)");
    check_param(p.w1, x, p.w1.shape(), "w1");
  }
  if (p.row_scale.defined()) {
    FFN_CHECK(p.w1.defined(), "[ffn] row_scale scales fc1's product: it needs w1");
    const Tensor& s = p.row_scale;
    FFN_CHECK(
        s.dtype() == acc_dtype(x.dtype()) && s.shape() == Shape{x.size(0)} && s.is_contiguous(),
        "[ffn] row_scale must be a contiguous ", dtype_name(acc_dtype(x.dtype())), " [", x.size(0),
        "] tensor for x ", x.desc(), ", got ", s.desc());
    check_same_device(s, x, "ffn", "row_scale", "x");
  }
  const int64_t h1 = z_width(x, p);
  FFN_CHECK(!cfg.gated || h1 % 2 == 0, "[ffn] gated FFN needs an even fc1 width, got ", h1);
  if (p.b1.defined()) check_param(p.b1, x, {h1}, "b1");
  const int64_t h = hidden_width(x, p, cfg);
  if (p.w2.defined()) {
    check_dim(p.w2, 2, "ffn", "w2");
    FFN_CHECK(p.w2.size(1) == h, "[ffn] w2.shape=", shape_str(p.w2.shape()),
              " but the hidden width is ", h);
    check_param(p.w2, x, p.w2.shape(), "w2");
    if (p.b2.defined()) check_param(p.b2, x, {p.w2.size(0)}, "b2");
  } else {
    FFN_CHECK(!p.b2.defined(), "[ffn] b2 given without w2");
    FFN_CHECK(!d.out.active(), "[ffn] output dropout needs w2");
  }
}

FfnForward ffn_forward(const Tensor& x, const FfnParams& p, const FfnConfig& cfg,
                       const FfnDropout& d) {
  ffn_check(x, p, cfg, d);
  const int64_t m = x.size(0), h1 = z_width(x, p);
  FfnForward out;
  Tensor hd;
  // The activation and the hidden dropout run in fc1's epilogue: the own Hopper GEMM
  // (linear_act, Note [Activation warpgroup]; z saved without the bias, as below) or else,
  // without dropout, for gelu_tanh in 16 bits, cuBLASLt's GELU_AUX_BIAS epilogue, which saves
  // z + b1 and is 13% faster than the GEMM plus our kernel at d=1024
  // (bench/RESULTS-2026-11-22.md). That one cannot apply a mask, has no erf/SiLU/GLU, and its
  // approximate tanh (4e-5 relative) is only below the output rounding for 16-bit types.
  // A row scale runs only in the gated fc1's kernel (linear_glu); elsewhere it is a
  // scale_rows pass over z after the GEMM (and over dz in the backward).
  const Tensor& rs = p.row_scale;
  const bool plain_fc1 =
      x.is_cuda() && p.w1.defined() && !cfg.gated && !cfg.recompute && !rs.defined();
  if (plain_fc1) {  // z and hd allocated once, for whichever of the three ways runs
    out.z = Tensor::empty({m, h1}, x.dtype(), x.device());
    hd = Tensor::empty({m, h1}, x.dtype(), x.device());
    const bool own = gemm_epilogues() && linear_act(x, p.w1, p.b1, cfg.act, d.hidden, out.z, hd);
    if (!own && is_half(x.dtype()) && cfg.act == Activation::gelu_tanh && h1 % 8 == 0 &&
        !d.hidden.active()) {
      out.z_has_bias = true;
      gemm(x, p.w1, hd,
           {.trans_b = true, .bias = p.b1, .epilogue = GemmEpilogue::gelu_aux_bias, .aux = out.z});
    } else if (!own) {
      gemm(x, p.w1, out.z, {.trans_b = true});
      bias_act_dropout(out.z, p.b1, cfg.act, d.hidden, hd);
    }
  } else {
    hd = Tensor::empty({m, hidden_width(x, p, cfg)}, x.dtype(), x.device());
    // The gated FFN's fc1 with its GLU in the GEMM where it runs (linear_glu, Note [GLU
    // warpgroup]; z saved without the bias, as below).
    Tensor z;
    if (cfg.gated && p.w1.defined() && !cfg.recompute && x.is_cuda() && gemm_epilogues())
      z = linear_glu(x, p.w1, p.b1, cfg.act, d.hidden, hd, rs);
    if (!z.defined()) {
      z = p.w1.defined() ? matmul(x, p.w1, {.trans_b = true}) : x;
      if (rs.defined()) scale_rows(z, rs, z);
      if (cfg.gated)
        bias_glu_dropout(z, p.b1, cfg.act, d.hidden, hd);
      else
        bias_act_dropout(z, p.b1, cfg.act, d.hidden, hd);
    }
    if (p.w1.defined() && !cfg.recompute) out.z = z;
  }

  if (!p.w2.defined()) {
    out.y = hd;
    return out;
  }
  if (d.out.active()) {
    // The output dropout in fc2's epilogue where it runs (Note [Output dropout in the GEMM]).
    out.y = Tensor::empty({m, p.w2.size(0)}, x.dtype(), x.device());
    if (!linear_dropout(hd, p.w2, p.b2, d.out, out.y)) {
      const Tensor z2 = matmul(hd, p.w2, {.trans_b = true});
      bias_dropout(z2, p.b2, d.out, out.y);
    }
  } else {
    out.y = matmul(hd, p.w2, {.trans_b = true, .bias = p.b2});
  }
  return out;
}

FfnGrads ffn_backward(const Tensor& dy, const Tensor& x, const FfnForward& saved,
                      const FfnParams& p, const FfnConfig& cfg, const FfnDropout& d, bool need_dx,
                      const Tensor& db2) {
  // x, p, cfg and d are the forward's, validated there (ffn_check once per step); dy and
  // the saved z are what enters here.
  const Tensor& z_saved = saved.z;
  const int64_t m = x.size(0), h1 = z_width(x, p), h = hidden_width(x, p, cfg);
  const Shape y_shape{m, p.w2.defined() ? p.w2.size(0) : h};
  check_shape(dy, y_shape, "ffn_backward", "dy");
  check_same_device(dy, x, "ffn_backward", "dy", "x");
  check_same_dtype(dy, x, "ffn_backward", "dy", "x");
  FfnGrads g;

  // db1 comes from the fused activation backward (linear_act_backward, linear_glu_backward)
  // where it runs; db2 from the dropout pass, from the pass that wrote dy (given), or a
  // column-sum pass of its own (on an H100 faster, with the bare dW2 GEMM, than cuBLASLt's
  // BGRADB epilogue: bench/RESULTS-2026-11-24-s14-16.md, session 14).
  // fc2: dz2 = dropout_o'(dy), db2 fused into that pass.
  Tensor dz2 = dy;
  if (p.w2.defined()) {
    const bool given = p.b2.defined() && db2.defined() && !d.out.active();
    if (given) check_shape(db2, {y_shape[1]}, "ffn_backward", "db2");
    if (p.b2.defined()) g.db2 = given ? db2 : Tensor::empty({y_shape[1]}, x.dtype(), x.device());
    if (d.out.active()) {
      dz2 = Tensor::empty(y_shape, x.dtype(), x.device());
      bias_dropout_backward(dy, d.out, &dz2, p.b2.defined() ? &g.db2 : nullptr);
    } else if (p.b2.defined() && !given) {
      bias_grad(dy, g.db2);
    }
  }

  // The middle: dz (and db1) from dhd = dz2·W2 and the saved z, recomputing hd for dW2 on the
  // way; in dhd's GEMM epilogue where it can (linear_act_backward, linear_glu_backward), else
  // in one fused pass. Without W1 (welder_fc2) z is x, and the plain epilogue gives dx (the
  // gated one without W1 has not run on a GPU: it keeps the GEMM and the fused pass).
  Tensor z = x;
  if (p.w1.defined()) {
    if (z_saved.defined()) {
      check_shape(z_saved, {m, h1}, "ffn_backward", "saved z");
      z = z_saved;
    } else {
      FFN_CHECK(cfg.recompute, "[ffn_backward] z was not saved and recompute is off");
      z = matmul(x, p.w1, {.trans_b = true});
      if (p.row_scale.defined()) scale_rows(z, p.row_scale, z);
    }
  }
  Tensor dz = Tensor::empty({m, h1}, x.dtype(), x.device());
  if (p.b1.defined()) g.db1 = Tensor::empty({h1}, x.dtype(), x.device());
  Tensor hd = p.w2.defined() ? Tensor::empty({m, h}, x.dtype(), x.device()) : Tensor();
  const Tensor b1 = saved.z_has_bias && z_saved.defined() ? Tensor() : p.b1;  // z = z + b1
  Tensor* db1_fused = p.b1.defined() ? &g.db1 : nullptr;
  // With a row scale the fused GLU backward stores diag(row_scale)·dz (without db1: it
  // declines both together); every other path scales dz after it.
  const Tensor& rs = p.row_scale;
  const bool fused =
      gemm_epilogues() && p.w2.defined() && (p.w1.defined() || !cfg.gated) &&
      (cfg.gated ? linear_glu_backward(dz2, p.w2, z, b1, cfg.act, d.hidden, dz, hd, db1_fused, rs)
                 : !rs.defined() &&
                       linear_act_backward(dz2, p.w2, z, b1, cfg.act, d.hidden, dz, hd, db1_fused));
  if (!fused) {
    const Tensor dhd = p.w2.defined() ? matmul(dz2, p.w2) : dz2;
    Tensor* db1 = p.b1.defined() ? &g.db1 : nullptr;
    Tensor* hd_out = hd.defined() ? &hd : nullptr;
    if (cfg.gated)
      bias_glu_dropout_backward(dhd, z, b1, cfg.act, d.hidden, dz, db1, hd_out);
    else
      bias_act_dropout_backward(dhd, z, b1, cfg.act, d.hidden, dz, db1, hd_out);
    if (rs.defined()) scale_rows(dz, rs, dz);
  }

  if (p.w2.defined()) {
    g.dw2 = matmul(dz2, hd, {.trans_a = true});
  }
  if (p.w1.defined()) {
    g.dw1 = matmul(dz, x, {.trans_a = true});
    if (need_dx) g.dx = matmul(dz, p.w1);
  } else if (need_dx) {
    g.dx = dz;
  }
  return g;
}

}  // namespace ffn
