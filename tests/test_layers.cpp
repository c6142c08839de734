// tests/test_layers.cpp — layers: finite-difference gradients, saved state, errors, training.
#include <cmath>

#include "kernels/bias_act_dropout.h"
#include "kernels/cuda/gemm/sm90_gemm.h"
#include "kernels/gemm.h"
#include "layers/ffn_functional.h"
#include "layers/layers.h"
#include "layers/transformer.h"
#include "optim/sgd.h"
#include "tests/test_util.h"

using namespace ffn;
using ffn::test::gradcheck_vars;
using ffn::test::rand64;

namespace {

const ParamInit kF64{DType::f64, Device::cpu()};

// (input shape, hidden) pairs covering docs/design.md's gradient-check shapes.
struct Case {
  Shape x;
  int64_t hidden;
};
const Case kCases[] = {{{1, 1}, 1}, {{7, 13}, 6}, {{129, 257}, 5}, {{3, 5, 7}, 4}};

std::vector<Var> with_input(const Module& m, const Var& x) {
  std::vector<Var> v{x};
  for (const Var& p : m.parameters()) v.push_back(p);
  return v;
}

}  // namespace

TEST_CASE("Linear passes finite-difference checks with and without bias") {
  Generator g(21);
  for (const Case& c : kCases)
    for (bool bias : {true, false}) {
      const std::string shape = shape_str(c.x);
      CAPTURE(shape);
      CAPTURE(bias);
      Linear lin(
          {.in_features = c.x.back(), .out_features = c.hidden + 2, .bias = bias, .place = kF64},
          g);
      Var x(rand64(c.x, g), true, "x");
      gradcheck_vars([&]() { return lin.forward(x); }, with_input(lin, x));
    }
}

TEST_CASE("Dropout layer: gradients, eval mode, fresh masks, bad p") {
  auto rng = std::make_shared<Generator>(22);
  Dropout drop(0.4f, rng);
  Generator g(23);
  for (const Case& c : kCases) {
    Var x(rand64(c.x, g), true, "x");
    gradcheck_vars(
        [&]() {
          rng->set_offset(0);
          return drop.forward(x);
        },
        {x});
  }
  Var x(Tensor::full({64, 64}, 1.0, DType::f64), false);
  const auto a = drop.forward(x).value().to_vector(), b = drop.forward(x).value().to_vector();
  CHECK(a != b);  // two calls, two masks
  drop.eval();
  CHECK(drop.forward(x).value().to_vector() == x.value().to_vector());
  CHECK_THROWS_WITH_AS(Dropout(-0.1f, rng),
                       doctest::Contains("[dropout] dropout p must be in [0, 1], got -0.1"), Error);
  CHECK_THROWS_WITH_AS(Dropout(1.5f, rng), doctest::Contains("got 1.5"), Error);
}

TEST_CASE(
    "FeedForward passes finite-difference checks (GELU erf/tanh, dropout on/off, recompute)") {
  Generator g(24);
  for (const Case& c : kCases)
    for (Activation act : {Activation::gelu_erf, Activation::gelu_tanh})
      for (float p : {0.0f, 0.3f})
        for (bool recompute : {false, true}) {
          const std::string shape = shape_str(c.x);
          CAPTURE(shape);
          const std::string activation = std::string(activation_name(act));
          CAPTURE(activation);
          CAPTURE(p);
          CAPTURE(recompute);
          auto rng = std::make_shared<Generator>(25);
          FeedForward ffn({.d_model = c.x.back(),
                           .hidden = c.hidden,
                           .act = act,
                           .dropout = p,
                           .out_dropout = p / 2,
                           .recompute = recompute,
                           .place = kF64},
                          rng);
          Var x(rand64(c.x, g), true, "x");
          gradcheck_vars(
              [&]() {
                rng->set_offset(100);
                return ffn.forward(x);
              },
              with_input(ffn, x));
        }
}

TEST_CASE("GatedFeedForward passes finite-difference checks (GEGLU, SwiGLU, recompute)") {
  Generator g(26);
  for (const Case& c : kCases)
    for (Activation act : {Activation::gelu_tanh, Activation::silu})
      for (bool recompute : {false, true}) {
        const std::string shape = shape_str(c.x);
        CAPTURE(shape);
        const std::string activation = std::string(activation_name(act));
        CAPTURE(activation);
        CAPTURE(recompute);
        auto rng = std::make_shared<Generator>(27);
        GatedFeedForward ffn({.d_model = c.x.back(),
                              .hidden = c.hidden,
                              .act = act,
                              .dropout = 0.2f,
                              .recompute = recompute,
                              .place = kF64},
                             rng);
        Var x(rand64(c.x, g), true, "x");
        gradcheck_vars(
            [&]() {
              rng->set_offset(100);
              return ffn.forward(x);
            },
            with_input(ffn, x));
      }
}

TEST_CASE("FeedForward keeps only z between forward and backward") {
  auto rng = std::make_shared<Generator>(28);
  Generator g(29);
  for (bool gated : {false, true})
    for (bool recompute : {false, true}) {
      FeedForward ffn({.d_model = 16,
                       .hidden = 24,
                       .gated = gated,
                       .dropout = 0.1f,
                       .recompute = recompute,
                       .place = kF64},
                      rng);
      Var x(rand64({10, 16}, g), true);
      Var y = ffn.forward(x);
      const size_t expect = recompute ? 0 : size_t{10} * (gated ? 48 : 24) * sizeof(double);
      CHECK(y.grad_fn()->saved_bytes() == expect);
    }
  // Recompute changes memory, not results.
  FeedForward a({.d_model = 8, .hidden = 12, .dropout = 0.3f, .place = kF64},
                std::make_shared<Generator>(1));
  FeedForward b({.d_model = 8, .hidden = 12, .dropout = 0.3f, .recompute = true, .place = kF64},
                std::make_shared<Generator>(1));
  Var x(rand64({5, 8}, g), true);
  const Tensor dy = rand64({5, 8}, g);
  a.forward(x).backward(dy);
  const Tensor dxa = x.grad().clone();
  x.zero_grad();
  b.forward(x).backward(dy);
  CHECK(ffn::test::max_abs_diff(x.grad(), dxa) == 0.0);
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == 4);
  CHECK(pa[0].first == "fc1.weight");
  CHECK(pa[3].first == "fc2.bias");
  for (size_t i = 0; i < pa.size(); ++i)
    CHECK(ffn::test::max_abs_diff(pa[i].second.grad(), pb[i].second.grad()) == 0.0);
}

TEST_CASE("layers reject mismatched inputs with the layer name and both shapes") {
  auto rng = std::make_shared<Generator>(30);
  FeedForward ffn({.d_model = 7, .hidden = 3, .place = kF64}, rng);
  Var bad(Tensor::zeros({3, 5}, DType::f64));
  CHECK_THROWS_WITH_AS(
      ffn.forward(bad),
      doctest::Contains("[feed_forward] x.shape[-1]=5 != d_model=7 (x.shape=[3, 5])"), Error);
  Var f32(Tensor::zeros({3, 7}, DType::f32));
  CHECK_THROWS_WITH_AS(
      ffn.forward(f32),
      doctest::Contains("[feed_forward] dtype mismatch: x is f32 but weight is f64"), Error);
  Generator g(31);
  Linear lin({.in_features = 4, .out_features = 2, .place = kF64}, g);
  CHECK_THROWS_WITH_AS(lin.forward(Var(Tensor::zeros({2, 3}, DType::f64))),
                       doctest::Contains("[linear] x.shape[-1]=3 != in_features=4"), Error);
  CHECK_THROWS_WITH_AS(FeedForward({.d_model = 0, .hidden = 3}, rng),
                       doctest::Contains("[feed_forward] d_model=0 and hidden=3 must be > 0"),
                       Error);
  CHECK_THROWS_WITH_AS(FeedForward({.d_model = 4, .hidden = 3, .dropout = -0.5f}, rng),
                       doctest::Contains("dropout p must be in [0, 1], got -0.5"), Error);
  GatedFeedForward gl({.d_model = 4, .hidden = 3, .place = kF64}, rng);
  CHECK_THROWS_WITH_AS(gl.forward(bad),
                       doctest::Contains("[gated_feed_forward] x.shape[-1]=5 != d_model=4"), Error);
  // A zero-row batch is valid and produces an empty output.
  Var empty(Tensor::zeros({0, 7}, DType::f64), true);
  Var y = ffn.forward(empty);
  CHECK(y.shape() == Shape{0, 7});
}

FFN_GPU_TEST("layers reject inputs on another device") {
  auto rng = std::make_shared<Generator>(32);
  FeedForward ffn({.d_model = 4, .hidden = 3}, rng);
  Var x(Tensor::zeros({2, 4}, DType::f32, Device::cuda(0)));
  CHECK_THROWS_WITH_AS(
      ffn.forward(x),
      doctest::Contains("[feed_forward] device mismatch: x is on cuda:0 but weight is on cpu"),
      Error);
}

namespace {

// A student FFN learns a fixed random teacher FFN with SGD + momentum on one batch;
// returns (first loss, last loss) over 400 steps.
std::pair<double, double> train_teacher_student(DType dt, Device dev) {
  auto rng = std::make_shared<Generator>(33);
  const FeedForwardOptions opt{
      .d_model = 16, .hidden = 64, .act = Activation::gelu_tanh, .place = {dt, dev}};
  FeedForward teacher(opt, rng), student(opt, rng);
  Generator data(34);
  const Tensor x = Tensor::randn({256, 16}, data, dt, dev);
  Tensor target;
  {
    NoGradGuard ng;
    target = teacher.forward(Var(x)).value();
  }
  SGD sgd(student.parameters(), {.lr = 0.05, .momentum = 0.9});
  double first = 0, last = 0;
  for (int step = 0; step < 400; ++step) {
    sgd.zero_grad();
    Var loss = fn::mse_loss(student.forward(Var(x)), target);
    loss.backward();
    sgd.step();
    const double l = loss.value().item();
    REQUIRE(std::isfinite(l));
    if (step == 0) first = l;
    last = l;
  }
  return {first, last};
}

}  // namespace

TEST_CASE("an FFN regression on the CPU trains: loss falls at least 10x") {
  const auto [first, last] = train_teacher_student(DType::f32, Device::cpu());
  INFO("first loss ", first, ", last loss ", last);
  CHECK(last * 10 <= first);
}

namespace {

// Forward + backward of one layer built twice (same seed) on CPU f64 and on the GPU.
struct LayerRun {
  Tensor y;
  std::vector<Tensor> grads;  // x, then parameters in order
};

LayerRun run_ffn(const FeedForwardOptions& base, DType dt, Device dev, const Tensor& x64,
                 const Tensor& dy64) {
  FeedForwardOptions opt = base;
  opt.place = {dt, dev};
  auto rng = std::make_shared<Generator>(77);
  FeedForward ffn(opt, rng);
  if (dt != DType::f64) {  // same values as the f64 build: round the f64 init once
    FeedForwardOptions o64 = base;
    o64.place = kF64;
    FeedForward ref(o64, std::make_shared<Generator>(77));
    const auto src = ref.parameters();
    auto dst = ffn.parameters();
    for (size_t i = 0; i < dst.size(); ++i) dst[i].mutable_value().copy_(src[i].value());
  }
  Var x(x64.to(dt).to(dev), true);
  rng->set_offset(1000);
  Var y = ffn.forward(x);
  y.backward(dy64.to(dt).to(dev));
  LayerRun r{y.value().to(Device::cpu()).to(DType::f64),
             {x.grad().to(Device::cpu()).to(DType::f64)}};
  for (const Var& p : ffn.parameters())
    r.grads.push_back(p.grad().to(Device::cpu()).to(DType::f64));
  return r;
}

}  // namespace

FFN_GPU_TEST("FeedForward / GatedFeedForward on the GPU match the CPU, dropout on and off") {
  Generator g(60);
  // p = 0 in bf16 runs the GEMM epilogues (the own Hopper GEMM's activation epilogues, or
  // cuBLASLt's GELU_AUX_BIAS off Hopper); epilogues off runs the GEMMs and the fused
  // elementwise kernels apart.
  const bool epilogues = gemm_epilogues();
  for (bool epi : {true, false})
    for (bool gated : {false, true})
      for (Activation act : {Activation::gelu_tanh, Activation::gelu_erf})
        for (DType dt : {DType::f32, DType::bf16})
          for (int64_t hidden : {7, 1600})
            for (float p : {0.2f, 0.0f}) {
              if (gated && act == Activation::gelu_erf) continue;  // gated runs SiLU
              set_gemm_epilogues(epi);
              CAPTURE(epi);
              CAPTURE(gated);
              const std::string act_name = activation_name(act);
              CAPTURE(act_name);
              const std::string dtype = std::string(dtype_name(dt));
              CAPTURE(dtype);
              CAPTURE(hidden);
              CAPTURE(p);
              // d_model 4096 with hidden 1600: K long enough for the activation epilogues in
              // both directions (kernels/bias_act_dropout.cpp); hidden 7: no fused GEMM takes it.
              const int64_t d_model = hidden == 7 ? 64 : 4096;
              const FeedForwardOptions opt{.d_model = d_model,
                                           .hidden = hidden,
                                           .act = gated ? Activation::silu : act,
                                           .gated = gated,
                                           .dropout = p,
                                           .out_dropout = p / 2};
              const Tensor x =
                  rand64({3, 11, d_model}, g).to(dt).to(DType::f64);  // representable in dt
              const Tensor dy = rand64({3, 11, d_model}, g).to(dt).to(DType::f64);
              const LayerRun cpu = run_ffn(opt, DType::f64, Device::cpu(), x, dy);
              const LayerRun gpu = run_ffn(opt, dt, Device::cuda(0), x, dy);
              // f32: relative L2 within 1e-5 (fp32 GEMMs over ≤ 4096 terms); bf16: within 1e-2
              // (bf16 storage of every intermediate; METHOD.md's range for bf16 operands).
              const double tol = dt == DType::f32 ? 1e-5 : 1e-2;
              CHECK(ffn::test::rel_l2(gpu.y, cpu.y) <= tol);
              const char* names[] = {"dx", "dW1", "db1", "dW2", "db2"};
              for (size_t i = 0; i < cpu.grads.size(); ++i) {
                INFO(names[i], " rel_l2 = ", ffn::test::rel_l2(gpu.grads[i], cpu.grads[i]));
                CHECK(ffn::test::rel_l2(gpu.grads[i], cpu.grads[i]) <= tol);
              }
            }
  set_gemm_epilogues(epilogues);
}

FFN_GPU_TEST("two runs of a GPU FFN step are bitwise identical") {
  Generator g(61);
  for (float p : {0.1f, 0.0f}) {  // p = 0: the GEMM epilogues
    CAPTURE(p);
    const FeedForwardOptions opt{.d_model = 256,
                                 .hidden = 1024,
                                 .act = Activation::gelu_erf,
                                 .dropout = p,
                                 .out_dropout = p};
    const Tensor x = rand64({512, 256}, g), dy = rand64({512, 256}, g);
    const LayerRun a = run_ffn(opt, DType::bf16, Device::cuda(0), x, dy);
    const LayerRun b = run_ffn(opt, DType::bf16, Device::cuda(0), x, dy);
    CHECK(ffn::test::max_abs_diff(a.y, b.y) == 0.0);
    for (size_t i = 0; i < a.grads.size(); ++i)
      CHECK(ffn::test::max_abs_diff(a.grads[i], b.grads[i]) == 0.0);
  }
}

// The FFN's fc2 half: no W1, y = dropout(act(x))·W2ᵀ + b2 (the welder_fc2 workload). Its
// backward runs dhd = dy·W2 with z = x in the activation warpgroups' epilogue on Hopper
// (16-byte rows, d_out ≥ 1024), which writes dx and the recomputed hd for dW2; h = 201 has
// no 16-byte rows and takes the GEMM and the fused elementwise pass, as epilogues off does.
FFN_GPU_TEST("the FFN's fc2 half (welder_fc2) on the GPU matches the CPU, fused and unfused") {
  Generator g(63);
  const bool epilogues = gemm_epilogues();
  const Device gpu = Device::cuda(0);
  const int64_t m = 75, d_out = 1024;
  for (DType dt : {DType::f16, DType::bf16})
    for (Activation act : {Activation::gelu_erf, Activation::gelu_tanh})
      for (int64_t h : {200, 1608, 201})
        for (float p : {0.5f, 0.0f}) {
          const std::string what = std::string(dtype_name(dt)) + " " + activation_name(act) + " h" +
                                   std::to_string(h) + " p" + std::to_string(p);
          CAPTURE(what);
          // Values representable in dt, so the CPU (f64) and the GPU start from the same ones.
          const Tensor x = rand64({m, h}, g).to(dt).to(DType::f64);
          const Tensor w2 = rand64({d_out, h}, g, 0.05).to(dt).to(DType::f64);
          const Tensor b2 = rand64({d_out}, g).to(dt).to(DType::f64);
          const Tensor dy = rand64({m, d_out}, g).to(dt).to(DType::f64);
          const FfnConfig cfg{act, false, false};
          const FfnDropout d{{p, 4242, 9}, {}};
          auto run = [&](Device dev, DType t) {
            const FfnParams ps{{}, {}, w2.to(t).to(dev), b2.to(t).to(dev)};
            const Tensor xd = x.to(t).to(dev);
            const FfnForward f = ffn_forward(xd, ps, cfg, d);
            const FfnGrads gr = ffn_backward(dy.to(t).to(dev), xd, f, ps, cfg, d, true);
            std::vector<Tensor> out;
            for (const Tensor& v : {f.y, gr.dx, gr.dw2, gr.db2})
              out.push_back(v.to(Device::cpu()).to(DType::f64));
            return out;
          };
          const std::vector<Tensor> ref = run(Device::cpu(), DType::f64);
          const char* names[] = {"y", "dx", "dW2", "db2"};
          for (bool epi : {true, false}) {
            set_gemm_epilogues(epi);
            const std::vector<Tensor> got = run(gpu, dt);
            for (size_t i = 0; i < ref.size(); ++i) {
              const double err = ffn::test::rel_l2(got[i], ref[i]);
              INFO(names[i], " epilogues ", epi, " rel_l2 = ", err);
              CHECK(err <= 1e-2);  // 16-bit storage of every intermediate, as above
            }
          }
          set_gemm_epilogues(epilogues);
          // On Hopper the front door takes this backward for the 16-byte rows: the GPU
          // runs above took the fused kernel there.
          const Tensor probe = Tensor::zeros({8, 8}, DType::bf16, gpu);
          if (h % 8 == 0 && cuda::sm90_gemm_supported(probe, probe, probe, false, true)) {
            Tensor dz = Tensor::empty({m, h}, dt, gpu), hd = dz.clone();
            CHECK(linear_act_backward(dy.to(dt).to(gpu), w2.to(dt).to(gpu), x.to(dt).to(gpu), {},
                                      act, d.hidden, dz, hd, nullptr));
          }
        }
}

FFN_GPU_TEST("an FFN regression on the GPU trains: loss falls at least 10x") {
  const auto [first, last] = train_teacher_student(DType::f32, Device::cuda(0));
  INFO("first loss ", first, ", last loss ", last);
  CHECK(last * 10 <= first);
}

FFN_GPU_TEST("a bf16 FFN on the GPU trains with fp32 master weights") {
  const auto [first, last] = train_teacher_student(DType::bf16, Device::cuda(0));
  INFO("first loss ", first, ", last loss ", last);
  CHECK(last * 10 <= first);
}

// ---- GPT pieces (layers/transformer.h) ----

namespace {
GptConfig tiny_gpt(FfnKind ffn, float dropout, DType dt = DType::f64, Device dev = Device::cpu()) {
  GptConfig c;
  c.vocab_size = 11;
  c.context = 6;
  c.layers = 2;
  c.heads = 2;
  c.d_model = 4;
  c.ffn = ffn;
  c.ffn_mult = 2.0;
  c.dropout = dropout;
  c.init_std = 0.5;  // large enough that every path carries gradient
  c.place = ParamInit{dt, dev};
  return c;
}
Tensor token_ids(const std::vector<double>& v, int64_t b, int64_t t, Device d = Device::cpu()) {
  return Tensor::from_vector(v, {b, t}, DType::i32, d);
}
// FD checks of a model's loss on (x, y) against every parameter. The loss must be a pure
// function of the parameters: each evaluation replays the same dropout streams.
void gradcheck_model(const GptConfig& c, const Tensor& x, const Tensor& y) {
  Generator init(3);
  auto rng = std::make_shared<Generator>(9);
  GPT model(c, rng, init);
  const uint64_t off = rng->offset();
  gradcheck_vars(
      [&]() {
        rng->set_offset(off);
        return model.loss(x, y);
      },
      model.parameters());
}
}  // namespace

TEST_CASE("a 2-layer GPT passes finite-difference checks end to end (all parameters)") {
  const Tensor x = token_ids({1, 4, 10, 0, 3, 3, 7, 2, 9, 5}, 2, 5);
  const Tensor y = token_ids({4, 10, 0, 3, 3, 7, 2, 9, 5, 1}, 2, 5);
  for (FfnKind k : {FfnKind::gelu, FfnKind::swiglu})
    for (float p : {0.0f, 0.1f}) {
      CAPTURE(name_of(kFfnKindNames, k));
      CAPTURE(p);
      gradcheck_model(tiny_gpt(k, p), x, y);
    }
}

TEST_CASE("GPT: tied embeddings, parameter names, eval is deterministic, shape errors") {
  Generator init(4);
  GPT model(tiny_gpt(FfnKind::gelu, 0.2f), std::make_shared<Generator>(1), init);
  const auto named = model.named_parameters();
  CHECK(named.front().first == "wte.weight");
  CHECK(named[1].first == "wpe.weight");
  bool has_proj = false;
  for (auto& [n, v] : named) has_proj = has_proj || n == "h.1.attn.c_proj.weight";
  CHECK(has_proj);
  for (auto& [n, v] : named) CHECK(n.find("lm_head") == std::string::npos);  // tied
  const Tensor x = token_ids({1, 2, 3}, 1, 3);
  model.eval();
  const auto a = model.forward(x).value().to_vector(), b = model.forward(x).value().to_vector();
  CHECK(a == b);
  CHECK_THROWS_WITH_AS(model.forward(token_ids({1, 2, 3, 4, 5, 6, 7}, 1, 7)),
                       doctest::Contains("[gpt] sequence length 7 must be in [1, context=6]"),
                       Error);
  CHECK_THROWS_WITH_AS(model.forward(token_ids({1, 11}, 1, 2)),
                       doctest::Contains("ids[1]=11 is out of range [0, 11)"), Error);
  GptConfig bad = tiny_gpt(FfnKind::gelu, 0.0f);
  bad.heads = 3;
  CHECK_THROWS_WITH_AS(GPT(bad, std::make_shared<Generator>(1), init),
                       doctest::Contains("d_model=4 is not divisible by heads=3"), Error);
}

TEST_CASE("GPT with a padded vocabulary: same init, loss, gradients and logits as unpadded") {
  const Tensor x = token_ids({1, 4, 10, 0, 3, 3, 7, 2, 9, 5}, 2, 5);
  const Tensor y = token_ids({4, 10, 0, 3, 3, 7, 2, 9, 5, 1}, 2, 5);
  GptConfig pc = tiny_gpt(FfnKind::gelu, 0.1f);
  pc.vocab_pad_to = 8;  // 11 → 16 rows
  REQUIRE(pc.padded_vocab() == 16);
  Generator i1(3), i2(3);
  auto r1 = std::make_shared<Generator>(9), r2 = std::make_shared<Generator>(9);
  GPT plain(tiny_gpt(FfnKind::gelu, 0.1f), r1, i1), padded(pc, r2, i2);
  const Tensor wte = padded.token_embedding().value();
  CHECK(wte.shape() == Shape{16, 4});
  // The first 11 rows are drawn as for the unpadded table, and every other weight too.
  auto pp = padded.named_parameters(), up = plain.named_parameters();
  REQUIRE(pp.size() == up.size());
  CHECK(wte.narrow(0, 0, 11).contiguous().to_vector() == up[0].second.value().to_vector());
  for (double v : wte.narrow(0, 11, 5).contiguous().to_vector()) CHECK(v == 0.0);
  for (size_t i = 1; i < pp.size(); ++i)
    CHECK(pp[i].second.value().to_vector() == up[i].second.value().to_vector());
  CHECK(padded.stored_parameters() == plain.num_parameters());
  CHECK(padded.flops_per_token(5) == plain.flops_per_token(5));

  Var lu = plain.loss(x, y), lp = padded.loss(x, y);
  CHECK(lp.value().item() == doctest::Approx(lu.value().item()).epsilon(1e-13));
  lu.backward();
  lp.backward();
  const Tensor gw = pp[0].second.grad();
  CHECK(ffn::test::max_abs_diff(gw.narrow(0, 0, 11).contiguous(), up[0].second.grad()) <
        1e-13);
  for (double v : gw.narrow(0, 11, 5).contiguous().to_vector()) CHECK(v == 0.0);
  for (size_t i = 1; i < pp.size(); ++i)
    CHECK(ffn::test::max_abs_diff(pp[i].second.grad(), up[i].second.grad()) < 1e-13);

  // Logits never show the padding; the padding is not an id; files see [11, 4].
  plain.eval();
  padded.eval();
  const Tensor lo = padded.forward(x).value();
  CHECK(lo.shape() == Shape{2, 5, 11});
  CHECK(ffn::test::max_abs_diff(lo, plain.forward(x).value()) < 1e-13);
  CHECK_THROWS_WITH_AS(padded.forward(token_ids({1, 11}, 1, 2)),
                       doctest::Contains("ids[1]=11 is out of range [0, 11)"), Error);
  std::vector<std::pair<std::string, Tensor>> named;
  for (auto& [n, v] : pp) named.emplace_back(n, v.value());
  named.emplace_back("wte.weight.exp_avg", Tensor::zeros({16, 4}, DType::f64));
  named.emplace_back("wte.weightx", Tensor::zeros({16, 4}, DType::f64));
  const auto stored = padded.stored_view(named);
  CHECK(stored[0].second.shape() == Shape{11, 4});
  CHECK(stored[0].second.data_ptr() == wte.data_ptr());  // a view: loading writes the model
  CHECK(stored[stored.size() - 2].second.shape() == Shape{11, 4});
  CHECK(stored.back().second.shape() == Shape{16, 4});  // another name
}

TEST_CASE("GPT loss: the fused classifier in any chunking equals the unfused one") {
  const Tensor x = token_ids({1, 4, 10, 0, 3, 3, 7, 2, 9, 5}, 2, 5);
  const Tensor y = token_ids({4, 10, 0, 3, 3, 7, 2, 9, 5, 1}, 2, 5);
  GptConfig base = tiny_gpt(FfnKind::gelu, 0.1f);
  base.vocab_pad_to = 8;
  base.fused_classifier = false;
  auto run = [&](const GptConfig& c) {
    Generator init(3);
    GPT model(c, std::make_shared<Generator>(9), init);
    Var l = model.loss(x, y);
    l.backward(Tensor::full({}, 0.7, DType::f64));
    std::vector<Tensor> out{l.value().reshape({1})};
    for (auto& [n, v] : model.named_parameters()) out.push_back(v.grad());
    return out;
  };
  const auto ref = run(base);
  for (int64_t chunk : {0, 1, 3, 10}) {
    CAPTURE(chunk);
    GptConfig c = base;
    c.fused_classifier = true;
    c.classifier_chunk = chunk;
    const auto got = run(c);
    REQUIRE(got.size() == ref.size());
    CHECK(got[0].item() == doctest::Approx(ref[0].item()).epsilon(1e-13));
    for (size_t i = 1; i < got.size(); ++i) CHECK(ffn::test::max_abs_diff(got[i], ref[i]) < 1e-13);
  }
  // Automatic chunks: at most kClassifierChunkBytes of logits each, equal sizes.
  GptConfig g2 = tiny_gpt(FfnKind::gelu, 0.0f);
  g2.vocab_size = 50257;
  g2.vocab_pad_to = 128;
  Generator init(1);
  const GPT big(g2, std::make_shared<Generator>(1), init);
  // 16384 rows of 50304 f64 logits are 6.14 GiB: 7 chunks of ⌈16384/7⌉ rows.
  static_assert(GPT::kClassifierChunkBytes == int64_t{1} << 30);
  CHECK(big.classifier_chunk(16384) == 2341);
  CHECK(big.classifier_chunk(10) == 10);
}

TEST_CASE("GPT with a padded vocabulary passes finite-difference checks") {
  const Tensor x = token_ids({1, 4, 10, 0, 3, 3}, 2, 3);
  const Tensor y = token_ids({4, 10, 0, 3, 3, 7}, 2, 3);
  GptConfig c = tiny_gpt(FfnKind::gelu, 0.0f);
  c.vocab_pad_to = 4;
  Generator init(5);
  GPT model(c, std::make_shared<Generator>(1), init);
  gradcheck_vars([&]() { return model.loss(x, y); }, model.parameters());
}

namespace {
GptConfig tiny_llama(int64_t kv_heads, DType dt = DType::f64, Device dev = Device::cpu()) {
  GptConfig c = tiny_gpt(FfnKind::swiglu, 0.1f, dt, dev);
  c.arch = Arch::llama;
  c.heads = 4;
  c.d_model = 8;  // head size 2
  c.kv_heads = kv_heads;
  c.bias = false;
  c.tie_embeddings = false;
  c.vocab_pad_to = 4;  // 11 → 12 rows of embed_tokens and lm_head
  c.rope_theta = 50.0;
  return c;
}
}  // namespace

TEST_CASE("Llama arch (RMSNorm, RoPE, GQA, SwiGLU, untied padded head): FD checks, HF names") {
  const Tensor x = token_ids({1, 4, 10, 0, 3, 3, 7, 2, 9, 5}, 2, 5);
  const Tensor y = token_ids({4, 10, 0, 3, 3, 7, 2, 9, 5, 1}, 2, 5);
  for (int64_t kv : {4, 2, 1}) {
    CAPTURE(kv);
    gradcheck_model(tiny_llama(kv), x, y);
  }
  Generator init(4);
  GPT model(tiny_llama(2), std::make_shared<Generator>(1), init);
  std::vector<std::string> names;
  for (auto& [n, v] : model.named_parameters()) names.push_back(n);
  const std::vector<std::string> first{"model.embed_tokens.weight",
                                       "model.layers.0.input_layernorm.weight",
                                       "model.layers.0.self_attn.q_proj.weight",
                                       "model.layers.0.self_attn.k_proj.weight",
                                       "model.layers.0.self_attn.v_proj.weight",
                                       "model.layers.0.self_attn.o_proj.weight",
                                       "model.layers.0.post_attention_layernorm.weight",
                                       "model.layers.0.mlp.gate_proj.weight",
                                       "model.layers.0.mlp.up_proj.weight",
                                       "model.layers.0.mlp.down_proj.weight"};
  // (A module's own parameters come before its children's: lm_head first.)
  REQUIRE(names.size() == 1 + 1 + 2 * 9 + 1);
  CHECK(names.front() == "lm_head.weight");
  CHECK(std::vector<std::string>(names.begin() + 1, names.begin() + 11) == first);
  CHECK(names.back() == "model.norm.weight");
  const auto params = model.named_parameters();
  CHECK(params[4].second.value().shape() == Shape{4, 8});  // k_proj: 2 kv heads of 2
  CHECK(model.head_weight().value().shape() == Shape{12, 8});
  CHECK(model.stored_view({{"lm_head.weight", model.head_weight().value()}})[0].second.shape() ==
        Shape{11, 8});
  model.eval();
  CHECK(model.forward(x).value().shape() == Shape{2, 5, 11});
  GptConfig bad = tiny_llama(3);
  CHECK_THROWS_WITH_AS(GPT(bad, std::make_shared<Generator>(1), init),
                       doctest::Contains("kv_heads=3 must divide heads=4"), Error);
}

TEST_CASE("Llama GQA equals multi-head attention with each key/value head repeated per group") {
  // HF's repeat_kv: key/value head j serves query heads j·G … j·G + G - 1.
  const Tensor x = token_ids({1, 4, 10, 0, 3, 3, 7, 2, 9, 5}, 2, 5);
  const Tensor y = token_ids({4, 10, 0, 3, 3, 7, 2, 9, 5, 1}, 2, 5);
  Generator i1(6), i2(6);
  GPT gqa(tiny_llama(2), std::make_shared<Generator>(1), i1);
  GPT mha(tiny_llama(4), std::make_shared<Generator>(1), i2);
  gqa.eval();
  mha.eval();
  auto gp = gqa.named_parameters(), mp = mha.named_parameters();
  REQUIRE(gp.size() == mp.size());
  for (size_t i = 0; i < gp.size(); ++i) {
    const Tensor& src = gp[i].second.value();
    Tensor dst = mp[i].second.mutable_value();
    if (src.shape() == dst.shape()) {
      dst.copy_(src);
      continue;
    }
    // k_proj / v_proj: [2 heads · 2, 8] → [4 heads · 2, 8], head h from kv head h / 2.
    for (int64_t h = 0; h < 4; ++h) dst.narrow(0, 2 * h, 2).copy_(src.narrow(0, 2 * (h / 2), 2));
  }
  CHECK(gqa.loss(x, y).value().item() ==
        doctest::Approx(mha.loss(x, y).value().item()).epsilon(1e-14));
}

namespace {
// The same model on the CPU and the GPU (f32, the CPU's initial weights copied over): the loss
// within 1e-5, every gradient within the fp32 rule.
void check_gpu_matches_cpu(const GptConfig& cpu_cfg, const GptConfig& gpu_cfg,
                           const std::string& what) {
  const Tensor x = token_ids({1, 4, 10, 0, 3, 3, 7, 2, 9, 5}, 2, 5);
  const Tensor y = token_ids({4, 10, 0, 3, 3, 7, 2, 9, 5, 1}, 2, 5);
  Generator i1(3), i2(3);
  GPT cpu(cpu_cfg, std::make_shared<Generator>(9), i1);
  GPT gpu(gpu_cfg, std::make_shared<Generator>(9), i2);
  // Same initial weights (device-side randn may differ in the last bit).
  auto cp = cpu.parameters(), gp = gpu.parameters();
  for (size_t i = 0; i < cp.size(); ++i) gp[i].mutable_value().copy_(cp[i].value());
  Var lc = cpu.loss(x, y), lg = gpu.loss(x.to(Device::cuda(0)), y.to(Device::cuda(0)));
  lc.backward();
  lg.backward();
  CHECK(lg.value().item() == doctest::Approx(lc.value().item()).epsilon(1e-5));
  for (size_t i = 0; i < cp.size(); ++i)
    ffn::test::check_close(gp[i].grad().to(Device::cpu()), cp[i].grad(), 1e-5, 1e-3,
                           what + " grad of parameter " + std::to_string(i));
}
}  // namespace

FFN_GPU_TEST("Llama arch on the GPU (f32) matches the CPU: loss and every gradient") {
  check_gpu_matches_cpu(tiny_llama(2, DType::f32), tiny_llama(2, DType::f32, Device::cuda(0)),
                        "llama");
}

FFN_GPU_TEST("Llama arch, bf16 stream: the folded RMSNorms give the unfolded loss and gradients") {
  // Note [RMSNorm folded into the QKV GEMM] and Note [RMSNorm folded into the FFN]:
  // fp32_residual off, head size 64, T = 256 and C = 384 (the Hopper attention and GLU
  // kernels): each block's norms folded into its QKV GEMM and its fc1 (rms_fold() on) against
  // the same model (same weights, same dropout streams) with it off, within bf16's rounding.
  GptConfig c = tiny_llama(2, DType::bf16, Device::cuda(0));
  c.d_model = 384;
  c.heads = 6;
  c.kv_heads = 2;  // grouped-query: the QKV weight repeats k/v rows
  c.context = 256;
  c.fp32_residual = false;
  c.init_std = 0.05;
  const int64_t b = 2, t = 256;
  std::vector<double> ids(b * t), tg(b * t);
  for (int64_t i = 0; i < b * t; ++i) ids[i] = (i * 7 + i / 5) % 11, tg[i] = (i * 3 + 1) % 11;
  const Tensor x = token_ids(ids, b, t, Device::cuda(0)), y = token_ids(tg, b, t, Device::cuda(0));
  const bool fold = rms_fold();
  std::vector<std::vector<Tensor>> grads;
  std::vector<double> losses;
  for (bool on : {true, false}) {
    set_rms_fold(on);
    Generator init(3);
    GPT model(c, std::make_shared<Generator>(9), init);
    Var loss = model.loss(x, y);
    loss.backward();
    losses.push_back(loss.value().to(Device::cpu()).to(DType::f64).item());
    std::vector<Tensor> gs;
    for (const Var& p : model.parameters()) gs.push_back(p.grad().to(Device::cpu()).to(DType::f64));
    grads.push_back(gs);
  }
  set_rms_fold(fold);
  CHECK(losses[0] == doctest::Approx(losses[1]).epsilon(2e-3));
  double differs = std::abs(losses[0] - losses[1]);
  for (size_t i = 0; i < grads[0].size(); ++i) {
    const double err = ffn::test::rel_l2(grads[0][i], grads[1][i]);
    INFO("parameter ", i, " rel_l2 = ", err);
    CHECK(err <= 3e-2);
    differs += err;
  }
  // The kernels are deterministic: equal bits would mean the fold never ran.
  CHECK_MESSAGE(differs > 0.0, "the folded and unfolded runs gave the same bits");
}

FFN_GPU_TEST("GPT on the GPU (f32) matches the CPU: loss and every gradient") {
  for (float p : {0.0f, 0.1f})
    check_gpu_matches_cpu(tiny_gpt(FfnKind::geglu, p, DType::f32),
                          tiny_gpt(FfnKind::geglu, p, DType::f32, Device::cuda(0)),
                          "gpt p=" + std::to_string(p));
}
