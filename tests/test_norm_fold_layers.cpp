// tests/test_norm_fold_layers.cpp — a Llama block's MLP norm folded into its fc1
// (fn::rms_norm_ffn, Note [RMSNorm folded into the FFN] in layers/ffn_nodes.cpp): finite
// differences and the composition on the CPU, the fused and fallback paths on the GPU
// (FFN_GPU_TEST cases skip visibly without a GPU). The attention's fold is tested beside the
// attention (test_attention_layers.cpp), both folds in a whole Llama in test_layers.cpp.
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "layers/functional.h"
#include "tests/test_util.h"

using namespace ffn;
using ffn::test::rand64;

// Note [RMSNorm folded into the FFN]: a = res + dropout(h) with its statistics (add_rms_stats),
// then out = a + rms_norm_ffn(a, g, rstd, …), a Llama block's second half. The fold runs on
// the CPU too (fc1's row scale as scale_rows passes), so finite differences go through its
// node and the prescaled norm backward; in f64 it equals the composition to rounding.
namespace {
struct FoldCase {
  FfnConfig cfg;
  bool bias;
  float p;
};
Var folded_mlp(const std::vector<Var>& in, const FoldCase& cs, std::string* node = nullptr) {
  const DropoutSpec drop{cs.p, 17, 2};
  const FfnDropout fd{{cs.p, 18, 3}, {}};
  auto [a, rstd] = fn::add_rms_stats(in[0], in[1], drop, in[2], 1e-5);
  Var y = fn::rms_norm_ffn(a, in[2], rstd, 1e-5, in[3], cs.bias ? in[4] : Var(), in[5], Var(),
                           cs.cfg, fd);
  if (node) *node = y.grad_fn()->name();
  return fn::add(a, y);
}
const FoldCase kFoldCases[] = {{{Activation::silu, true, false}, false, 0.0f},
                               {{Activation::gelu_tanh, true, false}, true, 0.3f},
                               {{Activation::gelu_erf, false, false}, true, 0.3f}};
}  // namespace

TEST_CASE("rms_norm_ffn (the folded norm) passes FD checks and equals the composition") {
  Generator g(81);
  const bool fold = rms_fold();
  for (const FoldCase& cs : kFoldCases) {
    const int64_t c = 6, hid = 5, h1 = cs.cfg.gated ? 2 * hid : hid;
    const std::vector<Tensor> in{rand64({2, 3, c}, g),
                                 rand64({2, 3, c}, g),
                                 rand64({c}, g, 0.5).plus(Tensor::full({c}, 1.0, DType::f64)),
                                 rand64({h1, c}, g),
                                 rand64({h1}, g),
                                 rand64({c, hid}, g)};
    const std::vector<std::string> names{"res", "h", "g", "w1", "b1", "w2"};
    const std::vector<bool> wrt{true, true, true, true, cs.bias, true};
    CAPTURE(cs.cfg.gated);
    CAPTURE(cs.bias);
    set_rms_fold(true);
    std::string node;
    {
      std::vector<Var> vs;
      for (const Tensor& t : in) vs.emplace_back(t.clone(), true);
      folded_mlp(vs, cs, &node);
    }
    CHECK(node ==
          (cs.cfg.gated ? "rms_norm_gated_feed_forward(folded)" : "rms_norm_feed_forward(folded)"));
    ffn::test::gradcheck([&](const std::vector<Var>& v) { return folded_mlp(v, cs); }, in, names,
                         {}, wrt);
    // Folded against the composition, f64: the output and every gradient to rounding.
    std::vector<std::vector<Tensor>> runs;
    for (bool on : {true, false}) {
      set_rms_fold(on);
      std::vector<Var> vs;
      for (size_t i = 0; i < in.size(); ++i) vs.emplace_back(in[i].clone(), wrt[i]);
      Var out = folded_mlp(vs, cs);
      out.backward(Tensor::full(out.shape(), 1.0, DType::f64));
      std::vector<Tensor> r{out.value()};
      for (size_t i = 0; i < vs.size(); ++i)
        if (wrt[i]) r.push_back(vs[i].grad());
      runs.push_back(r);
    }
    for (size_t i = 0; i < runs[0].size(); ++i) {
      INFO("output/gradient ", i);
      CHECK(ffn::test::rel_l2(runs[0][i], runs[1][i]) < 1e-12);
    }
  }
  set_rms_fold(fold);
}

FFN_GPU_TEST("rms_norm_ffn on the GPU: the folded node and the composition match the CPU") {
  // bf16 stream: with rms_fold() on, one node whose fc1 runs on x with W1·diag(g) and the
  // rows' 1/rms as its row scale; off, rms_norm then the FFN; both against the f64 CPU, every
  // gradient. C = 384 runs the GLU kernels with their row scale (with a bias the backward's dz
  // is scaled by a pass of its own), C = 128 the GEMM and scale_rows passes.
  Generator g(82);
  const bool fold = rms_fold();
  const Device gpu = Device::cuda(0);
  struct Case {
    int64_t b, t, c, hid;
    FoldCase fc;
  };
  for (const Case& cs :
       {Case{2, 256, 384, 512, kFoldCases[0]}, Case{2, 100, 384, 512, kFoldCases[1]},
        Case{1, 77, 128, 192, kFoldCases[0]}, Case{2, 64, 384, 256, kFoldCases[2]}}) {
    const int64_t h1 = cs.fc.cfg.gated ? 2 * cs.hid : cs.hid;
    auto q = [](const Tensor& t) { return t.to(DType::bf16).to(DType::f64); };
    const std::vector<Tensor> in{
        q(rand64({cs.b, cs.t, cs.c}, g)),
        q(rand64({cs.b, cs.t, cs.c}, g)),
        q(rand64({cs.c}, g, 0.5).plus(Tensor::full({cs.c}, 1.0, DType::f64))),
        q(rand64({h1, cs.c}, g, 0.1)),
        q(rand64({h1}, g)),
        q(rand64({cs.c, cs.hid}, g, 0.1))};
    const Tensor dy = q(rand64({cs.b, cs.t, cs.c}, g));
    const std::vector<bool> wrt{true, true, true, true, cs.fc.bias, true};
    auto run = [&](Device dev, DType t, std::string* node = nullptr) {
      std::vector<Var> vs;
      for (size_t i = 0; i < in.size(); ++i) vs.emplace_back(in[i].to(t).to(dev), wrt[i]);
      Var out = folded_mlp(vs, cs.fc, node);
      out.backward(dy.to(t).to(dev));
      std::vector<Tensor> o{out.value().to(Device::cpu()).to(DType::f64)};
      for (size_t i = 0; i < vs.size(); ++i)
        if (wrt[i]) o.push_back(vs[i].grad().to(Device::cpu()).to(DType::f64));
      return o;
    };
    set_rms_fold(false);
    const std::vector<Tensor> ref = run(Device::cpu(), DType::f64);
    for (bool on : {true, false}) {
      set_rms_fold(on);
      std::string node;
      const std::vector<Tensor> got = run(gpu, DType::bf16, &node);
      const std::string want = cs.fc.cfg.gated ? "gated_feed_forward" : "feed_forward";
      CHECK_MESSAGE(node == (on ? "rms_norm_" + want + "(folded)" : want), node);
      for (size_t i = 0; i < ref.size(); ++i) {
        const double err = ffn::test::rel_l2(got[i], ref[i]);
        INFO("T ", cs.t, " C ", cs.c, " p ", cs.fc.p, " output/gradient ", i, " fold ", on,
             " rel_l2 = ", err);
        CHECK(err <= 1e-2);  // bf16 storage of a, z, hd and the gradients
      }
    }
  }
  set_rms_fold(fold);
}
