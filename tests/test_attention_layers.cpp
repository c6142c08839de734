// tests/test_attention_layers.cpp — the attention layers (layers/attention.cpp) as the models
// use them: rope_attention's finite differences and its fused GPU node against the CPU, and
// the QKV projection's bias gradient handed over by the fused attention backward (Note
// [Branch bias gradient]). Part of the test_layers suite.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/layer_norm.h"
#include "layers/functional.h"
#include "tests/test_util.h"

using namespace ffn;
using ffn::test::rand64;

TEST_CASE("rope_attention (projection, rotary embeddings, attention) passes FD checks") {
  // On the CPU it is causal_attention(rope(linear(x, w))) (Note [Fused rotary embeddings]).
  Generator g(66);
  for (float p : {0.0f, 0.3f}) {
    const DropoutSpec d{p, 13, 4};
    ffn::test::gradcheck(
        [&](const std::vector<Var>& in) { return fn::rope_attention(in[0], in[1], 2, 50.0, d); },
        {rand64({2, 5, 6}, g), rand64({3 * 2 * 4, 6}, g)}, {"x", "w"});
  }
  Var x(rand64({1, 3, 6}, g), true), w(rand64({10, 6}, g), true);
  CHECK_THROWS_WITH_AS(fn::rope_attention(x, w, 2, 50.0, {}),
                       doctest::Contains("[rope_attention] w's 10 rows are not 3·heads·head_dim"),
                       Error);
}

FFN_GPU_TEST("rope_attention on the GPU: the fused node and the composition match the CPU") {
  // gemm_epilogues() on: one node, the rotation in the QKV GEMM's epilogue (Hopper) and in the
  // attention backward's stores; off: linear, rope and causal_attention. Both in bf16 against
  // the f64 CPU; T = 256 and 300 take the Hopper attention, T = 100 mma.sync.
  Generator g(67);
  const bool epilogues = gemm_epilogues();
  const Device gpu = Device::cuda(0);
  struct Case {
    int64_t b, t, h, c;
    float p;
  };
  for (const Case& cs :
       {Case{2, 256, 2, 128, 0.0f}, Case{2, 100, 2, 72, 0.2f}, Case{1, 300, 3, 96, 0.2f}}) {
    const int64_t n = 3 * cs.h * 64;
    const Tensor x = rand64({cs.b, cs.t, cs.c}, g).to(DType::bf16).to(DType::f64);
    const Tensor w = rand64({n, cs.c}, g, 0.2).to(DType::bf16).to(DType::f64);
    const Tensor dy = rand64({cs.b, cs.t, cs.h * 64}, g).to(DType::bf16).to(DType::f64);
    const DropoutSpec d{cs.p, 21, 5};
    auto run = [&](Device dev, DType t, std::string* node = nullptr) {
      Var xv(x.to(t).to(dev), true), wv(w.to(t).to(dev), true);
      Var y = fn::rope_attention(xv, wv, cs.h, 10000.0, d);
      if (node) *node = y.grad_fn()->name();
      y.backward(dy.to(t).to(dev));
      std::vector<Tensor> out;
      for (const Tensor& v : {y.value(), xv.grad(), wv.grad()})
        out.push_back(v.to(Device::cpu()).to(DType::f64));
      return out;
    };
    const std::vector<Tensor> ref = run(Device::cpu(), DType::f64);
    const char* names[] = {"y", "dx", "dw"};
    for (bool epi : {true, false}) {
      set_gemm_epilogues(epi);
      std::string node;
      const std::vector<Tensor> got = run(gpu, DType::bf16, &node);
      CHECK_MESSAGE(node == (epi ? "rope_attention(fused)" : "causal_attention(fused)"), node);
      for (size_t i = 0; i < ref.size(); ++i) {
        const double err = ffn::test::rel_l2(got[i], ref[i]);
        INFO("T ", cs.t, " p ", cs.p, " ", names[i], " epilogues ", epi, " rel_l2 = ", err);
        CHECK(err <= 1e-2);  // bf16 storage of qkv, y and the gradients
      }
    }
    set_gemm_epilogues(epilogues);
  }
}

FFN_GPU_TEST("the QKV projection's bias gradient comes from the fused attention backward") {
  // Note [Branch bias gradient]: linear → causal_attention (bf16, fused; T = 256 and 300 take
  // the Hopper kernels, 100 mma.sync) hands the projection the column sums of dqkv. Against
  // the same graph with qkv a leaf (its gradient is that dqkv, bit for bit: the kernels are
  // deterministic): b's gradient is dqkv's column sums within their rounding. With a second
  // user of qkv (a linear of it added to the output) the sum is withdrawn and b's gradient is
  // the column sums of the whole gradient.
  Generator g(68);
  const Device gpu = Device::cuda(0);
  for (int64_t t : {256, 300, 100})
    for (bool second : {false, true}) {
      const int64_t b = 2, h = 2, c = h * 64;
      const Tensor x = rand64({b, t, c}, g).to(DType::bf16).to(gpu);
      const Tensor w = rand64({3 * c, c}, g, 0.2).to(DType::bf16).to(gpu);
      const Tensor bias = rand64({3 * c}, g, 0.2).to(DType::bf16).to(gpu);
      const Tensor w2 = rand64({c, 3 * c}, g, 0.1).to(DType::bf16).to(gpu);
      const Tensor dy = rand64({b, t, c}, g).to(DType::bf16).to(gpu);
      auto out = [&](const Var& qkv) {
        Var y = fn::causal_attention(qkv, h, {}, true);
        return second ? fn::add(y, fn::linear(qkv, Var(w2), Var())) : y;
      };
      Var xv(x), wv(w, true), bv(bias, true);
      out(fn::linear(xv, wv, bv)).backward(dy);
      Var leaf(fn::linear(Var(x), Var(w), Var(bias)).value(), true);
      out(leaf).backward(dy);
      ffn::test::check_column_sums(bv.grad(), leaf.grad(),
                                   "T " + std::to_string(t) + (second ? " second user" : ""));
    }
}

// Note [RMSNorm folded into the QKV GEMM]: a = res + dropout(h) with its statistics
// (add_rms_stats), then out = a + rms_norm_rope_attention(a, g, rstd, …): the residual add
// before the norm and the stream after it, as in a Llama block. On the CPU the fold is the
// composition rope_attention(rms_norm(a, g), w, …): finite differences through all of it.
namespace {
Var folded_block(const Var& res, const Var& h, const Var& g, const Var& w, int64_t heads,
                 const DropoutSpec& drop, const DropoutSpec& attn, std::string* node = nullptr) {
  auto [a, rstd] = fn::add_rms_stats(res, h, drop, g, 1e-5);
  Var y = fn::rms_norm_rope_attention(a, g, rstd, 1e-5, w, heads, 10000.0, attn);
  if (node) *node = y.grad_fn()->name();
  return fn::add(a, y);
}
}  // namespace

TEST_CASE("rms_norm_rope_attention (the folded norm) passes FD checks through a residual add") {
  Generator g(69);
  for (float p : {0.0f, 0.3f}) {
    const DropoutSpec drop{p, 17, 2}, attn{p, 18, 3};
    ffn::test::gradcheck(
        [&](const std::vector<Var>& in) {
          return folded_block(in[0], in[1], in[2], in[3], 2, drop, attn);
        },
        {rand64({2, 5, 8}, g), rand64({2, 5, 8}, g), rand64({8}, g), rand64({3 * 8, 8}, g)},
        {"res", "h", "g", "w"});
  }
  // Its statistics are rms_norm's.
  const Tensor x = rand64({3, 8}, g), w = rand64({8}, g);
  const Tensor rstd = fn::rms_stats(Var(x), Var(w), 1e-5);
  Tensor y = Tensor::empty({3, 8}, DType::f64), r2 = Tensor::empty({3}, DType::f64);
  rms_norm(x, w, 1e-5, y, r2);
  CHECK(ffn::test::max_abs_diff(rstd, r2) == 0.0);
}

FFN_GPU_TEST("rms_norm_rope_attention on the GPU: the folded node and the composition match") {
  // bf16 stream on the GPU: with rms_fold() on, one node with the row scale in the QKV GEMM and
  // in the attention backward's stores; off, rms_norm then rope_attention. Both against the
  // f64 CPU, every gradient (res, h, the norm's g, w). T = 256 and 300 take the Hopper
  // attention, T = 100 mma.sync.
  Generator g(70);
  const bool fold = rms_fold();
  const Device gpu = Device::cuda(0);
  struct Case {
    int64_t b, t, h;
    float p;
  };
  for (const Case& cs : {Case{2, 256, 2, 0.0f}, Case{2, 100, 2, 0.2f}, Case{1, 300, 3, 0.2f}}) {
    const int64_t c = cs.h * 64;
    const Tensor res = rand64({cs.b, cs.t, c}, g).to(DType::bf16).to(DType::f64);
    const Tensor h = rand64({cs.b, cs.t, c}, g).to(DType::bf16).to(DType::f64);
    const Tensor gain =
        rand64({c}, g, 0.5).plus(Tensor::full({c}, 1.0, DType::f64)).to(DType::bf16).to(DType::f64);
    const Tensor w = rand64({3 * c, c}, g, 0.2).to(DType::bf16).to(DType::f64);
    const Tensor dy = rand64({cs.b, cs.t, c}, g).to(DType::bf16).to(DType::f64);
    const DropoutSpec drop{cs.p, 22, 5}, attn{cs.p, 23, 6};
    auto run = [&](Device dev, DType t, std::string* node = nullptr) {
      Var rv(res.to(t).to(dev), true), hv(h.to(t).to(dev), true), gv(gain.to(t).to(dev), true),
          wv(w.to(t).to(dev), true);
      Var out = folded_block(rv, hv, gv, wv, cs.h, drop, attn, node);
      out.backward(dy.to(t).to(dev));
      std::vector<Tensor> o;
      for (const Tensor& v : {out.value(), rv.grad(), hv.grad(), gv.grad(), wv.grad()})
        o.push_back(v.to(Device::cpu()).to(DType::f64));
      return o;
    };
    const std::vector<Tensor> ref = run(Device::cpu(), DType::f64);
    const char* names[] = {"out", "dres", "dh", "dg", "dw"};
    for (bool on : {true, false}) {
      set_rms_fold(on);
      std::string node;
      const std::vector<Tensor> got = run(gpu, DType::bf16, &node);
      CHECK_MESSAGE(node == (on ? "rms_norm_rope_attention(fused)" : "rope_attention(fused)"),
                    node);
      for (size_t i = 0; i < ref.size(); ++i) {
        const double err = ffn::test::rel_l2(got[i], ref[i]);
        INFO("T ", cs.t, " p ", cs.p, " ", names[i], " fold ", on, " rel_l2 = ", err);
        CHECK(err <= 1e-2);  // bf16 storage of a, qkv, y and the gradients
      }
    }
  }
  set_rms_fold(fold);
}
