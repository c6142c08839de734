// tests/kernels/test_scale.cpp — a matrix scaled along its rows or columns (kernels/scale.h):
// the CPU reference against its formula, its argument checks, and the CUDA kernels against
// the reference at odd and aligned shapes, in place too (FFN_GPU_TEST cases skip visibly
// without a GPU).
#include <cmath>

#include "kernels/scale.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

TEST_CASE("scale_rows and scale_columns match their formulas; bad inputs are named") {
  Generator g(71);
  for (const Shape& s : kCpuShapes) {
    const Tensor x = rand64(s, g), r = rand64({s[0]}, g), c = rand64({s[1]}, g);
    Tensor o1 = Tensor::empty(s, DType::f64), o2 = Tensor::empty(s, DType::f64);
    scale_rows(x, r, o1);
    scale_columns(x, c, o2);
    const auto xv = x.to_vector(), rv = r.to_vector(), cv = c.to_vector();
    const auto v1 = o1.to_vector(), v2 = o2.to_vector();
    bool ok = true;
    for (int64_t i = 0; i < s[0]; ++i)
      for (int64_t j = 0; j < s[1]; ++j) {
        const size_t k = static_cast<size_t>(i * s[1] + j);
        ok = ok && v1[k] == xv[k] * rv[i] && v2[k] == xv[k] * cv[j];
      }
    CHECK_MESSAGE(ok, shape_str(s));
    Tensor in_place = x.clone();
    scale_rows(in_place, r, in_place);
    CHECK(max_abs_diff(in_place, o1) == 0.0);
  }
  const Tensor x = rand64({3, 4}, g);
  Tensor out = Tensor::empty({3, 4}, DType::f64);
  CHECK_THROWS_WITH_AS(scale_rows(x, rand64({4}, g), out),
                       doctest::Contains("[scale_rows] s.shape=[4] but expected [3]"), Error);
  CHECK_THROWS_WITH_AS(scale_columns(x, rand64({3}, g), out),
                       doctest::Contains("[scale_columns] s.shape=[3] but expected [4]"), Error);
  CHECK_THROWS_WITH_AS(scale_rows(x, rand64({3}, g).to(DType::f32), out),
                       doctest::Contains("[scale_rows] s must be f64 for f64 x, got f32"), Error);
  Tensor small = Tensor::empty({2, 4}, DType::f64);
  CHECK_THROWS_WITH_AS(scale_columns(x, rand64({4}, g), small),
                       doctest::Contains("[scale_columns] out"), Error);
}

// f32 and f64: the same rounded products, bit for bit; bf16/f16 (row scales in fp32, column
// scales in the 16-bit type): the exact product rounded once, against f64. Odd widths take
// the scalar path, multiples of the vector width the 16-byte one; a misaligned x the scalar
// path too; in place as well.
FFN_GPU_TEST("scale_rows and scale_columns on the GPU match the CPU") {
  Generator g(72);
  for (auto [m, n] : kGpuShapes)
    for (DType dt : kGpuDtypes)
      for (bool rows : {true, false}) {
        const Tensor x = rand64({m, n}, g, 3.0), s = rand64({rows ? m : n}, g, 2.0);
        const DType sd = rows ? acc_dtype(dt) : dt;
        auto run = [&](const Tensor& xi, const Tensor& si) {
          Tensor out = Tensor::empty(xi.shape(), xi.dtype(), xi.device());
          if (rows)
            scale_rows(xi, si, out);
          else
            scale_columns(xi, si, out);
          return out;
        };
        std::string tag(rows ? "rows " : "columns ");
        tag.append(dtype_name(dt))
            .append(" ")
            .append(std::to_string(m))
            .append("x")
            .append(std::to_string(n));
        const Tensor xg = x.to(dt).to(kGpu), sg = s.to(sd).to(kGpu);
        const Tensor got = run(xg, sg).to(Device::cpu());
        const Tensor mis = run(misaligned(xg), sg).to(Device::cpu());
        Tensor in_place = xg.clone();
        if (rows)
          scale_rows(in_place, sg, in_place);
        else
          scale_columns(in_place, sg, in_place);
        CHECK_MESSAGE(max_abs_diff(mis.to(DType::f64), got.to(DType::f64)) == 0.0, tag);
        CHECK_MESSAGE(
            max_abs_diff(in_place.to(Device::cpu()).to(DType::f64), got.to(DType::f64)) == 0.0,
            tag);
        if (dt == DType::f32) {
          CHECK_MESSAGE(max_abs_diff(got, run(x.to(dt), s.to(sd))) == 0.0, tag);
          continue;
        }
        const Tensor ref = run(exact(x, dt), exact(s, sd));
        const double u = std::ldexp(1.0, dt == DType::bf16 ? -8 : -11);
        CHECK_MESSAGE(max_abs_diff(got.to(DType::f64), ref) <= u * max_abs(ref), tag);
      }
}
