// tests/kernels/test_bias_glu_dropout.cpp — the gated FFN middle (GEGLU/SwiGLU): the CPU reference
// against formulas and fp64 finite differences, its argument checks, and the CUDA kernels against
// the reference (FFN_GPU_TEST cases skip visibly without a GPU).
#include <cmath>

#include "kernels/bias_act_dropout.h"
#include "kernels/bias_glu_dropout.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

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

FFN_GPU_TEST("bias_glu_dropout / bias_glu_dropout_backward on the GPU match the CPU reference") {
  Generator g(54);
  for (Activation act : {Activation::gelu_tanh, Activation::silu})
    for (DType dt : kGpuDtypes)
      for (auto [m, h] : kGpuShapes) {
        const std::string activation = std::string(activation_name(act));
        CAPTURE(activation);
        const std::string dtype = std::string(dtype_name(dt));
        CAPTURE(dtype);
        CAPTURE(m);
        CAPTURE(h);
        const DropoutSpec d{0.1f, 6, 2};
        const Tensor z = exact(rand64({m, 2 * h}, g, 2.0), dt), b = exact(rand64({2 * h}, g), dt),
                     dout = exact(rand64({m, h}, g), dt);
        auto run = [&](DType t, Device dev, std::vector<Tensor>& o) {
          o = {Tensor::empty({m, h}, t, dev), Tensor::empty({m, 2 * h}, t, dev),
               Tensor::empty({2 * h}, t, dev), Tensor::empty({m, h}, t, dev)};
          const Tensor zt = z.to(t).to(dev), bt = b.to(t).to(dev);
          bias_glu_dropout(zt, bt, act, d, o[0]);
          bias_glu_dropout_backward(dout.to(t).to(dev), zt, bt, act, d, o[1], &o[2], &o[3]);
        };
        std::vector<Tensor> r64, r32, gpu;
        run(DType::f64, Device::cpu(), r64);
        run(DType::f32, Device::cpu(), r32);
        run(dt, kGpu, gpu);
        // Without the recomputed forward (the call where no W2 follows): dz and db the same
        // bits.
        Tensor dz_only = Tensor::empty({m, 2 * h}, dt, kGpu),
               db_only = Tensor::empty({2 * h}, dt, kGpu);
        bias_glu_dropout_backward(dout.to(dt).to(kGpu), z.to(dt).to(kGpu), b.to(dt).to(kGpu), act,
                                  d, dz_only, &db_only, nullptr);
        CHECK(max_abs_diff(dz_only, gpu[1]) == 0.0);
        CHECK(max_abs_diff(db_only, gpu[2]) == 0.0);
        check_against_reference(gpu[0], r64[0], r32[0], dt, "glu out");
        check_against_reference(gpu[1], r64[1], r32[1], dt, "glu dz");
        check_against_reference(
            gpu[2], r64[2], r32[2], dt, "glu db",
            {.reduce_len = static_cast<double>(m), .term_bound = max_abs(r64[1])});
        CHECK(max_abs_diff(gpu[3], gpu[0]) == 0.0);
      }
}
