// tests/kernels/test_rope.cpp — rotary position embeddings: the CPU reference against the
// half-split formula and fp64 finite differences, the inverse undoing the rotation, its
// argument checks, and the CUDA kernel against the reference (FFN_GPU_TEST cases skip visibly
// without a GPU).
#include <cmath>

#include "kernels/rope.h"
#include "layers/functional.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

TEST_CASE("rope rotates q and k heads by t·base^(-2i/D), copies v, and inverts exactly") {
  Generator g(51);
  // B = 2, T = 5, heads 2, kv_heads 1 (grouped-query layout), D = 6.
  const int64_t b = 2, t = 5, h = 2, kv = 1, d = 6, w = (h + 2 * kv) * d;
  const Tensor x = rand64({b, t, w}, g);
  Tensor y = Tensor::empty({b, t, w}, DType::f64);
  rope(x, h, kv, 10000.0, false, y);
  const auto xv = x.to_vector(), yv = y.to_vector();
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < t; ++ti) {
      const int64_t row = (bi * t + ti) * w;
      for (int64_t slot = 0; slot < h + 2 * kv; ++slot)
        for (int64_t i = 0; i < d / 2; ++i) {
          const int64_t a = row + slot * d + i, c = a + d / 2;
          if (slot >= h + kv) {  // value heads are copied
            CHECK(yv[a] == xv[a]);
            CHECK(yv[c] == xv[c]);
            continue;
          }
          const double th = static_cast<double>(ti) * std::pow(10000.0, -2.0 * i / d);
          const double cs = std::cos(th), sn = std::sin(th);
          CHECK(yv[a] == doctest::Approx(xv[a] * cs - xv[c] * sn).epsilon(1e-14));
          CHECK(yv[c] == doctest::Approx(xv[c] * cs + xv[a] * sn).epsilon(1e-14));
        }
    }
  // Position 0 is the identity; the inverse gives x back.
  for (int64_t j = 0; j < w; ++j) CHECK(yv[j] == xv[j]);
  Tensor back = Tensor::empty({b, t, w}, DType::f64);
  rope(y, h, kv, 10000.0, true, back);
  CHECK(max_abs_diff(back, x) < 1e-14);
  gradcheck([&](const std::vector<Var>& in) { return fn::rope(in[0], h, kv, 500.0); },
            {rand64({2, 3, w}, g)}, {"qkv"});
  gradcheck([&](const std::vector<Var>& in) { return fn::rope(in[0], 3, 3, 10000.0); },
            {rand64({1, 7, 9 * 4}, g)}, {"qkv (MHA)"});
  Tensor out = Tensor::empty({b, t, w}, DType::f64);
  CHECK_THROWS_WITH_AS(rope(x, 3, 1, 1e4, false, out),
                       doctest::Contains("[rope] qkv's last dimension 24 is not a multiple of "
                                         "heads + 2·kv_heads = 5"),
                       Error);
  const Tensor odd = rand64({1, 2, 4 * 3}, g);
  Tensor odd_out = Tensor::empty({1, 2, 12}, DType::f64);
  CHECK_THROWS_WITH_AS(rope(odd, 2, 1, 1e4, false, odd_out),
                       doctest::Contains("[rope] the head size must be even, got 3"), Error);
  CHECK_THROWS_WITH_AS(rope(x, h, kv, -1.0, false, out),
                       doctest::Contains("[rope] base must be > 0"), Error);
}

FFN_GPU_TEST("rope on the GPU matches the CPU (q/k rotated, v copied, inverse), odd shapes") {
  Generator g(52);
  struct Case {
    int64_t b, t, h, kv, d;
  };
  for (const Case& c : {Case{1, 1, 1, 1, 2}, Case{2, 37, 4, 2, 64}, Case{3, 129, 6, 6, 128},
                        Case{1, 1030, 2, 1, 32}})
    for (DType dt : {DType::f32, DType::bf16})
      for (bool inverse : {false, true}) {
        const int64_t w = (c.h + 2 * c.kv) * c.d;
        const Tensor x = rand64({c.b, c.t, w}, g).to(dt).to(DType::f64);
        auto run = [&](DType ty, Device d) {
          Tensor y = Tensor::empty({c.b, c.t, w}, ty, d);
          rope(x.to(ty).to(d), c.h, c.kv, 10000.0, inverse, y);
          return y;
        };
        std::string what("rope ");
        what.append(std::to_string(c.t)).append("x").append(std::to_string(c.h)).append("/")
            .append(std::to_string(c.kv)).append("x").append(std::to_string(c.d));
        if (inverse) what.append(" inverse");
        // Two products and a sum per output: reduce length 2.
        check_against_reference(run(dt, kGpu), run(DType::f64, Device::cpu()),
                                run(DType::f32, Device::cpu()), dt, what,
                                {.reduce_len = 2.0, .term_bound = 4 * max_abs(x)});
      }
}
