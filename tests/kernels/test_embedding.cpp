// tests/kernels/test_embedding.cpp — embedding gather/scatter and i32 id tensors: the CPU reference
// against formulas and fp64 finite differences, its argument checks, and the CUDA kernels against
// the reference (FFN_GPU_TEST cases skip visibly without a GPU).
#include <cmath>

#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "layers/functional.h"
#include "tests/kernels/kernel_tests.h"
#include "tests/test_util.h"

using namespace ffn;
using namespace ffn::test;

TEST_CASE("i32 tensors copy, convert and refuse float math") {
  const Tensor t = Tensor::from_vector({0, 5, -3, 2147483647}, {4}, DType::i32);
  CHECK(t.to_vector() == std::vector<double>{0, 5, -3, 2147483647});
  CHECK(t.to(DType::f64).to_vector() == std::vector<double>{0, 5, -3, 2147483647});
  Tensor u = Tensor::zeros({2, 2}, DType::i32);
  u.copy_(t.reshape({2, 2}).permute({1, 0}));
  CHECK(u.to_vector() == std::vector<double>{0, -3, 5, 2147483647});
  CHECK_THROWS_WITH_AS(u.add_(u), doctest::Contains("i32 is not supported"), Error);
  CHECK_THROWS_WITH_AS(matmul(u, u), doctest::Contains("[gemm] needs a float dtype"), Error);
  CHECK_THROWS_WITH_AS(t.permute({0, 0}), doctest::Contains("[permute]"), Error);
}

TEST_CASE("embedding gathers rows; its backward sums repeated ids; FD check") {
  Generator g(21);
  const Tensor table = rand64({5, 3}, g);
  const Tensor ids = ids_of({4, 0, 4, 2, 4});
  Tensor out = Tensor::empty({5, 3}, DType::f64);
  embedding(ids, table, out);
  const auto tv = table.to_vector(), ov = out.to_vector();
  for (int j = 0; j < 3; ++j) {
    CHECK(ov[0 * 3 + j] == tv[4 * 3 + j]);
    CHECK(ov[3 * 3 + j] == tv[2 * 3 + j]);
  }
  Tensor dt = Tensor::empty({5, 3}, DType::f64);
  const Tensor dout = rand64({5, 3}, g);
  embedding_backward(ids, dout, dt);
  const auto dv = dout.to_vector(), gv = dt.to_vector();
  for (int j = 0; j < 3; ++j) {
    CHECK(gv[4 * 3 + j] == doctest::Approx(dv[j] + dv[2 * 3 + j] + dv[4 * 3 + j]));
    CHECK(gv[1 * 3 + j] == 0.0);  // never named
  }
  for (const Shape& ts : {Shape{1, 1}, Shape{7, 13}, Shape{129, 257}}) {
    const Tensor ids2 = ids_of({0, static_cast<double>(ts[0] - 1), 0, 0}).reshape({2, 2});
    gradcheck([&](const std::vector<Var>& in) { return fn::embedding(ids2, in[0]); },
              {rand64(ts, g)}, {"table"});
  }
  Tensor out2 = Tensor::empty({2, 3}, DType::f64), out1 = Tensor::empty({1, 3}, DType::f64),
         out3 = Tensor::empty({3, 3}, DType::f64);
  CHECK_THROWS_WITH_AS(embedding(ids_of({1, 5}), table, out2),
                       doctest::Contains("[embedding] ids[1]=5 is out of range [0, 5)"), Error);
  CHECK_THROWS_WITH_AS(embedding(ids_of({-1}), table, out1),
                       doctest::Contains("ids[0]=-1 is out of range"), Error);
  CHECK_THROWS_WITH_AS(embedding(table.narrow(0, 0, 1).reshape({3}), table, out3),
                       doctest::Contains("ids must be i32"), Error);
}

FFN_GPU_TEST("embedding on the GPU: gather exact, backward deterministic and equal to CPU") {
  Generator g(31);
  for (auto [n, v, c] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                         {37, 5, 3},
                         {4097, 65, 384},
                         {1000, 50257, 64},
                         {5000, 3, 40},
                         {129, 1, 5}})  // runs across many 16-row chunks
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
      check_against_reference(d1, r64, r32, dt, "embedding backward",
                              {.reduce_len = static_cast<double>(n) / static_cast<double>(v) + 1,
                               .term_bound = 4 * max_abs(r64)});
    }
  {  // a gradient that is not 16-byte aligned takes the one-column-per-thread path
    const Tensor id = ids(100, 7, 5);
    const Tensor dout = rand64({100, 16}, g).to(DType::bf16).to(kGpu);
    Tensor d1 = Tensor::empty({7, 16}, DType::bf16, kGpu),
           d2 = Tensor::empty({7, 16}, DType::bf16, kGpu);
    embedding_backward(id.to(kGpu), dout, d1);
    embedding_backward(id.to(kGpu), misaligned(dout), d2);
    check_close(d2.to(Device::cpu()).to(DType::f64), d1.to(Device::cpu()).to(DType::f64), 0, 0,
                "unaligned gradient: same sums");
  }
  Tensor out = Tensor::empty({2, 3}, DType::f32, kGpu);
  const Tensor table = Tensor::zeros({5, 3}, DType::f32, kGpu);
  CHECK_THROWS_WITH_AS(embedding(Tensor::from_vector({1, 7}, {2}, DType::i32, kGpu), table, out),
                       doctest::Contains("[embedding] ids[1]=7 is out of range [0, 5)"), Error);
}
