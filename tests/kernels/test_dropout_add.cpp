// tests/kernels/test_dropout_add.cpp — the residual add x + dropout(branch) and Tensor::plus: the
// CPU reference against formulas and fp64 finite differences, its argument checks, and the CUDA
// kernels against the reference (FFN_GPU_TEST cases skip visibly without a GPU).
#include <cmath>

#include "kernels/dropout_add.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

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
      std::string tag(" ");  // (appended: gcc 12's -Wrestrict misfires on " " + std::string)
      tag.append(shape_str(s)).append(" p=").append(std::to_string(p));
      {
        const Tensor y = rand64(s, g).to(DType::f32);
        Tensor out = Tensor::empty(s, DType::f32), dy = Tensor::empty(s, DType::f32);
        dropout_add(res, y, d, out);
        dropout_add_backward(dout, d, dy);
        Tensor out_g = Tensor::empty(s, DType::f32, kGpu),
               dy_g = Tensor::empty(s, DType::f32, kGpu);
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
        CHECK_MESSAGE(
            max_abs_diff(dy_g.to(Device::cpu()).to(DType::f64), dy64) <= u * max_abs(dy64),
            "mixed dy ", dtype_name(dt), tag);
      }
    }
  Tensor out = Tensor::empty({2, 3}, DType::bf16, kGpu);
  CHECK_THROWS_WITH_AS(dropout_add(Tensor::zeros({2, 3}, DType::f16, kGpu),
                                   Tensor::zeros({2, 3}, DType::bf16, kGpu), {}, out),
                       doctest::Contains("[dropout_add] res is f16 but y is bf16"), Error);
}

// The residual stream's mixed add (fp32 + bf16 -> fp32) in one pass: both sides round the
// exact sum once to fp32, so the GPU equals the CPU bit for bit.
FFN_GPU_TEST("Tensor::plus on the GPU equals the CPU (f32 + bf16, f32 + f16, f32 + f32)") {
  Generator g(39);
  for (auto [da, db] : {std::pair<DType, DType>{DType::f32, DType::bf16},
                        {DType::f32, DType::f16},
                        {DType::f32, DType::f32}}) {
    const Tensor a = rand64({1000003}, g).to(da), b = rand64({1000003}, g).to(db);
    const Tensor gpu = a.to(kGpu).plus(b.to(kGpu)).to(Device::cpu());
    CHECK(gpu.dtype() == da);
    CHECK(max_abs_diff(gpu.to(DType::f64), a.plus(b).to(DType::f64)) == 0.0);
  }
}
