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

TEST_CASE("embedding_sum adds position rows; the backward accumulates and sums positions") {
  Generator g(22);
  const Tensor table = rand64({7, 4}, g), pos = rand64({5, 4}, g);
  const Tensor ids = ids_of({6, 0, 6, 3, 1, 6});  // two sequences of t = 3
  Tensor out = Tensor::empty({6, 4}, DType::f64);
  embedding_sum(ids, table, pos, 3, out);
  const auto tv = table.to_vector(), pv = pos.to_vector(), ov = out.to_vector();
  const int idv[] = {6, 0, 6, 3, 1, 6};
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) CHECK(ov[i * 4 + j] == tv[idv[i] * 4 + j] + pv[(i % 3) * 4 + j]);
  // Accumulate: named rows are old + Σ, the others keep their values.
  const Tensor dout = rand64({6, 4}, g), old = rand64({7, 4}, g);
  Tensor dt = old.clone();
  embedding_backward(ids, dout, dt, true, /*accumulate=*/true);
  const auto dv = dout.to_vector(), gv = dt.to_vector(), wv = old.to_vector();
  for (int j = 0; j < 4; ++j) {
    CHECK(gv[6 * 4 + j] == doctest::Approx(wv[6 * 4 + j] + dv[j] + dv[8 + j] + dv[20 + j]));
    CHECK(gv[2 * 4 + j] == wv[2 * 4 + j]);  // never named
  }
  Tensor dp = Tensor::empty({5, 4}, DType::f64);
  position_grad(dout, 3, dp);
  const auto pg = dp.to_vector();
  for (int p = 0; p < 5; ++p)
    for (int j = 0; j < 4; ++j)
      CHECK(pg[p * 4 + j] == doctest::Approx(p < 3 ? dv[p * 4 + j] + dv[(p + 3) * 4 + j] : 0.0));
  const Tensor ids2 = ids.reshape({2, 3});
  gradcheck([&](const std::vector<Var>& in) {
    return fn::embedding_sum(ids2, in[0], in[1], DType::f64);
  }, {table, pos}, {"table", "pos"});
  gradcheck([&](const std::vector<Var>& in) {
    return fn::embedding_sum(ids2, in[0], Var(), DType::f64);
  }, {table}, {"table"});
  CHECK_THROWS_WITH_AS(embedding_sum(ids, table, pos, 4, out),
                       doctest::Contains("[embedding_sum] t=4 must be in [1, 5]"), Error);
  CHECK_THROWS_WITH_AS(embedding_sum(ids, table, rand64({5, 3}, g), 3, out),
                       doctest::Contains("[embedding_sum] pos must be [P, 4] f64"), Error);
  Tensor out32 = Tensor::empty({6, 4}, DType::f32);
  CHECK_THROWS_WITH_AS(embedding_sum(ids, table, pos, 3, out32),
                       doctest::Contains("[embedding_sum]"), Error);
  Tensor dp_bad = Tensor::empty({2, 4}, DType::f64);
  CHECK_THROWS_WITH_AS(position_grad(dout, 3, dp_bad),
                       doctest::Contains("[position_grad] t=3 must be in [1, 2]"), Error);
}

TEST_CASE("a table used twice: the embedding adds its gradient into the one already summed") {
  // The LM head's product runs backward first and leaves the leaf's gradient; embedding_sum
  // adds into it in place (Note [Accumulating backward]). The result equals two copies'.
  Generator g(23);
  const Tensor table = rand64({6, 3}, g), x = rand64({2, 4, 3}, g);
  const Tensor ids = ids_of({5, 0, 5, 2, 1, 1, 3, 5}).reshape({2, 4});
  const Tensor t1 = rand64({2, 4, 3}, g), t2 = rand64({2, 4, 6}, g);
  auto loss = [&](const Var& a, const Var& b) {
    const Var e = fn::embedding_sum(ids, a, Var(), DType::f64);
    const Var h = fn::linear(fn::add(e, Var(x)), b, Var());
    return fn::add(fn::mse_loss(e, t1), fn::mse_loss(h, t2));
  };
  Var tied(table.clone(), true), a(table.clone(), true), b(table.clone(), true);
  loss(tied, tied).backward();
  loss(a, b).backward();
  check_close(tied.grad(), a.grad().plus(b.grad()), 1e-12, 1e-12, "tied gradient");
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

FFN_GPU_TEST("embedding_sum, the accumulating backward and position_grad on the GPU") {
  Generator g(32);
  struct Case {
    int64_t seqs, t, v, c, p;
  };
  for (const Case k : {Case{1, 1, 1, 1, 1}, Case{3, 37, 65, 384, 64}, Case{4, 128, 1000, 768, 256},
                       Case{2, 5, 7, 5, 9}, Case{64, 16, 3, 40, 16}})
    for (auto [dt, wide] : {std::pair{DType::bf16, true}, std::pair{DType::bf16, false},
                            std::pair{DType::f32, false}}) {
      const DType ot = wide ? DType::f32 : dt;
      const int64_t n = k.seqs * k.t;
      const Tensor table = rand64({k.v, k.c}, g).to(dt), pos = rand64({k.p, k.c}, g).to(dt);
      const Tensor id = ids(n, k.v, 5);
      Tensor out = Tensor::empty({n, k.c}, ot, kGpu);
      embedding_sum(id.to(kGpu), table.to(kGpu), pos.to(kGpu), k.t, out);
      // fp32 addition rounds the exact sum once, as the f64 sum rounded to fp32 does.
      Tensor ref = Tensor::empty({n, k.c}, DType::f32);
      embedding_sum(id, table.to(DType::f32), pos.to(DType::f32), k.t, ref);
      check_close(out.to(Device::cpu()).to(DType::f64), ref.to(ot).to(DType::f64), 0, 0,
                  "embedding_sum");
      const Tensor dout = rand64({n, k.c}, g).to(ot), old = rand64({k.v, k.c}, g).to(dt);
      Tensor d1 = old.to(kGpu).clone(), d2 = old.to(kGpu).clone();
      embedding_backward(id.to(kGpu), dout.to(kGpu), d1, true, true);
      embedding_backward(id.to(kGpu), dout.to(kGpu), d2, true, true);
      check_close(d1.to(Device::cpu()).to(DType::f64), d2.to(Device::cpu()).to(DType::f64), 0, 0,
                  "accumulating embedding backward is bitwise deterministic");
      Tensor r64 = old.to(DType::f64), r32 = old.to(DType::f32);
      embedding_backward(id, dout.to(DType::f64), r64, true, true);
      embedding_backward(id, dout.to(DType::f32), r32, true, true);
      check_against_reference(d1, r64, r32, dt, "accumulating embedding backward",
                              {.reduce_len = static_cast<double>(n) / static_cast<double>(k.v) + 2,
                               .term_bound = 4 * max_abs(r64)});
      Tensor p1 = Tensor::empty({k.p, k.c}, dt, kGpu);
      position_grad(dout.to(kGpu), k.t, p1);
      Tensor q64 = Tensor::empty({k.p, k.c}, DType::f64), q32 = Tensor::empty({k.p, k.c}, DType::f32);
      position_grad(dout.to(DType::f64), k.t, q64);
      position_grad(dout.to(DType::f32), k.t, q32);
      check_against_reference(p1, q64, q32, dt, "position_grad",
                              {.reduce_len = static_cast<double>(k.seqs),
                               .term_bound = 1.0});
    }
}
