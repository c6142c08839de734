// tests/test_transformer_ops_cuda.cpp — the transformer ops' CUDA kernels against their CPU
// references at odd and aligned shapes (part of test_kernels; skipped without a GPU).
// Tolerances follow tests/test_kernels_cuda.cpp's rules: f32 within 1e-5 relative plus an
// atol scaled by the reduction length; bf16 within 2x the error of the same math done
// naively in f32 and rounded to bf16 (both measured against an f64 reference on the same
// rounded inputs); never NaN.
#include <cmath>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/bias_act_dropout.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout_add.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/layer_norm.h"
#include "kernels/causal_softmax.h"
#include "layers/functional.h"
#include "tests/test_util.h"

using namespace ffn;
using ffn::test::check_close;
using ffn::test::max_abs_diff;
using ffn::test::max_abs;
using ffn::test::rand64;

namespace {

const Device kGpu = Device::cuda(0);

// gpu: the GPU result; ref64: CPU f64 on the rounded inputs; naive32: CPU f32 on them.
// `term_scale` is the magnitude of the terms an output is computed from, for outputs that
// cancel to ~0 (a LayerNorm dx over one column, a softmax gradient over one entry): their
// absolute error is set by the terms, not by the tiny result.
void compare(const Tensor& gpu, const Tensor& ref64, const Tensor& naive32, DType dt,
             double reduce_len, const std::string& what, double term_scale = 0.0) {
  const Tensor g = gpu.to(Device::cpu()).to(DType::f64);
  for (double v : g.to_vector()) REQUIRE_MESSAGE(!std::isnan(v), what, ": NaN");
  const double scale = std::max(max_abs(ref64), term_scale);
  if (dt == DType::f32) {
    const double atol = std::max(1.0, reduce_len) * std::ldexp(1.0, -23) * 4 * scale + 1e-6 * scale;
    check_close(g, ref64, atol, 1e-5, what);
    return;
  }
  const double naive = max_abs_diff(naive32.to(dt).to(DType::f64), ref64);
  const double err = max_abs_diff(g, ref64);
  CHECK_MESSAGE(err <= 2 * naive + 1e-6 * scale, what, " ", dtype_name(dt), ": gpu error ", err,
                " vs naive ", naive);
}

Tensor ids(int64_t n, int64_t v, uint64_t seed) {
  std::vector<double> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<double>((i * 7919 + seed * 31 + i * i) % v);
  return Tensor::from_vector(x, {n}, DType::i32);
}

}  // namespace

FFN_GPU_TEST("embedding on the GPU: gather exact, backward deterministic and equal to CPU") {
  Generator g(31);
  for (auto [n, v, c] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {37, 5, 3},
                         {4097, 65, 384}, {1000, 50257, 64},
                         {5000, 3, 40}, {129, 1, 5}})  // runs across many 64-row chunks
    for (DType dt : {DType::f32, DType::bf16}) {
      const Tensor table64 = rand64({v, c}, g).to(dt).to(DType::f64);
      const Tensor id = ids(n, v, 3);
      Tensor out = Tensor::empty({n, c}, dt, kGpu);
      embedding(id.to(kGpu), table64.to(dt).to(kGpu), out);
      Tensor ref = Tensor::empty({n, c}, DType::f64);
      embedding(id, table64, ref);
      check_close(out.to(Device::cpu()).to(DType::f64), ref, 0, 0, "embedding gather");
      const Tensor dout64 = rand64({n, c}, g).to(dt).to(DType::f64);
      Tensor d1 = Tensor::empty({v, c}, dt, kGpu), d2 = Tensor::empty({v, c}, dt, kGpu);
      embedding_backward(id.to(kGpu), dout64.to(dt).to(kGpu), d1);
      embedding_backward(id.to(kGpu), dout64.to(dt).to(kGpu), d2);
      check_close(d1.to(Device::cpu()).to(DType::f64), d2.to(Device::cpu()).to(DType::f64), 0, 0,
                  "embedding backward is bitwise deterministic");
      Tensor r64 = Tensor::empty({v, c}, DType::f64), r32 = Tensor::empty({v, c}, DType::f32);
      embedding_backward(id, dout64, r64);
      embedding_backward(id, dout64.to(DType::f32), r32);
      compare(d1, r64, r32, dt, static_cast<double>(n) / static_cast<double>(v) + 1,
              "embedding backward");
    }
  Tensor out = Tensor::empty({2, 3}, DType::f32, kGpu);
  const Tensor table = Tensor::zeros({5, 3}, DType::f32, kGpu);
  CHECK_THROWS_WITH_AS(
      embedding(Tensor::from_vector({1, 7}, {2}, DType::i32, kGpu), table, out),
      doctest::Contains("[embedding] ids[1]=7 is out of range [0, 5)"), Error);
}

// C % 8 == 0 up to 1024 with 16-bit w takes the one-pass backward kernel (several 64-row
// blocks at 130 and 200 rows); the rest the per-row kernel + column sums.
FFN_GPU_TEST("layer_norm on the GPU matches the CPU (forward, dx, dw, db, dx added to a sum)") {
  Generator g(32);
  for (auto [m, c] : {std::pair<int64_t, int64_t>{1, 1}, {37, 3}, {5, 7}, {33, 1600}, {9, 4097},
                      {64, 384}, {0, 8}, {3, 8}, {200, 1000}, {130, 768}})
    for (DType dt : {DType::f32, DType::bf16}) {
      const Tensor x = rand64({m, c}, g, 3.0).to(dt).to(DType::f64);
      const Tensor w = rand64({c}, g).to(dt).to(DType::f64);
      const Tensor b = rand64({c}, g).to(dt).to(DType::f64);
      const Tensor dy = rand64({m, c}, g).to(dt).to(DType::f64);
      const Tensor prev = rand64({m, c}, g).to(dt).to(DType::f64);
      auto run = [&](DType t, Device d) {
        const DType sd = acc_dtype(t);
        Tensor y = Tensor::empty({m, c}, t, d), mu = Tensor::empty({m}, sd, d),
               rs = Tensor::empty({m}, sd, d);
        layer_norm(x.to(t).to(d), w.to(t).to(d), b.to(t).to(d), 1e-5, y, mu, rs);
        Tensor dx = Tensor::empty({m, c}, t, d), dw = Tensor::empty({c}, t, d),
               db = Tensor::empty({c}, t, d);
        // The backward reads the forward's statistics (each in its own precision).
        layer_norm_backward(dy.to(t).to(d), x.to(t).to(d), w.to(t).to(d), mu, rs, &dx, &dw, &db);
        // dx added to a sum already there (as autograd does for the residual stream).
        Tensor sum = prev.to(t).to(d);
        layer_norm_backward(dy.to(t).to(d), x.to(t).to(d), w.to(t).to(d), mu, rs, &sum, nullptr,
                            nullptr, /*accumulate_dx=*/true);
        return std::vector<Tensor>{y, dx, dw, db, sum};
      };
      const auto gpu = run(dt, kGpu), r64 = run(DType::f64, Device::cpu()),
                 r32 = run(DType::f32, Device::cpu());
      const char* names[] = {"y", "dx", "dw", "db", "prev + dx"};
      // dx's terms are rstd·dy·w; rstd is 1/√eps when a row is constant (C = 1).
      const double dx_terms = m ? max_abs(dy) * max_abs(w) / std::sqrt(1e-5) : 0.0;
      for (int i = 0; i < 5; ++i)
        compare(gpu[i], r64[i], r32[i], dt, i == 2 || i == 3 ? static_cast<double>(m) : static_cast<double>(c),
                std::string("layer_norm ") + names[i] + " " + std::to_string(m) + "x" +
                    std::to_string(c),
                (i == 1 || i == 4) && c == 1 ? dx_terms : 0.0);
    }
}

// f32: the kernels round like the CPU reference (no FMA contraction), so bit for bit; the
// fp32 stream + 16-bit branch: out is the exact res + y·mask rounded once to fp32, dy is
// dout·mask rounded once to the 16-bit type. Odd sizes take the scalar path, multiples of 8
// the 16-byte one; dropout off and on.
FFN_GPU_TEST("dropout_add on the GPU: f32 equals the CPU, fp32 + bf16/f16 within one rounding") {
  Generator g(42);
  for (const Shape& s : {Shape{1, 1}, Shape{7, 13}, Shape{33, 384}, Shape{6, 1000}})
    for (float p : {0.0f, 0.2f}) {
      const DropoutSpec d{p, 21, 6};
      const Tensor res = rand64(s, g).to(DType::f32), dout = rand64(s, g).to(DType::f32);
      const std::string tag = " " + shape_str(s) + " p=" + std::to_string(p);
      {
        const Tensor y = rand64(s, g).to(DType::f32);
        Tensor out = Tensor::empty(s, DType::f32), dy = Tensor::empty(s, DType::f32);
        dropout_add(res, y, d, out);
        dropout_add_backward(dout, d, dy);
        Tensor out_g = Tensor::empty(s, DType::f32, kGpu), dy_g = Tensor::empty(s, DType::f32, kGpu);
        dropout_add(res.to(kGpu), y.to(kGpu), d, out_g);
        dropout_add_backward(dout.to(kGpu), d, dy_g);
        CHECK_MESSAGE(max_abs_diff(out_g.to(Device::cpu()), out) == 0.0, "f32 out", tag);
        CHECK_MESSAGE(max_abs_diff(dy_g.to(Device::cpu()), dy) == 0.0, "f32 dy", tag);
      }
      for (DType dt : {DType::bf16, DType::f16}) {
        const Tensor y = rand64(s, g).to(dt);
        Tensor out_g = Tensor::empty(s, DType::f32, kGpu), dy_g = Tensor::empty(s, dt, kGpu);
        dropout_add(res.to(kGpu), y.to(kGpu), d, out_g);
        dropout_add_backward(dout.to(kGpu), d, dy_g);
        // f64 references of the exact values (same mask: the f64 CPU op).
        Tensor out64 = Tensor::empty(s, DType::f64), dy64 = Tensor::empty(s, DType::f64);
        dropout_add(res.to(DType::f64), y.to(DType::f64), d, out64);
        dropout_add_backward(dout.to(DType::f64), d, dy64);
        const double u = std::ldexp(1.0, dt == DType::bf16 ? -8 : -11);
        CHECK_MESSAGE(max_abs_diff(out_g.to(Device::cpu()).to(DType::f64), out64) <=
                          std::ldexp(1.0, -24) * max_abs(out64),
                      "mixed out ", dtype_name(dt), tag);
        CHECK_MESSAGE(max_abs_diff(dy_g.to(Device::cpu()).to(DType::f64), dy64) <= u * max_abs(dy64),
                      "mixed dy ", dtype_name(dt), tag);
      }
    }
  Tensor out = Tensor::empty({2, 3}, DType::bf16, kGpu);
  CHECK_THROWS_WITH_AS(dropout_add(Tensor::zeros({2, 3}, DType::f16, kGpu),
                                   Tensor::zeros({2, 3}, DType::bf16, kGpu), {}, out),
                       doctest::Contains("[dropout_add] res is f16 but y is bf16"), Error);
}

FFN_GPU_TEST("cross_entropy on the GPU matches the CPU; bad targets are errors") {
  Generator g(33);
  for (auto [n, v] : {std::pair<int64_t, int64_t>{1, 1}, {7, 13}, {129, 65}, {64, 50257}})
    for (DType dt : {DType::f32, DType::bf16}) {
      const Tensor logits = rand64({n, v}, g, 4.0).to(dt).to(DType::f64);
      const Tensor t = ids(n, v, 5);
      auto run = [&](DType ty, Device d) {
        const DType ad = acc_dtype(ty);
        Tensor loss = Tensor::empty({}, ad, d), lse = Tensor::empty({n}, ad, d);
        cross_entropy(logits.to(ty).to(d), t.to(d), loss, lse);
        Tensor dl = Tensor::empty({n, v}, ty, d);
        cross_entropy_backward(logits.to(ty).to(d), t.to(d), lse,
                               Tensor::full({}, 1.5, ad, d), dl);
        return std::vector<Tensor>{loss.reshape({1}), lse, dl};
      };
      const auto gpu = run(dt, kGpu), r64 = run(DType::f64, Device::cpu()),
                 r32 = run(DType::f32, Device::cpu());
      // loss/lse are fp32 on the GPU for every input dtype: compare as f32 results.
      compare(gpu[0], r64[0], r32[0], DType::f32, static_cast<double>(n * v), "xent loss");
      compare(gpu[1], r64[1], r32[1], DType::f32, static_cast<double>(v), "xent lse");
      compare(gpu[2], r64[2], r32[2], dt, static_cast<double>(v), "xent d_logits");
    }
  const Tensor logits = Tensor::zeros({2, 4}, DType::bf16, kGpu);
  Tensor loss = Tensor::empty({}, DType::f32, kGpu), lse = Tensor::empty({2}, DType::f32, kGpu);
  CHECK_THROWS_WITH_AS(
      cross_entropy(logits, Tensor::from_vector({0, 4}, {2}, DType::i32, kGpu), loss, lse),
      doctest::Contains("[cross_entropy] targets[1]=4 is out of range [0, 4)"), Error);
}

FFN_GPU_TEST("causal_softmax on the GPU matches the CPU, dropout mask included") {
  Generator g(34);
  for (auto [b, t] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {2, 64}, {4, 256}})
    for (DType dt : {DType::f32, DType::bf16})
      for (float p : {0.0f, 0.2f}) {
        const DropoutSpec d{p, 5, 9};
        const Tensor s = rand64({b, t, t}, g, 4.0).to(dt).to(DType::f64);
        const Tensor dpd = rand64({b, t, t}, g).to(dt).to(DType::f64);
        auto run = [&](DType ty, Device dev) {
          Tensor pr = Tensor::empty({b, t, t}, ty, dev), pd = Tensor::empty({b, t, t}, ty, dev);
          causal_softmax(s.to(ty).to(dev), 0.125, d, pr, &pd);
          Tensor ds = Tensor::empty({b, t, t}, ty, dev);
          // The backward reads p in the tested precision; feed every path the same p.
          causal_softmax_backward(pr, dpd.to(ty).to(dev), 0.125, d, ds);
          return std::vector<Tensor>{pr, pd, ds};
        };
        const auto gpu = run(dt, kGpu), r64 = run(DType::f64, Device::cpu()),
                   r32 = run(DType::f32, Device::cpu());
        const std::string tag = " b=" + std::to_string(b) + " t=" + std::to_string(t) +
                                " p=" + std::to_string(p);
        compare(gpu[0], r64[0], r32[0], dt, static_cast<double>(t), "softmax p" + tag);
        // pd is p (as stored, rounded) times the mask scale: exactly what bias_dropout makes
        // of the GPU's p, which the attention backward relies on.
        Tensor pd2 = Tensor::empty({b * t, t}, dt, kGpu);
        bias_dropout(gpu[0].reshape({b * t, t}), Tensor(), d, pd2);
        check_close(gpu[1].to(Device::cpu()).to(DType::f64),
                    pd2.reshape({b, t, t}).to(Device::cpu()).to(DType::f64), 0, 0,
                    "softmax pd == bias_dropout(p)" + tag);
        // The mask itself: zero exactly where the CPU's is zero.
        const auto gv = gpu[1].to(Device::cpu()).to_vector(), cv = r64[1].to_vector();
        int64_t mismatched = 0;
        for (size_t i = 0; i < gv.size(); ++i) mismatched += (gv[i] == 0.0) != (cv[i] == 0.0);
        CHECK_MESSAGE(mismatched == 0, "dropout mask differs from the CPU's", tag);
        if (dt == DType::f32)  // bf16 backward inputs differ (p is rounded differently)
          compare(gpu[2], r64[2], r32[2], dt, static_cast<double>(t), "softmax ds" + tag,
                  t == 1 ? 0.125 * max_abs(dpd) * 1.25 : 0.0);
      }
}

FFN_GPU_TEST("causal_attention and bmm on the GPU match the CPU (forward and backward)") {
  Generator g(35);
  for (auto [b, t, c, h] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 1, 8, 1},
                            {2, 7, 12, 3}, {2, 64, 384, 6}})
    for (float p : {0.0f, 0.2f}) {
      const DropoutSpec d{p, 3, 4};
      const Tensor qkv = rand64({b, t, 3 * c}, g);
      const Tensor dy = rand64({b, t, c}, g);
      auto run = [&](Device dev) {
        Var x(qkv.to(DType::f32).to(dev), true);
        Var y = fn::causal_attention(x, h, d);
        y.backward(dy.to(DType::f32).to(dev));
        return std::vector<Tensor>{y.value(), x.grad()};
      };
      const auto gpu = run(kGpu), cpu = run(Device::cpu());
      const double tol = 1e-5 * static_cast<double>(t + c);
      check_close(gpu[0].to(Device::cpu()), cpu[0], tol, 1e-4, "attention y");
      check_close(gpu[1].to(Device::cpu()), cpu[1], tol, 1e-4, "attention dqkv");
    }
  const Tensor a = rand64({3, 5, 4}, g).to(DType::f32), bb = rand64({3, 6, 4}, g).to(DType::f32);
  check_close(bmm(a.to(kGpu), bb.to(kGpu), {.trans_b = true}).to(Device::cpu()),
              bmm(a, bb, {.trans_b = true}), 1e-6, 1e-5, "bmm");
}

// The flash-style kernels against the f64 reference on the same rounded inputs, with the
// bf16/f16 rule: at most 2x the error of the same math done naively at that precision —
// here the composite path (bmm, causal_softmax with rounded scores and probabilities, bmm)
// run on the GPU in the same dtype. Odd T (partial tiles, mask draws across Philox blocks),
// T across many 64-tiles, head sizes 32/64/128, dropout off and on.
FFN_GPU_TEST("fused attention on the GPU matches the f64 reference (bf16/f16, dropout)") {
  Generator g(38);
  struct Case {
    int64_t b, t, h, d;
  };
  for (Case cs : {Case{1, 1, 1, 64}, Case{2, 7, 3, 32}, Case{1, 100, 2, 64}, Case{2, 256, 3, 64},
                  Case{1, 130, 2, 128}, Case{1, 1100, 1, 64}})
    for (DType dt : {DType::bf16, DType::f16})
      for (float p : {0.0f, 0.2f}) {
        CAPTURE(cs.t);
        CAPTURE(cs.d);
        CAPTURE(p);
        std::string tag = " ";
        tag += dtype_name(dt);
        tag += " T=" + std::to_string(cs.t);
        REQUIRE(fused_attention_supported(dt, cs.t, cs.d));
        const int64_t c = cs.h * cs.d;
        const DropoutSpec d{p, 5, 9};
        const Tensor qkv = rand64({cs.b, cs.t, 3 * c}, g).to(dt).to(DType::f64);
        const Tensor dy = rand64({cs.b, cs.t, c}, g).to(dt).to(DType::f64);
        auto run = [&](Device dev, DType type, bool fused) {
          Var x(qkv.to(type).to(dev), true);
          Var y = fn::causal_attention(x, cs.h, d, fused);
          y.backward(dy.to(type).to(dev));
          return std::vector<Tensor>{y.value().to(Device::cpu()).to(DType::f64),
                                     x.grad().to(Device::cpu()).to(DType::f64)};
        };
        // f64 reference: the op's CPU reference (equal to the composite path, CPU tests).
        const double scale = 1.0 / std::sqrt(static_cast<double>(cs.d));
        Tensor y64 = Tensor::empty({cs.b, cs.t, c}, DType::f64);
        Tensor lse64 = Tensor::empty({cs.b * cs.h, cs.t}, DType::f32);
        Tensor dqkv64 = Tensor::empty(qkv.shape(), DType::f64);
        fused_attention(qkv, cs.h, scale, d, y64, lse64);
        fused_attention_backward(qkv, y64, dy, lse64, cs.h, scale, d, dqkv64);
        // The kernels themselves (every case), and the layer (which routes to them where
        // fused_attention_preferred) bit for bit equal to them.
        Tensor y = Tensor::empty({cs.b, cs.t, c}, dt, kGpu);
        Tensor lse = Tensor::empty({cs.b * cs.h, cs.t}, DType::f32, kGpu);
        const Tensor xg = qkv.to(dt).to(kGpu), dyg = dy.to(dt).to(kGpu);
        fused_attention(xg, cs.h, scale, d, y, lse);
        Tensor g1 = Tensor::empty(xg.shape(), dt, kGpu);
        fused_attention_backward(xg, y, dyg, lse, cs.h, scale, d, g1);
        const std::vector<Tensor> fused = {y.to(Device::cpu()).to(DType::f64),
                                           g1.to(Device::cpu()).to(DType::f64)};
        const auto naive = run(kGpu, dt, false);
        if (fused_attention_preferred(dt, cs.t, cs.d)) {
          const auto layer = run(kGpu, dt, true);
          CHECK_MESSAGE(max_abs_diff(layer[0], fused[0]) == 0.0, "layer y == kernel y", tag);
          CHECK_MESSAGE(max_abs_diff(layer[1], fused[1]) == 0.0, "layer dqkv == kernel dqkv", tag);
        }
        // ds_ij = p_ij (dp_ij − D_i) uses D_i = dy_i·y_i with the stored 16-bit y (as
        // FlashAttention does): its rounding, at most u·Σ_d|dy_id·y_id| (u = 2^-8 for bf16,
        // 2^-11 for f16), reaches dq_i (and dk_j) through scale·Σ_j p_ij·k_j, so the
        // gradient may be off by u·scale·max_i Σ_d|dy·y|·max|qkv| beyond the naive error
        // (it matters where the exact ds is ~0, e.g. T = 1, which the naive path gets exact).
        double dmax = 0;
        {
          const std::vector<double> yv = y64.to_vector(), gv = dy.to_vector();
          for (size_t r = 0; r < yv.size() / cs.d; ++r) {
            double acc = 0;
            for (int64_t k = 0; k < cs.d; ++k) acc += std::abs(yv[r * cs.d + k] * gv[r * cs.d + k]);
            dmax = std::max(dmax, acc);
          }
        }
        const double u = std::ldexp(1.0, dt == DType::bf16 ? -8 : -11);
        const double d_term = u * dmax * max_abs(qkv) / std::sqrt(static_cast<double>(cs.d));
        const char* names[2] = {"y", "dqkv"};
        const Tensor ref[2] = {y64, dqkv64};
        for (int k = 0; k < 2; ++k) {
          for (double v : fused[k].to_vector()) REQUIRE_MESSAGE(std::isfinite(v), names[k], tag);
          const double err = max_abs_diff(fused[k], ref[k]);
          const double naive_err = max_abs_diff(naive[k], ref[k]);
          CHECK_MESSAGE(err <= 2 * naive_err + (k == 1 ? d_term : 0.0) + 1e-6 * max_abs(ref[k]),
                        "fused attention ", names[k], tag, " p=", p, ": error ", err, " vs naive ",
                        naive_err, " (D term ", d_term, ")");
        }
        // lse: fp32 statistics of the same scores.
        check_close(lse.to(Device::cpu()), lse64, 1e-4, 1e-5, "lse" + tag);
        // Deterministic: a second backward gives the same bits.
        Tensor g2 = Tensor::empty(xg.shape(), dt, kGpu);
        fused_attention_backward(xg, y, dyg, lse, cs.h, scale, d, g2);
        CHECK_MESSAGE(max_abs_diff(g1.to(Device::cpu()).to(DType::f64),
                                   g2.to(Device::cpu()).to(DType::f64)) == 0.0,
                      "backward is deterministic", tag);
      }
  CHECK_FALSE(fused_attention_supported(DType::f32, 256, 64));
  CHECK_FALSE(fused_attention_supported(DType::bf16, 256, 48));
  CHECK(fused_attention_preferred(DType::bf16, 256, 64));     // shakespeare_char
  CHECK(fused_attention_preferred(DType::bf16, 1024, 64));  // gpt2_small
  Tensor y = Tensor::empty({1, 4, 48}, DType::bf16, kGpu),
         lse = Tensor::empty({1, 4}, DType::f32, kGpu);
  CHECK_THROWS_WITH_AS(
      fused_attention(Tensor::zeros({1, 4, 144}, DType::bf16, kGpu), 1, 0.1, {}, y, lse),
      doctest::Contains("[fused_attention] the CUDA kernel takes bf16/f16, head_dim 32, 64 or 128"),
      Error);
}

// The residual stream's mixed add (fp32 + bf16 -> fp32) in one pass: both sides round the
// exact sum once to fp32, so the GPU equals the CPU bit for bit.
FFN_GPU_TEST("Tensor::plus on the GPU equals the CPU (f32 + bf16, f32 + f16, f32 + f32)") {
  Generator g(39);
  for (auto [da, db] : {std::pair<DType, DType>{DType::f32, DType::bf16}, {DType::f32, DType::f16},
                        {DType::f32, DType::f32}}) {
    const Tensor a = rand64({1000003}, g).to(da), b = rand64({1000003}, g).to(db);
    const Tensor gpu = a.to(kGpu).plus(b.to(kGpu)).to(Device::cpu());
    CHECK(gpu.dtype() == da);
    CHECK(max_abs_diff(gpu.to(DType::f64), a.plus(b).to(DType::f64)) == 0.0);
  }
}

FFN_GPU_TEST("multi-tensor AdamW and grad norm on the GPU match the CPU") {
  Generator g(36);
  // Sizes around the kernel's chunking (16384) and table limits (24 tensors, 256 blocks).
  std::vector<int64_t> sizes = {1, 3, 16384, 16385, 100000};
  for (int i = 0; i < 30; ++i) sizes.push_back(7 + 13 * i);
  sizes.push_back(16384 * 300 + 5);  // more chunks than one launch holds
  for (DType dt : {DType::f32, DType::bf16}) {
    std::vector<AdamWSlot> gpu, cpu;
    std::vector<Tensor> ggrads, cgrads;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const int64_t n = sizes[k];
      const Tensor w = rand64({n}, g).to(dt), gr = rand64({n}, g, 0.1).to(dt);
      for (int side = 0; side < 2; ++side) {
        const Device dev = side ? Device::cpu() : kGpu;
        AdamWSlot s;
        s.param = w.to(dev).clone();
        s.grad = gr.to(dev).clone();
        s.m = Tensor::zeros({n}, DType::f32, dev);
        s.v = Tensor::zeros({n}, DType::f32, dev);
        if (dt != DType::f32) s.master = w.to(DType::f32).to(dev);
        s.decay = k % 2 == 0;
        (side ? cpu : gpu).push_back(s);
        (side ? cgrads : ggrads).push_back(s.grad);
      }
    }
    const AdamWHyper h{1e-2, 0.9, 0.95, 1e-8, 0.1};
    for (int step = 1; step <= 3; ++step) {
      adamw_step(gpu, h, step, 0.5);
      adamw_step(cpu, h, step, 0.5);
    }
    for (size_t k = 0; k < sizes.size(); k += 7) {
      const Tensor& gw = gpu[k].master.defined() ? gpu[k].master : gpu[k].param;
      const Tensor& cw = cpu[k].master.defined() ? cpu[k].master : cpu[k].param;
      check_close(gw.to(Device::cpu()), cw, 1e-6, 1e-5, "adamw weights " + std::to_string(k));
      check_close(gpu[k].v.to(Device::cpu()), cpu[k].v, 1e-9, 1e-5, "adamw v");
    }
    const double gn = global_grad_norm(ggrads), cn = global_grad_norm(cgrads);
    CHECK(gn == doctest::Approx(cn).epsilon(1e-5));
    CHECK(global_grad_norm(ggrads) == gn);  // bitwise reproducible
    // The device-side decision (Note [Device-side step decision]) matches the CPU's
    // arithmetic on the same Σg², and the decided step is bitwise the explicit one.
    const Tensor ss = global_grad_sumsq(ggrads);
    Tensor gdec = Tensor::zeros({kDecisionSize}, DType::f64, kGpu);
    Tensor cdec = Tensor::zeros({kDecisionSize}, DType::f64);
    const AdamWDecide d{4.0, 0.05, h.beta1, h.beta2};
    for (int step = 1; step <= 2; ++step) {
      adamw_decide(Tensor::full({}, 2.5, DType::f32, kGpu), ss, d, gdec);
      adamw_decide(Tensor::full({}, 2.5, DType::f32), ss.to(Device::cpu()), d, cdec);
      const std::vector<double> gv = gdec.to_vector(), cv = cdec.to_vector();
      for (int i : {0, 1, 4, 5, 6}) CHECK(gv[i] == cv[i]);
      for (int i : {2, 3}) CHECK(gv[i] == doctest::Approx(cv[i]).epsilon(1e-15));
      std::vector<AdamWSlot> twin;
      for (const AdamWSlot& sl : gpu) {
        AdamWSlot t = sl;
        t.param = sl.param.clone(), t.m = sl.m.clone(), t.v = sl.v.clone();
        if (sl.master.defined()) t.master = sl.master.clone();
        twin.push_back(t);
      }
      adamw_step(gpu, h, gdec);
      adamw_step(twin, h, static_cast<int64_t>(gv[0]), gv[4]);
      for (size_t k = 0; k < sizes.size(); k += 5)
        CHECK(gpu[k].param.to_vector() == twin[k].param.to_vector());
    }
    const auto before = gpu[3].param.to_vector();
    adamw_decide(Tensor::full({}, NAN, DType::f32, kGpu), ss, d, gdec);
    adamw_step(gpu, h, gdec);
    CHECK(gpu[3].param.to_vector() == before);
    CHECK(gdec.to_vector()[0] == 2.0);
  }
}

FFN_GPU_TEST("mixed-precision LayerNorm (fp32 x, bf16 w/y) and residual add on the GPU") {
  Generator g(37);
  for (int64_t c : {7, 384})
    for (int64_t m : {5, 130}) {
      const Tensor x = rand64({m, c}, g, 3.0);  // fp32 stream: rounded to f32 only
      const Tensor w = rand64({c}, g).to(DType::bf16).to(DType::f64);
      const Tensor b = rand64({c}, g).to(DType::bf16).to(DType::f64);
      const Tensor dy = rand64({m, c}, g).to(DType::bf16).to(DType::f64);
      const Tensor x32 = x.to(DType::f32).to(DType::f64);
      Tensor y = Tensor::empty({m, c}, DType::bf16, kGpu), mu = Tensor::empty({m}, DType::f32, kGpu),
             rs = Tensor::empty({m}, DType::f32, kGpu);
      layer_norm(x.to(DType::f32).to(kGpu), w.to(DType::bf16).to(kGpu), b.to(DType::bf16).to(kGpu),
                 1e-5, y, mu, rs);
      Tensor dx = Tensor::empty({m, c}, DType::f32, kGpu), dw = Tensor::empty({c}, DType::bf16, kGpu),
             db = Tensor::empty({c}, DType::bf16, kGpu);
      layer_norm_backward(dy.to(DType::bf16).to(kGpu), x.to(DType::f32).to(kGpu),
                          w.to(DType::bf16).to(kGpu), mu, rs, &dx, &dw, &db);
      auto ref = [&](DType t) {
        const DType sd = acc_dtype(t);
        Tensor ry = Tensor::empty({m, c}, t), rm = Tensor::empty({m}, sd), rr = Tensor::empty({m}, sd);
        layer_norm(x32.to(t), w.to(t), b.to(t), 1e-5, ry, rm, rr);
        Tensor rdx = Tensor::empty({m, c}, t), rdw = Tensor::empty({c}, t), rdb = Tensor::empty({c}, t);
        layer_norm_backward(dy.to(t), x32.to(t), w.to(t), rm, rr, &rdx, &rdw, &rdb);
        return std::vector<Tensor>{ry, rdx, rdw, rdb};
      };
      const auto r64 = ref(DType::f64), r32 = ref(DType::f32);
      const std::string tag = " " + std::to_string(m) + "x" + std::to_string(c);
      compare(y, r64[0], r32[0], DType::bf16, static_cast<double>(c), "mixed ln y" + tag);
      compare(dx, r64[1], r32[1], DType::f32, static_cast<double>(c), "mixed ln dx (fp32)" + tag);
      compare(dw, r64[2], r32[2], DType::bf16, static_cast<double>(m), "mixed ln dw" + tag);
      compare(db, r64[3], r32[3], DType::bf16, static_cast<double>(m), "mixed ln db" + tag);
    }
  // fp32 + bf16 residual add: fp32 out; each gradient in its input's dtype.
  Var a(Tensor::full({4}, 1.0, DType::f32, kGpu), true), h(Tensor::full({4}, 0.5, DType::bf16, kGpu), true);
  Var s = fn::add(a, h);
  CHECK(s.value().dtype() == DType::f32);
  s.backward(Tensor::full({4}, 2.0, DType::f32, kGpu));
  CHECK(a.grad().dtype() == DType::f32);
  CHECK(h.grad().dtype() == DType::bf16);
  CHECK(h.grad().to_vector() == std::vector<double>{2, 2, 2, 2});
}
