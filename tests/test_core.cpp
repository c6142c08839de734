// tests/test_core.cpp — dtypes, Philox and the dropout mask, tensors and views, autograd.
#include <cmath>
#include <limits>
#include <random>

#include "core/autograd.h"
#include "core/generator.h"
#include "core/graph.h"
#include "core/cuda/allocator.h"
#include "core/readback.h"
#include "layers/functional.h"
#include "tests/test_util.h"

using namespace ffn;
using ffn::test::gpu_available;

TEST_CASE("dtype bf16 and f16 conversions round to nearest even") {
  // Exactly representable values survive.
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f /* 2^-14 */})
    CHECK(static_cast<float>(f16(v)) == v);
  for (float v : {0.0f, 1.0f, -3.0f, 0x1p100f}) CHECK(static_cast<float>(bf16(v)) == v);
  // Ties go to even: 1 + 2^-11 lies between 1 and 1 + 2^-10 in f16 -> 1.
  CHECK(f16(1.0f + 0.00048828125f).bits == 0x3c00);
  CHECK(f16(1.0f + 3 * 0.00048828125f).bits == 0x3c02);
  // bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> 1; 1 + 3·2^-8 -> 1 + 2^-6.
  CHECK(bf16(1.0f + 0.00390625f).bits == 0x3f80);
  CHECK(bf16(1.0f + 3 * 0.00390625f).bits == 0x3f82);
  // f16 overflow, subnormals, specials.
  CHECK(f16(65520.0f).bits == 0x7c00);
  CHECK(f16(65519.0f).bits == 0x7bff);
  CHECK(f16(5.9604645e-08f).bits == 0x0001);  // 2^-24, the smallest subnormal
  CHECK(static_cast<float>(f16(f16_bits_to_float(0x0001))) == 5.9604645e-08f);
  CHECK(f16(2.0e-8f).bits == 0x0000);
  CHECK(std::isnan(static_cast<float>(f16(std::nanf("")))));
  CHECK(std::isnan(static_cast<float>(bf16(std::nanf("")))));
  CHECK(std::isinf(static_cast<float>(bf16(std::numeric_limits<float>::infinity()))));
  CHECK(f16(-0.0f).bits == 0x8000);
  // Every f16 bit pattern round-trips through float.
  int bad = 0;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float v = f16_bits_to_float(static_cast<uint16_t>(b));
    if (std::isnan(v)) continue;
    bad += f16(v).bits != b;
  }
  CHECK(bad == 0);
}

TEST_CASE("dtype names parse and print") {
  CHECK(parse_dtype("bf16") == DType::bf16);
  CHECK(parse_dtype("float32") == DType::f32);
  CHECK(std::string(dtype_name(DType::f16)) == "f16");
  CHECK_THROWS_WITH_AS(parse_dtype("int8"), doctest::Contains("[dtype] unknown dtype 'int8'"),
                       Error);
}

TEST_CASE("philox4x32-10 matches Random123 known-answer vectors") {
  auto run = [](U32x4 c, uint32_t k0, uint32_t k1) { return philox4x32_10(c, k0, k1); };
  U32x4 r = run({{0, 0, 0, 0}}, 0, 0);
  CHECK(r.v[0] == 0x6627e8d5u);
  CHECK(r.v[1] == 0xe169c58du);
  CHECK(r.v[2] == 0xbc57ac4cu);
  CHECK(r.v[3] == 0x9b00dbd8u);
  r = run({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  CHECK(r.v[0] == 0x408f276du);
  CHECK(r.v[1] == 0x41c83b0eu);
  CHECK(r.v[2] == 0xa20bc7c6u);
  CHECK(r.v[3] == 0x6d5451fdu);
  r = run({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  CHECK(r.v[0] == 0xd16cfe09u);
  CHECK(r.v[1] == 0x94fdccebu);
  CHECK(r.v[2] == 0x5001e420u);
  CHECK(r.v[3] == 0x24126ea1u);
  // The precomputed-key variant used by the kernels is the same function.
  for (uint64_t seed : {0ull, 42ull, 0xfedcba9876543210ull}) {
    const PhiloxKeys keys = PhiloxKeys::from(seed);
    for (uint64_t blk : {0ull, 1ull, 1ull << 35})
      for (int j = 0; j < 4; ++j)
        CHECK(philox_block(keys, 9, blk).v[j] == philox_block(seed, 9, blk).v[j]);
  }
}

TEST_CASE("philox: a block from the stream's prefix equals the block (Note [Philox prefix])") {
  // Random seeds, offsets and blocks, with block indices past 2^32 (the high word's own
  // round-1 product) as well as below; a wrong word anywhere fails the count.
  std::mt19937_64 g(2024);
  int64_t wrong = 0, high = 0;
  for (int t = 0; t < 20000; ++t) {
    const uint64_t seed = g(), offset = t % 4 == 0 ? t : g();
    const uint64_t blk = t % 3 == 0   ? g()
                         : t % 3 == 1 ? (g() & 0xffffffffull)
                                      : (g() & 0x3ffffffffull);
    const PhiloxKeys keys = PhiloxKeys::from(seed);
    const PhiloxPrefix pre = philox_prefix(keys, offset);
    const U32x4 a = philox_block(keys, offset, blk), b = philox_block(keys, pre, blk);
    for (int j = 0; j < 4; ++j) wrong += a.v[j] != b.v[j];
    high += (blk >> 32) != 0;
  }
  CHECK(wrong == 0);
  CHECK(high > 5000);
  // Random123's third known-answer vector through the prefix.
  const PhiloxKeys keys = PhiloxKeys::from(0x299f31d0a4093822ull);
  const uint64_t offset = 0x0370734413198a2eull, blk = 0x85a308d3243f6a88ull;
  const U32x4 r = philox_block(keys, philox_prefix(keys, offset), blk);
  CHECK(r.v[0] == 0xd16cfe09u);
  CHECK(r.v[3] == 0x24126ea1u);
}

TEST_CASE("dropout mask: keep rate, determinism, offsets, p = 0 and p = 1") {
  const int64_t n = 1000000;
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const DropoutSpec d{p, 42, 7};
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) kept += d.keep(static_cast<uint64_t>(i));
    const double mean = n * (1.0 - p), sigma = std::sqrt(n * p * (1.0 - p));
    INFO("p=", p, " kept=", kept, " expected=", mean, " sigma=", sigma);
    CHECK(std::fabs(static_cast<double>(kept) - mean) <= 4 * sigma);
  }
  const DropoutSpec a{0.5f, 42, 7}, b{0.5f, 42, 7}, c{0.5f, 42, 8}, e{0.5f, 43, 7};
  int64_t same_ab = 0, same_ac = 0, same_ae = 0;
  for (int64_t i = 0; i < 100000; ++i) {
    same_ab += a.keep(i) == b.keep(i);
    same_ac += a.keep(i) == c.keep(i);
    same_ae += a.keep(i) == e.keep(i);
  }
  CHECK(same_ab == 100000);
  // Independent masks agree on about half the entries.
  CHECK(same_ac > 49000);
  CHECK(same_ac < 51000);
  CHECK(same_ae > 49000);
  CHECK(same_ae < 51000);
  const DropoutSpec zero{0.0f, 1, 1}, one{1.0f, 1, 1};
  bool all_kept = true, none_kept = true;
  for (int64_t i = 0; i < 100000; ++i) {
    all_kept = all_kept && zero.keep(i);
    none_kept = none_kept && !one.keep(i);
  }
  CHECK(all_kept);
  CHECK(none_kept);
  CHECK(one.scale() == 0.0f);
  CHECK(zero.scale() == 1.0f);
  // Generator hands out a new offset per call.
  Generator g(5);
  const DropoutSpec d1 = g.dropout(0.1f), d2 = g.dropout(0.1f);
  CHECK(d1.offset != d2.offset);
  CHECK(d1.seed == d2.seed);
}

TEST_CASE("tensor shapes, strides, views and copies") {
  Generator g(1);
  Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4}, DType::f64);
  CHECK(t.strides() == Shape{4, 1});
  CHECK(t.is_contiguous());
  CHECK(t.size(-1) == 4);
  CHECK(t.reshape({2, -1}).shape() == Shape{2, 6});
  CHECK(t.reshape({2, -1}).storage() == t.storage());  // a view
  const Tensor rows = t.slice_rows(1, 3);
  CHECK(rows.to_vector() == std::vector<double>{4, 5, 6, 7, 8, 9, 10, 11});
  const auto halves = t.chunk(2, -1);
  CHECK(!halves[1].is_contiguous());
  CHECK(halves[1].to_vector() == std::vector<double>{2, 3, 6, 7, 10, 11});
  const Tensor hc = halves[1].contiguous();
  CHECK(hc.is_contiguous());
  CHECK(hc.storage() != t.storage());
  CHECK(hc.to_vector() == std::vector<double>{2, 3, 6, 7, 10, 11});
  // Reshape of a strided view copies.
  CHECK(halves[0].reshape({6}).to_vector() == std::vector<double>{0, 1, 4, 5, 8, 9});
  // 3-D view_2d.
  Tensor t3 = Tensor::zeros({2, 3, 5});
  CHECK(t3.view_2d().shape() == Shape{6, 5});
  CHECK(Tensor::zeros({0, 5}).view_2d().shape() == Shape{0, 5});
  // dtype casts round-trip through bf16 with bf16 precision.
  Tensor r = Tensor::randn({1000}, g, DType::f32);
  const Tensor back = r.to(DType::bf16).to(DType::f32);
  CHECK(ffn::test::max_abs_diff(back, r) <= 0.02);
  CHECK(ffn::test::max_abs_diff(back, r) > 0.0);
  // copy_ into a strided destination.
  Tensor dst = Tensor::zeros({3, 4}, DType::f32);
  dst.chunk(2, -1)[0].copy_(Tensor::full({3, 2}, 7.0, DType::f64));
  CHECK(dst.to_vector() == std::vector<double>{7, 7, 0, 0, 7, 7, 0, 0, 7, 7, 0, 0});
  // add_
  Tensor acc = Tensor::full({4}, 1.0);
  acc.add_(Tensor::full({4}, 2.0), 0.5);
  CHECK(acc.to_vector() == std::vector<double>{2, 2, 2, 2});
  // plus: a new tensor in self's dtype; the other operand may be a 16-bit tensor.
  const Tensor wide = Tensor::from_vector({1.5, -2, 3.25}, {3}, DType::f32);
  const Tensor sum = wide.plus(Tensor::from_vector({0.5, 1, -0.25}, {3}, DType::bf16));
  CHECK(sum.dtype() == DType::f32);
  CHECK(sum.to_vector() == std::vector<double>{2, -1, 3});
  CHECK(wide.to_vector() == std::vector<double>{1.5, -2, 3.25});
  // 64-bit sizes: shape arithmetic does not overflow 32 bits.
  CHECK(shape_numel({65536, 65536}) == (int64_t{1} << 32));
}

// Tensor::borrow: a view of memory the caller owns; writes land there and dropping the
// tensor frees nothing (the caller's vector is read afterwards).
TEST_CASE("tensor borrow: views the caller's memory and never frees it") {
  std::vector<float> mem(12, 0.0f);
  {
    Tensor t = Tensor::borrow(mem.data(), {3, 4}, DType::f32, Device::cpu());
    CHECK(t.is_contiguous());
    CHECK(t.data_ptr() == mem.data());
    Tensor row = t.narrow(0, 1, 1);
    row.fill_(2.5);
  }
  CHECK(mem[3] == 0.0f);
  CHECK(mem[4] == 2.5f);
  CHECK(mem[7] == 2.5f);
  CHECK(mem[8] == 0.0f);
  CHECK_THROWS_WITH_AS(Tensor::borrow(nullptr, {2}, DType::f32, Device::cpu()),
                       doctest::Contains("[tensor] borrow: null data for shape [2]"), Error);
}

TEST_CASE("tensor errors name the op and the values") {
  Tensor t = Tensor::zeros({3, 4});
  CHECK_THROWS_WITH_AS(t.reshape({5, 2}), doctest::Contains("[reshape] cannot reshape [3, 4]"),
                       Error);
  CHECK_THROWS_WITH_AS(t.narrow(1, 2, 3), doctest::Contains("[narrow] range [2, 5) out of bounds"),
                       Error);
  CHECK_THROWS_WITH_AS(t.data<double>(), doctest::Contains("data<f64>() on a tensor of dtype f32"),
                       Error);
  CHECK_THROWS_WITH_AS(t.chunk(3, -1), doctest::Contains("[chunk] dim -1 of size 4"), Error);
  CHECK_THROWS_WITH_AS(Tensor::empty({2, -1}), doctest::Contains("negative dimension"), Error);
  CHECK_THROWS_WITH_AS(Device::parse("gpu0"),
                       doctest::Contains("[device] cannot parse device 'gpu0'"), Error);
  CHECK(Device::parse("cuda:3") == Device::cuda(3));
  Tensor a = Tensor::zeros({4}), b = Tensor::zeros({5});
  CHECK_THROWS_WITH_AS(a.add_(b), doctest::Contains("[add_] shape mismatch: self [4] vs other [5]"),
                       Error);
  CHECK_THROWS_WITH_AS(a.plus(b), doctest::Contains("[plus] shape mismatch: self [4] vs other [5]"),
                       Error);
  // The location follows the message.
  try {
    t.reshape({7});
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("tensor.cpp") != std::string::npos);
  }
}

TEST_CASE("cuda tensors without a GPU fail clearly" * doctest::skip(gpu_available())) {
  CHECK_THROWS_WITH_AS(Tensor::zeros({2}, DType::f32, Device::cuda(0)), doctest::Contains("CUDA"),
                       Error);
}

TEST_CASE("autograd sums gradients, guards reuse and honours no_grad") {
  Var x(Tensor::from_vector({1, 2, 3}, {3}, DType::f64), true, "x");
  // A value used twice gets both contributions.
  Var y = fn::add(x, x);
  y.backward(Tensor::full({3}, 1.0, DType::f64));
  CHECK(x.grad().to_vector() == std::vector<double>{2, 2, 2});
  // Leaves accumulate across backward calls until zero_grad.
  Var y2 = fn::add(x, x);
  y2.backward(Tensor::full({3}, 0.5, DType::f64));
  CHECK(x.grad().to_vector() == std::vector<double>{3, 3, 3});
  x.zero_grad();
  CHECK(!x.grad().defined());
  // Backward twice through freed context is an error.
  CHECK_THROWS_WITH_AS(y.backward(Tensor::full({3}, 1.0, DType::f64)),
                       doctest::Contains("[backward] 'add' already ran backward"), Error);
  // A non-scalar output needs an explicit seed.
  Var y3 = fn::add(x, x);
  CHECK_THROWS_WITH_AS(y3.backward(), doctest::Contains("non-scalar output of shape [3]"), Error);
  CHECK_THROWS_WITH_AS(y3.backward(Tensor::full({4}, 1.0, DType::f64)),
                       doctest::Contains("[backward] d_out.shape=[4] but expected [3]"), Error);
  // Under no_grad nothing is recorded.
  {
    NoGradGuard ng;
    Var y4 = fn::add(x, x);
    CHECK(!y4.requires_grad());
    CHECK(!y4.grad_fn());
  }
  CHECK(grad_enabled());
  Var c(Tensor::zeros({3}, DType::f64), false);
  CHECK_THROWS_WITH_AS(fn::add(c, c).backward(Tensor::zeros({3}, DType::f64)),
                       doctest::Contains("does not require grad"), Error);
  // Diamond: z = (x + x) + x reaches x three times.
  Var x2(Tensor::from_vector({1}, {1}, DType::f64), true);
  Var z = fn::add(fn::add(x2, x2), x2);
  z.backward();
  CHECK(x2.grad().item() == 3.0);
}

TEST_CASE("readback: values after wait, one copy at a time, clear misuse errors") {
  Readback rb;
  CHECK_THROWS_WITH_AS(rb.wait(), doctest::Contains("[readback] wait() without a started copy"),
                       Error);
  Tensor t = Tensor::from_vector({1.5, -2.0, 3.0}, {3}, DType::f32);
  rb.start(t);
  CHECK(rb.pending());
  CHECK_THROWS_WITH_AS(rb.start(t), doctest::Contains("previous copy was not waited for"), Error);
  t.fill_(7.0);  // a CPU source is read at start()
  CHECK(rb.wait() == std::vector<double>{1.5, -2.0, 3.0});
  CHECK(!rb.pending());
  CHECK_THROWS_WITH_AS(rb.start(Tensor::zeros({2000}, DType::f64)),
                       doctest::Contains("at most 4096 bytes"), Error);
}

TEST_CASE("small host-to-device copies are staged: the source may change at once, order holds" *
          doctest::skip(!gpu_available())) {
  const Device gpu = Device::cuda(0);
  // More copies than staging slots, each followed by device work that reads it, so slots are
  // reused while earlier copies may still be queued.
  std::vector<Tensor> outs;
  for (int i = 0; i < 40; ++i) {
    std::vector<double> v(1000 + 37 * i);
    for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<double>(i * 100000 + k);
    Tensor host = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::f64);
    Tensor d = host.to(gpu);
    host.fill_(-1.0);  // the copy already owns its bytes
    outs.push_back(d.to(DType::f32));
  }
  for (int i = 0; i < 40; ++i) {
    const std::vector<double> got = outs[i].to_vector();
    REQUIRE(got.size() == static_cast<size_t>(1000 + 37 * i));
    CHECK(got.front() == static_cast<double>(static_cast<float>(i * 100000)));
    CHECK(got.back() == static_cast<double>(static_cast<float>(i * 100000 + got.size() - 1)));
  }
  // A large copy takes the synchronous path and is exact too.
  Tensor big = Tensor::full({600000}, 3.0, DType::f64);
  CHECK(big.to(gpu).to_vector()[599999] == 3.0);
  // Readback of a device tensor: the value written by work queued before start().
  Readback rb;
  for (int i = 0; i < 3; ++i) {
    Tensor d = Tensor::full({4}, 1.0 + i, DType::f32, gpu);
    rb.start(d);
    d.fill_(100.0);  // queued after the copy: not seen
    CHECK(rb.wait() == std::vector<double>(4, 1.0 + i));
  }
}

TEST_CASE("fill_ on the GPU: zero (a memset), -0, other values, strided views" *
          doctest::skip(!gpu_available())) {
  const Device gpu = Device::cuda(0);
  for (DType dt : {DType::f32, DType::bf16, DType::f64, DType::i32}) {
    CAPTURE(dtype_name(dt));
    Tensor t = Tensor::full({5, 6}, 3.0, dt, gpu);
    t.zero_();
    for (double v : t.to(Device::cpu()).to_vector()) REQUIRE(v == 0.0);
    Tensor col = t.narrow(1, 2, 1);  // a strided view: only that column changes
    col.fill_(dt == DType::i32 ? 4.0 : -0.0);
    const auto all = t.to(Device::cpu()).to_vector();
    for (int i = 0; i < 30; ++i) {
      CHECK(all[i] == (i % 6 == 2 && dt == DType::i32 ? 4.0 : 0.0));
      if (dt != DType::i32) CHECK(std::signbit(all[i]) == (i % 6 == 2));
    }
  }
}

TEST_CASE("StepGraph: a captured sequence runs only when replayed, reads its inputs' new "
          "values, keeps its memory to itself, and refuses host copies" *
          doctest::skip(!gpu_available())) {
  const Device gpu = Device::cuda(0);
  Tensor x = Tensor::full({1000}, 1.0, DType::f32, gpu);  // an input made before the capture
  Tensor out = Tensor::zeros({1000}, DType::f32, gpu);
  // What a graph cannot hold throws, naming it, and leaves the stream usable.
  {
    StepGraph bad;
    CHECK_THROWS_WITH_AS(bad.capture(gpu, [&] { (void)x.to(Device::cpu()); }),
                         doctest::Contains("a device-to-host copy on cuda:0 while its stream is "
                                           "captured into a CUDA graph"),
                         Error);
    CHECK_FALSE(bad.captured());
    CHECK_THROWS_WITH_AS(bad.capture(gpu, [&] { (void)Tensor::full({3}, 1.0, DType::f64).to(gpu); }),
                         doctest::Contains("a host-to-device copy"), Error);
    Readback rb;
    CHECK_THROWS_WITH_AS(bad.capture(gpu, [&] { rb.start(x); }), doctest::Contains("a readback"),
                         Error);
    CHECK_THROWS_WITH_AS(bad.launch(), doctest::Contains("before a successful capture()"), Error);
    CHECK(cuda_alloc::private_pool_blocks(0) == 0);
    CHECK(x.to_vector()[999] == 1.0);
  }
  StepGraph g;
  void* scratch = nullptr;
  g.capture(gpu, [&] {
    Tensor t = x.clone();  // allocated in the capture: the graph's own block
    scratch = t.data_ptr();
    t.add_(x, 2.0);
    out.copy_(t);
  });
  CHECK(g.captured());
  CHECK(g.nodes() >= 2);
  CHECK(g.describe().find(" kernels, ") != std::string::npos);
  CHECK(cuda_alloc::is_private_block(scratch, 0));
  CHECK(out.to_vector()[0] == 0.0);  // nothing ran during the capture
  g.launch();
  CHECK(out.to_vector()[0] == 3.0);
  x.fill_(2.0);  // a new input value, written outside the graph
  g.launch();
  const std::vector<double> v = out.to_vector();
  CHECK(v[0] == 6.0);
  CHECK(v[999] == 6.0);
  // Allocations outside the capture never get the graph's memory, though its scratch is free.
  for (int i = 0; i < 4; ++i) {
    Tensor u = Tensor::empty({1000}, DType::f32, gpu);
    CHECK_FALSE(cuda_alloc::is_private_block(u.data_ptr(), 0));
  }
  StepGraph second;
  CHECK_THROWS_WITH_AS(second.capture(gpu, [] {}),
                       doctest::Contains("one captured graph per device at a time"), Error);
  CHECK(g.captured());  // the refused capture left the first graph's pool alone
  CHECK(cuda_alloc::is_private_block(scratch, 0));
  g.launch();
  CHECK(out.to_vector()[5] == 6.0);
}
