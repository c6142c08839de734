// tests/test_transformer_ops.cpp — the transformer ops' CPU references (embedding,
// layer_norm, dropout_add, cross_entropy, causal softmax/attention, fused attention, batched GEMM,
// AdamW): direct formulas, fp64 finite differences, and their argument checks. Part of
// test_kernels.
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
using ffn::test::gradcheck;
using ffn::test::max_abs_diff;
using ffn::test::rand64;

namespace {
Tensor ids_of(const std::vector<double>& v, Device d = Device::cpu()) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::i32, d);
}
}  // namespace

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

TEST_CASE("layer_norm matches its formula and passes FD checks (x, w, b)") {
  Generator g(22);
  for (const Shape& s : {Shape{1, 1}, Shape{7, 13}, Shape{129, 257}, Shape{3, 5, 7}}) {
    const int64_t c = s.back();
    gradcheck(
        [&](const std::vector<Var>& in) { return fn::layer_norm(in[0], in[1], in[2], 1e-5); },
        {rand64(s, g, 2.0), rand64({c}, g), rand64({c}, g)}, {"x", "w", "b"});
  }
  // Without bias, and the statistics in the forward.
  const Tensor x = rand64({4, 6}, g, 3.0), w = rand64({6}, g);
  gradcheck([&](const std::vector<Var>& in) { return fn::layer_norm(in[0], in[1], Var(), 1e-5); },
            {x, w}, {"x", "w"});
  Tensor y = Tensor::empty({4, 6}, DType::f64), mean = Tensor::empty({4}, DType::f64),
         rstd = Tensor::empty({4}, DType::f64);
  layer_norm(x, w, Tensor(), 1e-5, y, mean, rstd);
  const auto xv = x.to_vector();
  double mu = 0, var = 0;
  for (int j = 0; j < 6; ++j) mu += xv[j] / 6;
  for (int j = 0; j < 6; ++j) var += (xv[j] - mu) * (xv[j] - mu) / 6;
  CHECK(mean.to_vector()[0] == doctest::Approx(mu).epsilon(1e-12));
  CHECK(rstd.to_vector()[0] == doctest::Approx(1 / std::sqrt(var + 1e-5)).epsilon(1e-12));
  Tensor bad_mean = Tensor::empty({4}, DType::f32);
  CHECK_THROWS_WITH_AS(layer_norm(x, w, Tensor(), 1e-5, y, bad_mean, rstd),
                       doctest::Contains("[layer_norm] mean must be f64, got f32"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, rand64({5}, g), Tensor(), 1e-5, y, mean, rstd),
                       doctest::Contains("[layer_norm] w.shape=[5] but expected [6]"), Error);
}

TEST_CASE("layer_norm backward can add dx into a sum; autograd does so for a residual stream") {
  Generator g(40);
  const Tensor x = rand64({5, 9}, g, 2.0), w = rand64({9}, g), dy = rand64({5, 9}, g);
  Tensor y = Tensor::empty({5, 9}, DType::f64), mean = Tensor::empty({5}, DType::f64),
         rstd = Tensor::empty({5}, DType::f64);
  layer_norm(x, w, Tensor(), 1e-5, y, mean, rstd);
  Tensor dx = Tensor::empty({5, 9}, DType::f64);
  layer_norm_backward(dy, x, w, mean, rstd, &dx, nullptr, nullptr);
  const Tensor prev = rand64({5, 9}, g);
  Tensor sum = prev.clone();
  layer_norm_backward(dy, x, w, mean, rstd, &sum, nullptr, nullptr, /*accumulate_dx=*/true);
  const auto sv = sum.to_vector(), pv = prev.to_vector(), dv = dx.to_vector();
  for (size_t i = 0; i < sv.size(); ++i) CHECK(sv[i] == doctest::Approx(pv[i] + dv[i]).epsilon(1e-14));
  CHECK_THROWS_WITH_AS(
      layer_norm_backward(dy, x, w, mean, rstd, nullptr, nullptr, nullptr, true),
      doctest::Contains("[layer_norm_backward] accumulate_dx needs a contiguous dx"), Error);
  // h feeds both the residual add and the LayerNorm: the add's gradient reaches h's sum
  // first and the LayerNorm adds into it (Note [Accumulating backward]).
  gradcheck(
      [&](const std::vector<Var>& in) {
        const Var h = fn::add(in[0], in[0]);
        return fn::add(h, fn::layer_norm(h, in[1], in[2], 1e-5));
      },
      {rand64({3, 4, 7}, g, 2.0), rand64({7}, g), rand64({7}, g)}, {"x", "w", "b"});
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
      CHECK(max_abs_diff(out.to(DType::f64), want.to(DType::f64)) == 0.0);  // same mask, same rounding
      // Backward: dy = dout ⊙ mask/(1−p), the bias_dropout backward.
      const Tensor dout = rand64(s, g).to(dt);
      Tensor dy = Tensor::empty(s, dt), dz = Tensor::empty(s, dt);
      dropout_add_backward(dout, d, dy);
      bias_dropout_backward(dout, d, &dz, nullptr);
      CHECK(max_abs_diff(dy.to(DType::f64), dz.to(DType::f64)) == 0.0);
    }
  for (float p : {0.0f, 0.4f})
    gradcheck(
        [&](const std::vector<Var>& in) { return fn::dropout_add(in[0], in[1], {p, 3, 0}); },
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
  gradcheck([&](const std::vector<Var>& in) { return fn::dropout_add(in[0], fn::dropout(in[1], {0.5f, 2, 0}), {}); },
            {rand64({}, g), rand64({}, g)}, {"res", "y"});
}

TEST_CASE("cross_entropy matches -log softmax, passes FD checks, rejects bad targets") {
  Generator g(23);
  const Tensor logits = rand64({3, 4}, g, 3.0);
  const Tensor t = ids_of({2, 0, 3});
  Tensor loss = Tensor::empty({}, DType::f64), lse = Tensor::empty({3}, DType::f64);
  cross_entropy(logits, t, loss, lse);
  const auto lv = logits.to_vector();
  double expect = 0;
  for (int i = 0; i < 3; ++i) {
    double s = 0;
    for (int j = 0; j < 4; ++j) s += std::exp(lv[i * 4 + j]);
    expect += std::log(s) - lv[i * 4 + static_cast<int>(t.to_vector()[i])];
  }
  CHECK(loss.item() == doctest::Approx(expect / 3).epsilon(1e-12));
  for (const Shape& s : {Shape{1, 1}, Shape{7, 13}, Shape{129, 257}, Shape{2, 3, 5}}) {
    std::vector<double> tv;
    const int64_t rows = shape_numel(s) / s.back();
    for (int64_t i = 0; i < rows; ++i) tv.push_back(static_cast<double>((i * 7) % s.back()));
    Shape ts(s.begin(), s.end() - 1);
    const Tensor targets = Tensor::from_vector(tv, ts, DType::i32);
    gradcheck([&](const std::vector<Var>& in) { return fn::cross_entropy(in[0], targets); },
              {rand64(s, g, 2.0)}, {"logits"});
  }
  CHECK_THROWS_WITH_AS(cross_entropy(logits, ids_of({2, 4, 0}), loss, lse),
                       doctest::Contains("[cross_entropy] targets[1]=4 is out of range [0, 4)"),
                       Error);
  CHECK_THROWS_WITH_AS(fn::cross_entropy(Var(logits), ids_of({1, 2})),
                       doctest::Contains("[cross_entropy] targets.shape=[2] does not match"),
                       Error);
}

TEST_CASE("causal_softmax: rows sum to one over j <= i, zero above; dropout rescales") {
  Generator g(24);
  const Tensor s = rand64({2, 5, 5}, g, 3.0);
  Tensor p = Tensor::empty({2, 5, 5}, DType::f64), pd = Tensor::empty({2, 5, 5}, DType::f64);
  causal_softmax(s, 0.5, DropoutSpec{0.5f, 7, 3}, p, &pd);
  const auto pv = p.to_vector(), dv = pd.to_vector();
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 5; ++i) {
      double sum = 0;
      for (int j = 0; j < 5; ++j) {
        const double v = pv[(b * 5 + i) * 5 + j];
        if (j > i) CHECK(v == 0.0);
        sum += v;
        const double d = dv[(b * 5 + i) * 5 + j];
        CHECK((d == 0.0 || d == doctest::Approx(2 * v)));
      }
      CHECK(sum == doctest::Approx(1.0).epsilon(1e-12));
    }
  // pd equals bias_dropout of p with the same spec (the attention backward relies on it).
  Tensor pd2 = Tensor::empty({10, 5}, DType::f64);
  ffn::bias_dropout(p.reshape({10, 5}), Tensor(), DropoutSpec{0.5f, 7, 3}, pd2);
  check_close(pd2.reshape({2, 5, 5}), pd, 0, 0, "pd == bias_dropout(p)");
  CHECK_THROWS_WITH_AS(causal_softmax(rand64({2, 5, 4}, g), 1.0, {}, p, nullptr),
                       doctest::Contains("[causal_softmax] s must be [B, T, T]"), Error);
}

TEST_CASE("causal_attention passes FD checks with and without attention dropout") {
  Generator g(25);
  struct Case {
    int64_t b, t, c, h;
  };
  for (Case cs : {Case{1, 1, 2, 1}, Case{2, 5, 6, 2}, Case{1, 7, 12, 3}})
    for (float p : {0.0f, 0.3f}) {
      const DropoutSpec d{p, 11, 2};
      gradcheck([&](const std::vector<Var>& in) { return fn::causal_attention(in[0], cs.h, d); },
                {rand64({cs.b, cs.t, 3 * cs.c}, g)}, {"qkv"});
    }
  // Causality: the output at position t must not depend on later positions.
  Tensor qkv = rand64({1, 6, 12}, g);
  const Tensor y1 = fn::causal_attention(Var(qkv), 2, {}).value();
  Tensor q2 = qkv.clone();
  q2.narrow(1, 5, 1).fill_(9.0);
  const Tensor y2 = fn::causal_attention(Var(q2), 2, {}).value();
  check_close(y2.narrow(1, 0, 5), y1.narrow(1, 0, 5), 0, 0, "positions 0..4 ignore position 5");
  CHECK_THROWS_WITH_AS(fn::causal_attention(Var(rand64({1, 3, 12}, g)), 5, {}),
                       doctest::Contains("[causal_attention] qkv.shape[-1]=12 is not"), Error);
}

namespace {
// The fused attention op's CPU reference as an autograd node, so gradcheck can take its
// finite differences (the layer uses the composite path on the CPU).
class RefAttentionNode final : public Node {
 public:
  RefAttentionNode(Tensor qkv, Tensor y, Tensor lse, int64_t h, DropoutSpec d)
      : qkv_(std::move(qkv)), y_(std::move(y)), lse_(std::move(lse)), h_(h), d_(d) {}
  const char* name() const override { return "ref_attention"; }
  std::vector<Tensor> backward(Tensor g) override {
    Tensor dqkv = Tensor::empty(qkv_.shape(), qkv_.dtype());
    fused_attention_backward(qkv_, y_, g, lse_, h_, scale(), d_, dqkv);
    return {dqkv};
  }
  void release() override {}
  size_t saved_bytes() const override { return 0; }
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(y_.size(2) / h_)); }

 private:
  Tensor qkv_, y_, lse_;
  int64_t h_;
  DropoutSpec d_;
};

Var ref_attention(const Var& qkv, int64_t h, const DropoutSpec& d, Tensor* lse_out = nullptr) {
  const Tensor& x = qkv.value();
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2) / 3;
  Tensor y = Tensor::empty({b, t, c}, x.dtype()), lse = Tensor::empty({b * h, t}, DType::f32);
  fused_attention(x, h, 1.0 / std::sqrt(static_cast<double>(c / h)), d, y, lse);
  if (lse_out) *lse_out = lse;
  return make_output(y, std::make_shared<RefAttentionNode>(x, y, lse, h, d), {qkv});
}
}  // namespace

TEST_CASE("fused_attention's CPU reference: FD checks, equal to the composite path, lse") {
  Generator g(27);
  struct Case {
    int64_t b, t, c, h;
  };
  for (Case cs : {Case{1, 1, 2, 1}, Case{2, 5, 6, 2}, Case{1, 9, 12, 3}})
    for (float p : {0.0f, 0.3f}) {
      const DropoutSpec d{p, 11, 2};
      gradcheck([&](const std::vector<Var>& in) { return ref_attention(in[0], cs.h, d); },
                {rand64({cs.b, cs.t, 3 * cs.c}, g)}, {"qkv"});
      // Same math and the same dropped entries as bmm + causal_softmax + bmm.
      const Tensor qkv = rand64({cs.b, cs.t, 3 * cs.c}, g), dy = rand64({cs.b, cs.t, cs.c}, g);
      Var a(qkv, true), b(qkv, true);
      Tensor lse;
      Var ya = ref_attention(a, cs.h, d, &lse), yb = fn::causal_attention(b, cs.h, d);
      ya.backward(dy);
      yb.backward(dy);
      check_close(ya.value(), yb.value(), 1e-12, 1e-12, "fused reference y == composite y");
      check_close(a.grad(), b.grad(), 1e-12, 1e-12, "fused reference dqkv == composite dqkv");
      // lse of query 0 is its single scaled score q0·k0/√d.
      const int64_t hd = cs.c / cs.h;
      const std::vector<double> x = qkv.to_vector(), l = lse.to_vector();
      for (int64_t bi = 0; bi < cs.b; ++bi)
        for (int64_t h = 0; h < cs.h; ++h) {
          const double* row = x.data() + bi * cs.t * 3 * cs.c;  // query 0 of batch bi
          double dot = 0;
          for (int64_t k = 0; k < hd; ++k) dot += row[h * hd + k] * row[cs.c + h * hd + k];
          CHECK(l[(bi * cs.h + h) * cs.t] ==
                doctest::Approx(dot / std::sqrt(static_cast<double>(hd))).epsilon(1e-6));
        }
    }
  Tensor y = Tensor::empty({1, 3, 4}, DType::f64), lse = Tensor::empty({2, 3}, DType::f32);
  CHECK_THROWS_WITH_AS(fused_attention(rand64({1, 3, 12}, g), 5, 0.5, {}, y, lse),
                       doctest::Contains("[fused_attention] qkv.shape[-1]=12 is not"), Error);
  Tensor bad_lse = Tensor::empty({2, 3}, DType::f64);
  CHECK_THROWS_WITH_AS(fused_attention(rand64({1, 3, 12}, g), 2, 0.5, {}, y, bad_lse),
                       doctest::Contains("[fused_attention] lse must be a contiguous f32"), Error);
  CHECK_THROWS_WITH_AS(fused_attention(rand64({1, 3, 12}, g), 2, -1.0, {}, y, lse),
                       doctest::Contains("[fused_attention] scale must be > 0"), Error);
}

TEST_CASE("bmm equals one gemm per batch entry, all transposes") {
  Generator g(26);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const Tensor a = rand64(ta ? Shape{3, 4, 5} : Shape{3, 5, 4}, g);
      const Tensor b = rand64(tb ? Shape{3, 6, 4} : Shape{3, 4, 6}, g);
      const Tensor c = bmm(a, b, {.trans_a = ta, .trans_b = tb});
      for (int64_t i = 0; i < 3; ++i) {
        const Tensor ai = a.narrow(0, i, 1).reshape({a.size(1), a.size(2)});
        const Tensor bi = b.narrow(0, i, 1).reshape({b.size(1), b.size(2)});
        check_close(c.narrow(0, i, 1).reshape({5, 6}), matmul(ai, bi, {.trans_a = ta, .trans_b = tb}),
                    0, 0, "bmm entry");
      }
    }
  CHECK_THROWS_WITH_AS(bmm(rand64({2, 3, 4}, g), rand64({3, 4, 5}, g)),
                       doctest::Contains("[bmm] batch sizes differ"), Error);
}

TEST_CASE("adamw_step follows PyTorch's AdamW for two steps; decay only where asked") {
  const AdamWHyper h{0.1, 0.9, 0.99, 1e-8, 0.5};
  AdamWSlot s;
  s.param = Tensor::from_vector({1.0, -2.0}, {2}, DType::f64);
  s.grad = Tensor::from_vector({0.5, 0.25}, {2}, DType::f64);
  s.m = Tensor::zeros({2}, DType::f64);
  s.v = Tensor::zeros({2}, DType::f64);
  s.decay = true;
  AdamWSlot nd = s;
  nd.param = s.param.clone();
  nd.m = Tensor::zeros({2}, DType::f64);
  nd.v = Tensor::zeros({2}, DType::f64);
  nd.decay = false;
  // Reference in plain doubles (grad_scale 2 doubles the gradient).
  double w[2] = {1.0, -2.0}, wn[2] = {1.0, -2.0}, m[2] = {0, 0}, v[2] = {0, 0}, mn[2] = {0, 0},
         vn[2] = {0, 0};
  const double gsrc[2] = {1.0, 0.5};
  for (int step = 1; step <= 2; ++step) {
    adamw_step({s, nd}, h, step, 2.0);
    for (int i = 0; i < 2; ++i) {
      auto upd = [&](double& wi, double& mi, double& vi, double wd) {
        wi *= 1 - h.lr * wd;
        mi = 0.9 * mi + 0.1 * gsrc[i];
        vi = 0.99 * vi + 0.01 * gsrc[i] * gsrc[i];
        wi -= h.lr * (mi / (1 - std::pow(0.9, step))) / (std::sqrt(vi / (1 - std::pow(0.99, step))) + 1e-8);
      };
      upd(w[i], m[i], v[i], 0.5);
      upd(wn[i], mn[i], vn[i], 0.0);
    }
  }
  check_close(s.param, Tensor::from_vector({w[0], w[1]}, {2}, DType::f64), 1e-14, 1e-12, "decay");
  check_close(nd.param, Tensor::from_vector({wn[0], wn[1]}, {2}, DType::f64), 1e-14, 1e-12,
              "no decay");
  CHECK(global_grad_norm({s.grad, nd.grad}) == doctest::Approx(std::sqrt(2 * (0.25 + 0.0625))));
  AdamWSlot bad = s;
  bad.m = Tensor::zeros({2}, DType::f32);
  CHECK_THROWS_WITH_AS(adamw_step({bad}, h, 1, 1.0), doctest::Contains("[adamw] slot 0: state"),
                       Error);
  CHECK_THROWS_WITH_AS(adamw_step({s}, AdamWHyper{-1.0}, 1, 1.0),
                       doctest::Contains("[adamw] lr must be >= 0, got -1"), Error);
}

TEST_CASE("adamw_decide counts applied steps, skips non-finite ones, clips; the decided step "
          "equals the explicit one") {
  const AdamWHyper h{0.1, 0.9, 0.99, 1e-8, 0.5};
  auto slot = [](double w0) {
    AdamWSlot s;
    s.param = Tensor::from_vector({w0, -2.0}, {2}, DType::f64);
    s.grad = Tensor::from_vector({3.0, 4.0}, {2}, DType::f64);  // norm 5
    s.m = Tensor::zeros({2}, DType::f64);
    s.v = Tensor::zeros({2}, DType::f64);
    return s;
  };
  AdamWSlot a = slot(1.0), b = slot(1.0);
  Tensor dec = Tensor::zeros({kDecisionSize}, DType::f64);
  const Tensor sumsq = global_grad_sumsq({a.grad});
  CHECK(sumsq.item() == 25.0);
  const AdamWDecide d{2.0, 1.0, 0.9, 0.99};  // divisor 2: norm 2.5 > clip 1
  const Tensor loss = Tensor::full({}, 1.25, DType::f32);
  for (int step = 1; step <= 2; ++step) {
    adamw_decide(loss, sumsq, d, dec);
    const std::vector<double> v = dec.to_vector();
    CHECK(v[0] == step);
    CHECK(v[1] == 1.0);
    CHECK(v[2] == 1.0 - std::pow(0.9, step));
    CHECK(v[3] == 1.0 - std::pow(0.99, step));
    CHECK(v[4] == 0.5 * (1.0 / (2.5 + 1e-6)));
    CHECK(v[5] == 1.25);
    CHECK(v[6] == 2.5);
    adamw_step({a}, h, dec);
    adamw_step({b}, h, step, v[4]);
    CHECK(a.param.to_vector() == b.param.to_vector());
  }
  // A non-finite loss or norm: not applied, the counter stays, nothing moves.
  const auto before = a.param.to_vector();
  adamw_decide(Tensor::full({}, NAN, DType::f32), sumsq, d, dec);
  CHECK(dec.to_vector()[0] == 2.0);
  CHECK(dec.to_vector()[1] == 0.0);
  adamw_step({a}, h, dec);
  CHECK(a.param.to_vector() == before);
  adamw_decide(loss, Tensor::full({1}, INFINITY, DType::f64), d, dec);
  CHECK(dec.to_vector()[1] == 0.0);
  // No clipping below the threshold.
  adamw_decide(loss, Tensor::full({1}, 0.25, DType::f64), AdamWDecide{1.0, 1.0, 0.9, 0.99}, dec);
  CHECK(dec.to_vector()[4] == 1.0);
  CHECK(dec.to_vector()[0] == 3.0);
  Tensor short_dec = Tensor::zeros({3}, DType::f64);
  CHECK_THROWS_WITH_AS(adamw_decide(loss, sumsq, d, short_dec),
                       doctest::Contains("[adamw] decision must be a contiguous f64 tensor of 8"),
                       Error);
  CHECK_THROWS_WITH_AS(adamw_decide(loss, sumsq, AdamWDecide{0.0}, dec),
                       doctest::Contains("[adamw] grad_divisor must be > 0, got 0"), Error);
  CHECK_THROWS_WITH_AS(global_grad_sumsq({}), doctest::Contains("[grad_norm] needs at least one"),
                       Error);
}
