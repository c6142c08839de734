// tests/test_kernels.cpp — every op's CPU reference against direct formulas and
// finite differences, and its argument checks. (CUDA kernels: tests/test_kernels_cuda.cpp.)
#include <cmath>

#include "kernels/attention.h"
#include "kernels/bias_act_dropout.h"
#include "kernels/gemm.h"
#include "kernels/bias_glu_dropout.h"
#include "kernels/mse_loss.h"
#include "layers/functional.h"
#include "tests/test_util.h"

using namespace ffn;
using ffn::test::check_close;
using ffn::test::gradcheck;
using ffn::test::rand64;

namespace {

// Naive triple loop: the reference's reference.
Tensor naive_gemm(const Tensor& a, bool ta, const Tensor& b, bool tb) {
  const auto va = a.to_vector(), vb = b.to_vector();
  const int64_t m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1);
  const int64_t n = tb ? b.size(0) : b.size(1);
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = ta ? va[p * a.size(1) + i] : va[i * a.size(1) + p];
        const double y = tb ? vb[j * b.size(1) + p] : vb[p * b.size(1) + j];
        s += x * y;
      }
      c[i * n + j] = s;
    }
  return Tensor::from_vector(c, {m, n}, DType::f64);
}

const Shape kShapes[] = {{1, 1}, {7, 13}, {129, 257}};

}  // namespace

TEST_CASE("gemm matches a naive product for every transpose combination") {
  Generator g(3);
  for (DType dt : {DType::f64, DType::f32})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int64_t m = 37, k = 19, n = 23;
        Tensor a = rand64(ta ? Shape{k, m} : Shape{m, k}, g).to(dt);
        Tensor b = rand64(tb ? Shape{n, k} : Shape{k, n}, g).to(dt);
        Tensor bias = rand64({n}, g).to(dt);
        Tensor c = matmul(a, b, {.trans_a = ta, .trans_b = tb, .bias = bias});
        Tensor ref = naive_gemm(a.to(DType::f64), ta, b.to(DType::f64), tb);
        auto rv = ref.to_vector();
        const auto bv = bias.to(DType::f64).to_vector();
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) rv[i * n + j] += bv[j];
        // fp32: 1e-5 relative scaled by the reduction length (DESIGN.md).
        const double tol = dt == DType::f64 ? 1e-12 : 1e-6 * k;
        check_close(
            c, Tensor::from_vector(rv, {m, n}, DType::f64), tol, tol,
            std::string("gemm ") + dtype_name(dt) + (ta ? " Aᵀ" : " A") + (tb ? "·Bᵀ" : "·B"));
      }
  // alpha/beta accumulate into c.
  Tensor a = rand64({4, 3}, g), b = rand64({3, 5}, g), c = rand64({4, 5}, g);
  Tensor expect = naive_gemm(a, false, b, false);
  auto ev = expect.to_vector();
  const auto cv = c.to_vector();
  for (size_t i = 0; i < ev.size(); ++i) ev[i] = 2.0 * ev[i] + 0.5 * cv[i];
  gemm(a, b, c, {.alpha = 2.0, .beta = 0.5});
  check_close(c, Tensor::from_vector(ev, {4, 5}, DType::f64), 1e-12, 1e-12, "gemm alpha/beta");
}

TEST_CASE("gemm epilogues: gelu_aux_bias, dgelu_bgrad, bgrad_a") {
  Generator g(9);
  const int64_t m = 13, k = 7, n = 16;
  const Tensor a = rand64({m, k}, g), b = rand64({n, k}, g), bias = rand64({n}, g);
  const Tensor plain = matmul(a, b, {.trans_b = true});
  const auto pv = plain.to_vector(), bv = bias.to_vector();
  // gelu_aux_bias: aux = p + bias, c = gelu_tanh(aux)
  Tensor aux = Tensor::empty({m, n}, DType::f64);
  const Tensor c1 = matmul(
      a, b, {.trans_b = true, .bias = bias, .epilogue = GemmEpilogue::gelu_aux_bias, .aux = aux});
  std::vector<double> ea(m * n), ec(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      ea[i * n + j] = pv[i * n + j] + bv[j];
      ec[i * n + j] = act_math::value(ea[i * n + j], Activation::gelu_tanh);
    }
  check_close(aux, Tensor::from_vector(ea, {m, n}, DType::f64), 1e-14, 1e-12, "gelu_aux_bias aux");
  check_close(c1, Tensor::from_vector(ec, {m, n}, DType::f64), 1e-14, 1e-12, "gelu_aux_bias c");
  // dgelu_bgrad: c = p ⊙ gelu'(aux), bias_grad = Σ_rows c
  Tensor db = Tensor::empty({n}, DType::f64);
  const Tensor c2 = matmul(
      a, b, {.trans_b = true, .epilogue = GemmEpilogue::dgelu_bgrad, .aux = aux, .bias_grad = db});
  std::vector<double> ed(m * n), edb(n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      ed[i * n + j] = pv[i * n + j] * act_math::grad(ea[i * n + j], Activation::gelu_tanh);
      edb[j] += ed[i * n + j];
    }
  check_close(c2, Tensor::from_vector(ed, {m, n}, DType::f64), 1e-14, 1e-12, "dgelu_bgrad c");
  check_close(db, Tensor::from_vector(edb, {n}, DType::f64), 1e-12, 1e-12, "dgelu_bgrad bias_grad");
  // bgrad_a on dW = dyᵀ·h: bias_grad = Σ_rows dy (the db of a linear layer)
  const Tensor dy = rand64({m, n}, g), h = rand64({m, k}, g);
  Tensor db2 = Tensor::empty({n}, DType::f64), db2_ref = Tensor::empty({n}, DType::f64);
  const Tensor dw =
      matmul(dy, h, {.trans_a = true, .epilogue = GemmEpilogue::bgrad_a, .bias_grad = db2});
  bias_grad(dy, db2_ref);
  check_close(db2, db2_ref, 1e-12, 1e-12, "bgrad_a");
  check_close(dw, matmul(dy, h, {.trans_a = true}), 0, 0, "bgrad_a product");
  Tensor cc = Tensor::zeros({m, n}, DType::f64);
  CHECK_THROWS_WITH_AS(
      gemm(a, b, cc,
           {.trans_b = true, .beta = 1.0, .epilogue = GemmEpilogue::dgelu_bgrad, .aux = aux}),
      doctest::Contains("[gemm] the GELU epilogues need beta = 0"), Error);
  CHECK_THROWS_WITH_AS(matmul(a, b, {.trans_b = true, .epilogue = GemmEpilogue::bgrad_a}),
                       doctest::Contains("[gemm] bias_grad is an undefined tensor"), Error);
}

TEST_CASE("gemm rejects mismatched shapes, dtypes and ranks") {
  Tensor a = Tensor::zeros({4, 3}), b = Tensor::zeros({5, 2});
  CHECK_THROWS_WITH_AS(matmul(a, b), doctest::Contains("[gemm] inner dimensions differ"), Error);
  CHECK_THROWS_WITH_AS(matmul(a, Tensor::zeros({3, 2}, DType::f64)),
                       doctest::Contains("[gemm] dtype mismatch: a is f32 but b is f64"), Error);
  CHECK_THROWS_WITH_AS(matmul(Tensor::zeros({4}), b), doctest::Contains("[matmul] a must be 2-D"),
                       Error);
  Tensor c = Tensor::zeros({4, 4});
  CHECK_THROWS_WITH_AS(gemm(a, Tensor::zeros({3, 2}), c),
                       doctest::Contains("[gemm] c.shape=[4, 4] but op(a)·op(b) is [4, 2]"), Error);
  CHECK_THROWS_WITH_AS(
      matmul(Tensor::zeros({4, 3}, DType::bf16), Tensor::zeros({3, 2}, DType::bf16)),
      doctest::Contains("[gemm] dtype bf16 is not supported here"), Error);
}

TEST_CASE("bias_dropout and bias_dropout_backward follow their formulas") {
  Generator g(4);
  for (const Shape& s : kShapes) {
    const Tensor z = rand64(s, g), b = rand64({s[1]}, g), dy = rand64(s, g);
    for (float p : {0.0f, 0.3f, 1.0f}) {
      const DropoutSpec d{p, 99, 3};
      Tensor y = Tensor::empty(s, DType::f64), dz = Tensor::empty(s, DType::f64),
             db = Tensor::empty({s[1]}, DType::f64);
      bias_dropout(z, b, d, y);
      bias_dropout_backward(dy, d, &dz, &db);
      const auto zv = z.to_vector(), bv = b.to_vector(), gv = dy.to_vector();
      std::vector<double> ye(zv.size()), dze(zv.size()), dbe(s[1], 0.0);
      for (int64_t r = 0; r < s[0]; ++r)
        for (int64_t c = 0; c < s[1]; ++c) {
          const int64_t i = r * s[1] + c;
          const double f = d.keep(i) ? d.scale() : 0.0;
          ye[i] = (zv[i] + bv[c]) * f;
          dze[i] = gv[i] * f;
          dbe[c] += dze[i];
        }
      check_close(y, Tensor::from_vector(ye, s, DType::f64), 1e-12, 1e-12, "bias_dropout");
      check_close(dz, Tensor::from_vector(dze, s, DType::f64), 1e-12, 1e-12, "bias_dropout_backward dz");
      check_close(db, Tensor::from_vector(dbe, {s[1]}, DType::f64), 1e-10, 1e-10,
                  "bias_dropout_backward db");
      if (p == 1.0f) CHECK(ffn::test::max_abs_diff(y, Tensor::zeros(s, DType::f64)) == 0.0);
      // db alone (no dz): the same sums.
      Tensor db_only = Tensor::empty({s[1]}, DType::f64);
      bias_dropout_backward(dy, d, nullptr, &db_only);
      CHECK(ffn::test::max_abs_diff(db_only, db) == 0.0);
    }
  }
}

TEST_CASE("a CPU-only build's cuda:: backend throws naming the op") {
  if (built_with_cuda()) {
    MESSAGE("built with CUDA: the stub backend (kernels/cuda_stub.cpp) is not linked");
    return;
  }
  Tensor a = Tensor::zeros({2, 2}), c = Tensor::zeros({2, 2});
  CHECK_THROWS_WITH_AS(cuda::gemm(a, a, c, {}), doctest::Contains("[gemm] built without CUDA"),
                       Error);
  CHECK_THROWS_WITH_AS(cuda::bias_act_dropout(a, {}, Activation::silu, {}, c),
                       doctest::Contains("[bias_act_dropout] built without CUDA"), Error);
  CHECK(!fused_attention_supported(DType::bf16, 64, 64));
  CHECK_THROWS_WITH_AS(Tensor::zeros({2}, DType::f32, Device::cuda(0)),
                       doctest::Contains("[alloc] a CUDA tensor was requested but"), Error);
}

TEST_CASE("activation values and derivatives") {
  // Reference values: erf/tanh GELU and SiLU at x = 1 (computed with mpmath-level precision).
  CHECK(act_math::value(1.0, Activation::gelu_erf) ==
        doctest::Approx(0.8413447460685429).epsilon(1e-15));
  CHECK(act_math::value(1.0, Activation::gelu_tanh) ==
        doctest::Approx(0.8411919906082768).epsilon(1e-15));
  CHECK(act_math::value(1.0, Activation::silu) ==
        doctest::Approx(0.7310585786300049).epsilon(1e-15));
  CHECK(act_math::value(-2.5, Activation::identity) == -2.5);
  CHECK(act_math::grad(-2.5, Activation::identity) == 1.0);
  for (Activation a :
       {Activation::gelu_erf, Activation::gelu_tanh, Activation::silu, Activation::identity})
    for (double x : {-5.0, -1.3, -1e-3, 0.0, 0.7, 2.0, 9.0}) {
      const double h = 1e-6;
      const double num = (act_math::value(x + h, a) - act_math::value(x - h, a)) / (2 * h);
      INFO(activation_name(a), " at ", x);
      CHECK(act_math::grad(x, a) == doctest::Approx(num).epsilon(1e-7));
    }
  for (Activation a :
       {Activation::gelu_erf, Activation::gelu_tanh, Activation::silu, Activation::identity})
    for (double x : {-30.0, -2.5, 0.0, 0.3, 4.0}) {
      double v = 0, g = 0;
      act_math::value_grad(x, a, v, g);
      CHECK(v == doctest::Approx(act_math::value(x, a)).epsilon(1e-15));
      CHECK(g == doctest::Approx(act_math::grad(x, a)).epsilon(1e-15));
    }
  CHECK(parse_activation("gelu") == Activation::gelu_erf);
  CHECK_THROWS_WITH_AS(parse_activation("relu6"), doctest::Contains("unknown activation 'relu6'"),
                       Error);
}

TEST_CASE("bias_act_dropout and bias_act_dropout_backward follow their formulas") {
  Generator g(5);
  for (Activation act : {Activation::gelu_erf, Activation::gelu_tanh})
    for (const Shape& s : kShapes) {
      const Tensor z = rand64(s, g, 3.0), b = rand64({s[1]}, g), dhd = rand64(s, g);
      const DropoutSpec d{0.25f, 11, 2};
      Tensor hd = Tensor::empty(s, DType::f64), dpre = Tensor::empty(s, DType::f64),
             db = Tensor::empty({s[1]}, DType::f64), hd2 = Tensor::empty(s, DType::f64);
      bias_act_dropout(z, b, act, d, hd);
      bias_act_dropout_backward(dhd, z, b, act, d, dpre, &db, &hd2);
      const auto zv = z.to_vector(), bv = b.to_vector(), gv = dhd.to_vector();
      std::vector<double> he(zv.size()), de(zv.size()), dbe(s[1], 0.0);
      for (int64_t r = 0; r < s[0]; ++r)
        for (int64_t c = 0; c < s[1]; ++c) {
          const int64_t i = r * s[1] + c;
          const double pre = zv[i] + bv[c], f = d.keep(i) ? d.scale() : 0.0;
          he[i] = act_math::value(pre, act) * f;
          de[i] = gv[i] * f * act_math::grad(pre, act);
          dbe[c] += de[i];
        }
      check_close(hd, Tensor::from_vector(he, s, DType::f64), 1e-14, 1e-12, "bias_act_dropout");
      check_close(hd2, hd, 0, 0, "recomputed hd is bit-identical");
      check_close(dpre, Tensor::from_vector(de, s, DType::f64), 1e-14, 1e-12, "dpre");
      check_close(db, Tensor::from_vector(dbe, {s[1]}, DType::f64), 1e-10, 1e-10, "db");
    }
}

TEST_CASE("bias_glu_dropout and bias_glu_dropout_backward follow their formulas") {
  Generator g(6);
  for (Activation act : {Activation::gelu_tanh, Activation::silu})
    for (const Shape& s : {Shape{1, 2}, Shape{7, 26}, Shape{129, 514}}) {
      const int64_t h = s[1] / 2;
      const Tensor z = rand64(s, g, 2.0), b = rand64({s[1]}, g), dout = rand64({s[0], h}, g);
      const DropoutSpec d{0.2f, 5, 9};
      Tensor out = Tensor::empty({s[0], h}, DType::f64), dz = Tensor::empty(s, DType::f64),
             db = Tensor::empty({s[1]}, DType::f64), out2 = Tensor::empty({s[0], h}, DType::f64);
      bias_glu_dropout(z, b, act, d, out);
      bias_glu_dropout_backward(dout, z, b, act, d, dz, &db, &out2);
      const auto zv = z.to_vector(), bv = b.to_vector(), gv = dout.to_vector();
      std::vector<double> oe(s[0] * h), dze(zv.size()), dbe(s[1], 0.0);
      for (int64_t r = 0; r < s[0]; ++r)
        for (int64_t c = 0; c < h; ++c) {
          const int64_t i = r * h + c;
          const double v = zv[r * s[1] + c] + bv[c], gt = zv[r * s[1] + h + c] + bv[h + c];
          const double f = d.keep(i) ? d.scale() : 0.0;
          oe[i] = v * act_math::value(gt, act) * f;
          dze[r * s[1] + c] = gv[i] * f * act_math::value(gt, act);
          dze[r * s[1] + h + c] = gv[i] * f * v * act_math::grad(gt, act);
          dbe[c] += dze[r * s[1] + c];
          dbe[h + c] += dze[r * s[1] + h + c];
        }
      check_close(out, Tensor::from_vector(oe, {s[0], h}, DType::f64), 1e-14, 1e-12, "glu out");
      check_close(out2, out, 0, 0, "recomputed glu out is bit-identical");
      check_close(dz, Tensor::from_vector(dze, s, DType::f64), 1e-14, 1e-12, "glu dz");
      check_close(db, Tensor::from_vector(dbe, {s[1]}, DType::f64), 1e-10, 1e-10, "glu db");
    }
  Tensor odd = Tensor::zeros({2, 5}, DType::f64), o = Tensor::zeros({2, 2}, DType::f64);
  CHECK_THROWS_WITH_AS(bias_glu_dropout(odd, {}, Activation::silu, {}, o),
                       doctest::Contains("[bias_glu_dropout] z.shape[-1]=5 must be even"), Error);
}

TEST_CASE("fused elementwise ops reject bad arguments") {
  Tensor z = Tensor::zeros({3, 4}, DType::f64), y = Tensor::zeros({3, 4}, DType::f64);
  CHECK_THROWS_WITH_AS(bias_dropout(z, Tensor::zeros({5}, DType::f64), {}, y),
                       doctest::Contains("[bias_dropout] b.shape=[5] but expected [4]"), Error);
  CHECK_THROWS_WITH_AS(bias_dropout(z, {}, {-0.1f, 0, 0}, y),
                       doctest::Contains("[bias_dropout] dropout p must be in [0, 1], got -0.1"),
                       Error);
  CHECK_THROWS_WITH_AS(bias_dropout(z, {}, {1.5f, 0, 0}, y), doctest::Contains("got 1.5"), Error);
  Tensor y32 = Tensor::zeros({3, 4}, DType::f32);
  CHECK_THROWS_WITH_AS(bias_act_dropout(z, {}, Activation::gelu_erf, {}, y32),
                       doctest::Contains("[bias_act_dropout] dtype mismatch: hd is f32"), Error);
  Tensor small = Tensor::zeros({3, 3}, DType::f64);
  CHECK_THROWS_WITH_AS(
      bias_act_dropout_backward(small, z, {}, Activation::gelu_erf, {}, y, nullptr, nullptr),
      doctest::Contains("[bias_act_dropout_backward] dhd.shape=[3, 3] but expected [3, 4]"), Error);
  CHECK_THROWS_WITH_AS(bias_dropout(Tensor::zeros({12}, DType::f64), {}, {}, y),
                       doctest::Contains("[bias_dropout] z must be 2-D, got shape [12]"), Error);
}

TEST_CASE("mse_loss value and gradient") {
  Generator g(7);
  const Tensor p = rand64({5, 3}, g), t = rand64({5, 3}, g);
  Tensor loss = Tensor::empty({}, DType::f64);
  mse_loss(p, t, loss);
  const auto pv = p.to_vector(), tv = t.to_vector();
  double s = 0;
  for (size_t i = 0; i < pv.size(); ++i) s += (pv[i] - tv[i]) * (pv[i] - tv[i]);
  CHECK(loss.item() == doctest::Approx(s / 15).epsilon(1e-14));
  gradcheck([&](const std::vector<Var>& v) { return fn::mse_loss(v[0], t); }, {p}, {"pred"});
  CHECK_THROWS_WITH_AS(mse_loss(p, Tensor::zeros({3, 5}, DType::f64), loss),
                       doctest::Contains("[mse_loss] pred.shape=[5, 3] != target.shape=[3, 5]"),
                       Error);
}

// The ops' backward formulas against finite differences, each op as its own node:
// fn::ffn with only b1 is bias_act_dropout (gated: bias_glu_dropout), with only W2/b2
// it is the fc2 half (welder_fc2), fn::dropout is bias_dropout.
TEST_CASE("fused ops pass finite-difference gradient checks") {
  Generator g(8);
  const Shape shapes[] = {{1, 1}, {7, 13}, {129, 257}, {3, 5, 7}};
  for (const Shape& s : shapes)
    for (float p : {0.0f, 0.3f}) {
      const int64_t n = s.back();
      const std::string shape = shape_str(s);
      CAPTURE(shape);
      CAPTURE(p);
      const FfnDropout d{{p, 17, 1}, {}};
      // dropout alone
      gradcheck([&](const std::vector<Var>& v) { return fn::dropout(v[0], d.hidden); },
                {rand64(s, g)}, {"x"});
      for (Activation act : {Activation::gelu_erf, Activation::gelu_tanh}) {
        const FfnConfig cfg{act, false, false};
        gradcheck(
            [&](const std::vector<Var>& v) { return fn::ffn(v[0], {}, v[1], {}, {}, cfg, d); },
            {rand64(s, g, 2.0), rand64({n}, g)}, {"z", "b1"});
      }
      if (n % 2 == 0 || n == 1) {
        Shape s2 = s;
        s2.back() = 2 * n;
        for (Activation act : {Activation::gelu_tanh, Activation::silu}) {
          const FfnConfig cfg{act, true, false};
          gradcheck(
              [&](const std::vector<Var>& v) { return fn::ffn(v[0], {}, v[1], {}, {}, cfg, d); },
              {rand64(s2, g, 2.0), rand64({2 * n}, g)}, {"z", "b1"});
        }
      }
      // fc2 half: y = dropout(gelu(x)) · W2ᵀ + b2, only x kept.
      const FfnConfig cfg{Activation::gelu_erf, false, false};
      gradcheck(
          [&](const std::vector<Var>& v) { return fn::ffn(v[0], {}, {}, v[1], v[2], cfg, d); },
          {rand64(s, g), rand64({5, n}, g), rand64({5}, g)}, {"x", "w2", "b2"});
    }
}
