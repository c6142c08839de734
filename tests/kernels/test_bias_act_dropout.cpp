// tests/kernels/test_bias_act_dropout.cpp — bias + activation (GELU/SiLU/identity) + dropout, the
// activation math, and the FFN middle ops' finite differences: the CPU reference against formulas
// and fp64 finite differences, its argument checks, and the CUDA kernels against the reference
// (FFN_GPU_TEST cases skip visibly without a GPU).
#include <cmath>
#include <cstdint>

#include "kernels/bias_act_dropout.h"
#include "kernels/bias_glu_dropout.h"
#include "kernels/cpu/parallel.h"
#include "kernels/dropout_add.h"
#include "layers/functional.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

TEST_CASE("bias_dropout and bias_dropout_backward follow their formulas") {
  Generator g(4);
  for (const Shape& s : kCpuShapes) {
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
      check_close(dz, Tensor::from_vector(dze, s, DType::f64), 1e-12, 1e-12,
                  "bias_dropout_backward dz");
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
  // A float form against double on x = i·1e-4 (|i| ≤ lim, step 7): the value's relative error
  // where |value| > 1e-30 (the forms have no cancellation for negative x), within |x| ≤ 4
  // too, the derivative's against max(|g|, 0.01) (GELU's crosses zero near -0.75), how many
  // value_grad results differ from value and grad (the fused backward recomputes hd with it:
  // none may), and how many values differ from the default float form's. S as in activation.h.
  struct FloatErrors {
    double value = 0, value4 = 0, grad = 0;
    int differ = 0, other = 0;
  };
  auto float_errors = []<class S>(Activation a, int lim) {
    FloatErrors r;
    for (int i = -lim; i <= lim; i += 7) {
      const float x = static_cast<float>(i) * 1e-4f;
      const double vd = act_math::value(double(x), a), gd = act_math::grad(double(x), a);
      const float vf = act_math::value<S>(x, a), gf = act_math::grad<S>(x, a);
      float v2 = 0, g2 = 0;
      act_math::value_grad<S>(x, a, v2, g2);
      r.differ += (v2 != vf) + (g2 != gf);
      r.other += vf != act_math::value(x, a);
      if (std::abs(vd) > 1e-30) {
        const double e = std::abs(vf - vd) / std::abs(vd);
        r.value = std::max(r.value, e);
        if (std::abs(x) <= 4.0f) r.value4 = std::max(r.value4, e);
      }
      r.grad = std::max(r.grad, std::abs(gf - gd) / std::max(std::abs(gd), 1e-2));
    }
    return r;
  };
  {  // gelu_erf (Note [erfc GELU])
    const FloatErrors e = float_errors.operator()<void>(Activation::gelu_erf, 140000);
    CHECK(e.differ == 0);
    CHECK(e.value4 < 3e-6);  // measured 1.6e-6; 0.5·x·(1 + erff) has 4.6e-4 here
    CHECK(e.value < 3e-5);   // down to x ≈ -11.5 (|gelu| > 1e-30): exp(-x²/2) of a rounded x²
    CHECK(e.grad < 2e-5);
  }
  {  // gelu_erf for 16-bit storage (Note [erfc GELU for 16-bit outputs]; any 2-byte S selects
     // it): errors far under half a bf16 or f16 ulp (2^-9, 2^-12 near 1), and a form of its
     // own (it differs from the degree-9 one)
    const FloatErrors e = float_errors.operator()<uint16_t>(Activation::gelu_erf, 120000);
    INFO("short erfc: value ", e.value, ", derivative ", e.grad);
    CHECK(e.differ == 0);
    CHECK(e.other > 0);
    CHECK(e.value < 3e-5);  // measured 1.2e-5 (session 25's t·2^(P' − s²) form: 3.4e-5)
    CHECK(e.grad < 2e-4);   // 7.4e-5 near g's zero (x ≈ -0.75), over 0.01 (that form: 6.1e-4)
  }
  {  // gelu_tanh (Note [tanh GELU in base 2])
    const FloatErrors e = float_errors.operator()<void>(Activation::gelu_tanh, 140000);
    INFO("tanh GELU: value ", e.value, ", derivative ", e.grad);
    CHECK(e.differ == 0);
    CHECK(e.value < 3e-5);  // measured 1.1e-5 (x near -14: exp's argument ~ -300, rounded)
    CHECK(e.grad < 1e-5);   // measured 2.4e-6
  }
  CHECK(parse_activation("gelu") == Activation::gelu_erf);
  CHECK_THROWS_WITH_AS(parse_activation("relu6"), doctest::Contains("unknown activation 'relu6'"),
                       Error);
}

TEST_CASE("bias_act_dropout and bias_act_dropout_backward follow their formulas") {
  Generator g(5);
  for (Activation act : {Activation::gelu_erf, Activation::gelu_tanh})
    for (const Shape& s : kCpuShapes) {
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

// kernels/cpu/parallel.h: the CPU references run their rows on OpenMP's threads, and sum db
// in a pass of its own, so every output is the same bits on any number of threads.
TEST_CASE("the CPU activation kernels give the same bits on 1, 2 and 3 threads") {
  const int threads = cpu::cpu_threads();
  if (threads == 1) {
    cpu::set_cpu_threads(2);
    if (cpu::cpu_threads() == 1) MESSAGE("built without OpenMP: the CPU loops run on one thread");
  }
  Generator g(9);
  // A team per kMinElementsPerThread elements, at most cpu_threads().
  CHECK(cpu::threads_for(0) == 1);
  CHECK(cpu::threads_for(cpu::kMinElementsPerThread - 1) == 1);
  CHECK(cpu::threads_for(2 * cpu::kMinElementsPerThread) == std::min(2, cpu::cpu_threads()));
  CHECK(cpu::threads_for(int64_t{1} << 40) == cpu::cpu_threads());
  // Rows enough for teams of 3 (kernels/cpu/parallel.h's threads_for), and an odd count.
  const int64_t rows = 3 * cpu::kMinElementsPerThread / 40 + 67;
  const Shape s{rows, 40};
  const Tensor z = rand64(s, g, 3.0).to(DType::f32), zg = rand64({rows, 80}, g, 3.0).to(DType::f32);
  const Tensor b = rand64({40}, g).to(DType::f32), bg = rand64({80}, g).to(DType::f32);
  const Tensor dy = rand64(s, g).to(DType::f32);
  const DropoutSpec d{0.25f, 11, 2};
  auto run = [&](int n) {
    cpu::set_cpu_threads(n);
    std::vector<Tensor> o;
    for (Activation act : {Activation::gelu_erf, Activation::gelu_tanh, Activation::silu}) {
      Tensor hd = Tensor::empty(s, DType::f32), dz = Tensor::empty(s, DType::f32),
             db = Tensor::empty({40}, DType::f32), hd2 = Tensor::empty(s, DType::f32);
      bias_act_dropout(z, b, act, d, hd);
      bias_act_dropout_backward(dy, z, b, act, d, dz, &db, &hd2);
      Tensor gout = Tensor::empty(s, DType::f32), gdz = Tensor::empty({rows, 80}, DType::f32),
             gdb = Tensor::empty({80}, DType::f32), gout2 = Tensor::empty(s, DType::f32);
      bias_glu_dropout(zg, bg, act, d, gout);
      bias_glu_dropout_backward(dy, zg, bg, act, d, gdz, &gdb, &gout2);
      o.insert(o.end(), {hd, dz, db, hd2, gout, gdz, gdb, gout2});
    }
    return o;
  };
  const auto one = run(1);
  for (int n : {2, 3}) {
    const auto many = run(n);
    for (size_t i = 0; i < one.size(); ++i)
      CHECK_MESSAGE(one[i].to_vector() == many[i].to_vector(), "output ", i, " on ", n,
                    " threads differs from one thread's");
  }
  cpu::set_cpu_threads(threads);
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

TEST_CASE("dropout_add equals res + bias_dropout(y), passes FD checks, rejects bad inputs") {
  Generator g(41);
  for (DType dt : {DType::f64, DType::f32})
    for (const Shape& s : {Shape{1, 1}, Shape{7, 13}, Shape{33, 64}}) {
      const Tensor res = rand64(s, g).to(dt), y = rand64(s, g).to(dt);
      const DropoutSpec d{0.3f, 11, 4};
      Tensor out = Tensor::empty(s, dt), yd = Tensor::empty(s, dt);
      dropout_add(res, y, d, out);
      bias_dropout(y, Tensor(), d, yd);
      Tensor want = res.clone();
      want.add_(yd);
      CHECK(max_abs_diff(out.to(DType::f64), want.to(DType::f64)) ==
            0.0);  // same mask, same rounding
      // Backward: dy = dout ⊙ mask/(1−p), the bias_dropout backward.
      const Tensor dout = rand64(s, g).to(dt);
      Tensor dy = Tensor::empty(s, dt), dz = Tensor::empty(s, dt);
      dropout_add_backward(dout, d, dy);
      bias_dropout_backward(dout, d, &dz, nullptr);
      CHECK(max_abs_diff(dy.to(DType::f64), dz.to(DType::f64)) == 0.0);
    }
  for (float p : {0.0f, 0.4f})
    gradcheck(
        [&](const std::vector<Var>& in) {
          return fn::dropout_add(in[0], in[1], {p, 3, 0});
        },
        {rand64({2, 3, 5}, g), rand64({2, 3, 5}, g)}, {"res", "y"});
  Tensor out = Tensor::empty({2, 3}, DType::f64);
  CHECK_THROWS_WITH_AS(dropout_add(rand64({2, 4}, g), rand64({2, 3}, g), {}, out),
                       doctest::Contains("[dropout_add] res.shape=[2, 4]"), Error);
  CHECK_THROWS_WITH_AS(dropout_add(rand64({2, 3}, g).to(DType::f32), rand64({2, 3}, g), {}, out),
                       doctest::Contains("[dropout_add] res is f32 but y is f64"), Error);
  CHECK_THROWS_WITH_AS(dropout_add(rand64({2, 3}, g), rand64({2, 3}, g), {1.5f, 1, 0}, out),
                       doctest::Contains("[dropout_add]"), Error);
  Tensor small = Tensor::empty({2, 2}, DType::f64);
  CHECK_THROWS_WITH_AS(dropout_add_backward(rand64({2, 3}, g), {}, small),
                       doctest::Contains("[dropout_add_backward] dy.shape=[2, 2]"), Error);
  // A scalar branch keeps its gradient (fn::dropout and fn::dropout_add view it as [1, 1]).
  gradcheck(
      [&](const std::vector<Var>& in) {
        return fn::dropout_add(in[0], fn::dropout(in[1], {0.5f, 2, 0}), {});
      },
      {rand64({}, g), rand64({}, g)}, {"res", "y"});
}

FFN_GPU_TEST("bias_dropout / bias_dropout_backward on the GPU match the CPU reference") {
  Generator g(52);
  for (DType dt : kGpuDtypes)
    for (auto [m, n] : kGpuShapes) {
      const std::string dtype = std::string(dtype_name(dt));
      CAPTURE(dtype);
      CAPTURE(m);
      CAPTURE(n);
      const DropoutSpec d{0.3f, 9, 4};
      const Tensor z = exact(rand64({m, n}, g), dt), b = exact(rand64({n}, g), dt),
                   dy = exact(rand64({m, n}, g), dt);
      auto run = [&](DType t, Device dev, Tensor& y, Tensor& dz, Tensor& db) {
        y = Tensor::empty({m, n}, t, dev);
        dz = Tensor::empty({m, n}, t, dev);
        db = Tensor::empty({n}, t, dev);
        bias_dropout(z.to(t).to(dev), b.to(t).to(dev), d, y);
        bias_dropout_backward(dy.to(t).to(dev), d, &dz, &db);
      };
      Tensor y64, dz64, db64, y32, dz32, db32, yg, dzg, dbg;
      run(DType::f64, Device::cpu(), y64, dz64, db64);
      run(DType::f32, Device::cpu(), y32, dz32, db32);
      run(dt, kGpu, yg, dzg, dbg);
      check_against_reference(yg, y64, y32, dt, "bias_dropout y");
      check_against_reference(dzg, dz64, dz32, dt, "bias_dropout_backward dz");
      check_against_reference(dbg, db64, db32, dt, "bias_dropout_backward db",
                              {.reduce_len = static_cast<double>(m), .term_bound = max_abs(dz64)});
    }
}

FFN_GPU_TEST("bias_grad on the GPU (its own column-sum op) equals the general backward's db") {
  // bias_grad alone runs ColumnSum (eight rows of loads in flight); with dz requested the
  // same sums come from DgeluDbias. Same row order, so the same bits; both near the CPU's.
  Generator g(57);
  for (DType dt : kGpuDtypes)
    for (auto [m, n] : kGpuShapes) {
      const std::string dtype = std::string(dtype_name(dt));
      CAPTURE(dtype);
      CAPTURE(m);
      CAPTURE(n);
      const Tensor dy = exact(rand64({m, n}, g), dt);
      const Tensor dyg = dy.to(dt).to(kGpu);
      Tensor db = Tensor::empty({n}, dt, kGpu), db2 = Tensor::empty({n}, dt, kGpu);
      Tensor dz = Tensor::empty({m, n}, dt, kGpu);
      bias_grad(dyg, db);
      bias_dropout_backward(dyg, {}, &dz, &db2);
      CHECK(ffn::test::max_abs_diff(db, db2) == 0.0);
      CHECK(ffn::test::max_abs_diff(dz, dyg) == 0.0);
      Tensor db64 = Tensor::empty({n}, DType::f64), db32 = Tensor::empty({n}, DType::f32);
      bias_grad(dy.to(DType::f64), db64);
      bias_grad(dy.to(DType::f32), db32);
      check_against_reference(db, db64, db32, dt, "bias_grad db",
                              {.reduce_len = static_cast<double>(m), .term_bound = max_abs(dy)});
    }
}

FFN_GPU_TEST("bias_act_dropout / bias_act_dropout_backward on the GPU match the CPU reference") {
  Generator g(53);
  for (Activation act : {Activation::gelu_erf, Activation::gelu_tanh})
    for (DType dt : kGpuDtypes)
      for (auto [m, n] : kGpuShapes) {
        const std::string activation = std::string(activation_name(act));
        CAPTURE(activation);
        const std::string dtype = std::string(dtype_name(dt));
        CAPTURE(dtype);
        CAPTURE(m);
        CAPTURE(n);
        const DropoutSpec d{0.2f, 3, 8};
        const Tensor z = exact(rand64({m, n}, g, 3.0), dt), b = exact(rand64({n}, g), dt),
                     dhd = exact(rand64({m, n}, g), dt);
        auto run = [&](DType t, Device dev, std::vector<Tensor>& o) {
          o = {Tensor::empty({m, n}, t, dev), Tensor::empty({m, n}, t, dev),
               Tensor::empty({n}, t, dev), Tensor::empty({m, n}, t, dev)};
          const Tensor zt = z.to(t).to(dev), bt = b.to(t).to(dev);
          bias_act_dropout(zt, bt, act, d, o[0]);
          bias_act_dropout_backward(dhd.to(t).to(dev), zt, bt, act, d, o[1], &o[2], &o[3]);
        };
        std::vector<Tensor> r64, r32, gpu;
        run(DType::f64, Device::cpu(), r64);
        run(DType::f32, Device::cpu(), r32);
        run(dt, kGpu, gpu);
        check_against_reference(gpu[0], r64[0], r32[0], dt, "hd");
        check_against_reference(gpu[1], r64[1], r32[1], dt, "dpre");
        check_against_reference(
            gpu[2], r64[2], r32[2], dt, "db",
            {.reduce_len = static_cast<double>(m), .term_bound = max_abs(r64[1])});
        CHECK(max_abs_diff(gpu[3], gpu[0]) == 0.0);  // recomputed hd is bit-identical
        // The unaligned (scalar) path gives bit-identical results, sums included.
        Tensor dpre2 = misaligned(gpu[1]), db2 = misaligned(gpu[2]), hd2 = misaligned(gpu[3]);
        bias_act_dropout_backward(misaligned(dhd.to(dt).to(kGpu)), misaligned(z.to(dt).to(kGpu)),
                                  b.to(dt).to(kGpu), act, d, dpre2, &db2, &hd2);
        CHECK(max_abs_diff(dpre2.contiguous(), gpu[1]) == 0.0);
        CHECK(max_abs_diff(db2.contiguous(), gpu[2]) == 0.0);
      }
}

FFN_GPU_TEST("elementwise kernels index past 2^31 elements") {
  // 65537 × 32768 = 2^31 + 32768 bf16 elements (4 GiB per tensor).
  const int64_t m = 65537, n = 32768;
  const DropoutSpec d{0.25f, 17, 3};
  Generator g(56);
  const Tensor b64 = exact(rand64({n}, g), DType::bf16);
  const Tensor b = b64.to(DType::bf16).to(kGpu);
  Tensor z = Tensor::full({m, n}, 0.75, DType::bf16, kGpu);
  Tensor dpre = Tensor::empty({m, n}, DType::bf16, kGpu),
         db = Tensor::empty({n}, DType::bf16, kGpu);
  {
    Tensor hd = Tensor::empty({m, n}, DType::bf16, kGpu);
    bias_act_dropout(z, b, Activation::gelu_erf, d, hd);
    const auto last = hd.slice_rows(m - 2, m).to_vector();  // rows past the 2^31 boundary
    const auto bv = b64.to_vector();
    int bad = 0;
    for (int64_t r = m - 2; r < m; ++r)
      for (int64_t c = 0; c < n; c += 97) {
        const int64_t i = r * n + c;
        const double f = d.keep(static_cast<uint64_t>(i)) ? d.scale() : 0.0;
        const double expect = act_math::value(0.75 + bv[c], Activation::gelu_erf) * f;
        bad += std::fabs(last[(r - m + 2) * n + c] - expect) > 0.01 * (1 + std::fabs(expect));
      }
    CHECK(bad == 0);
  }
  {
    Tensor dhd = Tensor::full({m, n}, 1.0, DType::bf16, kGpu);
    bias_act_dropout_backward(dhd, z, b, Activation::gelu_erf, d, dpre, &db, nullptr);
  }
  const auto dbv = db.to_vector();
  const auto bv = b64.to_vector();
  int bad = 0;
  for (int64_t c : {int64_t{0}, int64_t{1}, int64_t{12345}, n - 1}) {
    double kept = 0;
    for (int64_t r = 0; r < m; ++r)
      kept += d.keep(static_cast<uint64_t>(r * n + c)) ? d.scale() : 0.0;
    const double expect = kept * act_math::grad(0.75 + bv[c], Activation::gelu_erf);
    bad += std::fabs(dbv[c] - expect) > 0.01 * std::fabs(expect);
  }
  CHECK(bad == 0);
}
