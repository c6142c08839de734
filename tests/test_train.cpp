// tests/test_train.cpp — the trainer's parts: config parsing and its errors, data formats
// and batches, safetensors and checkpoints (corruption refused), bit-exact resume, the
// tiny config learning, and ffn-train's exit codes.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "kernels/gemm.h"
#include "optim/adamw.h"
#include "tests/test_util.h"
#include "tests/train_test_util.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/data.h"
#include "train/io/json.h"
#include "train/run_dir.h"
#include "train/trainer.h"

using namespace ffn;
using namespace ffn::train;
namespace fs = std::filesystem;
using ffn::test::slurp;
using ffn::test::temp_dir;

namespace {

// Expects a config error whose message starts with "[config] <key>".
void expect_config_error(const std::string& toml, const std::vector<std::string>& sets,
                         const std::string& key_and_text) {
  try {
    Config::parse(toml, "test.toml", sets);
    FAIL("no error for: " << toml);
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::config);
    CHECK_MESSAGE(std::string(e.what()).find("[config] " + key_and_text) != std::string::npos,
                  e.what());
  }
}

}  // namespace

TEST_CASE("config: defaults, file values, --set overrides, and a lossless dump") {
  const Config c = Config::parse("[train]\nlr = 3e-4\niters = 50\n[model]\nffn = \"swiglu\"\n",
                                 "t.toml", {"train.iters=70", "run.dir=out/x", "model.bias=false"});
  CHECK(c.train.lr == 3e-4);
  CHECK(c.train.iters == 70);
  CHECK(c.run.dir == "out/x");
  CHECK(c.model.ffn == FfnKind::swiglu);
  CHECK(!c.model.bias);
  CHECK(c.train.beta2 == 0.99);  // default
  CHECK(c.runtime.fused_attention);  // default: the flash-style kernels where they apply
  CHECK(!Config::parse("", "t.toml", {"runtime.fused_attention=false"}).runtime.fused_attention);
  CHECK(c.runtime.fused_classifier);  // default: the loss without the [B·T, V] logits
  CHECK(c.runtime.classifier_chunk == 0);  // automatic
  CHECK(c.runtime.cuda_graph);  // Note [CUDA graph step]
  CHECK(!Config::parse("", "t.toml", {"runtime.cuda_graph=false"}).runtime.cuda_graph);
  const Config cls = Config::parse(
      "", "t.toml", {"runtime.fused_classifier=false", "runtime.classifier_chunk=2048"});
  CHECK(!cls.runtime.fused_classifier);
  CHECK(cls.runtime.classifier_chunk == 2048);
  const Config back = Config::parse(c.to_toml(), "dump");
  CHECK(back.to_toml() == c.to_toml());
  CHECK(back.train.lr == c.train.lr);
  for (const char* f : {"configs/tiny.toml", "configs/shakespeare_char.toml",
                        "configs/gpt2_small.toml", "configs/llama_char.toml"})
    CHECK_NOTHROW(Config::load(std::string(FFN_SOURCE_DIR) + "/" + f));
  const Config lc = Config::load(std::string(FFN_SOURCE_DIR) + "/configs/llama_char.toml");
  CHECK(lc.model.arch == Arch::llama);
  CHECK(lc.model.kv_heads ==
        6);  // kv_heads = 2 measured 0.01 worse (bench/RESULTS-2026-11-24-s14-16.md, session 16)
  CHECK(std::llround(lc.model.ffn_mult * 384) == 1024);  // SwiGLU's 8/3 · d_model
  CHECK(!lc.model.tie_embeddings);
  const Config sc = Config::load(std::string(FFN_SOURCE_DIR) + "/configs/shakespeare_char.toml");
  CHECK(sc.model.layers == 6);
  CHECK(sc.model.d_model == 384);
  CHECK(sc.train.batch_size == 64);
  CHECK(sc.model.dropout == 0.2);
}

TEST_CASE("config: choice keys are parsed once into enums, with one FfnKind -> activation mapping") {
  const Config c = Config::parse(
      "[model]\nffn = \"geglu\"\n[train]\nschedule = \"linear\"\n[runtime]\nprecision = "
      "\"fp32\"\ndevice = \"cpu\"\n[data]\nkind = \"synthetic\"\n",
      "t.toml");
  CHECK(c.model.ffn == FfnKind::geglu);
  CHECK(c.train.schedule == LrSchedule::linear);
  CHECK(c.runtime.precision == Precision::fp32);
  CHECK(c.runtime.device == DeviceRequest{Device::cpu()});
  CHECK(c.data.kind == DataKind::synthetic);
  CHECK(Config::parse("", "t.toml").runtime.device == DeviceRequest{});  // "auto"
  CHECK(Config::parse("", "t.toml", {"runtime.device=cuda:2"}).runtime.device ==
        DeviceRequest{Device::cuda(2)});
  const std::string dumped = c.to_toml();
  for (const char* line : {"ffn = \"geglu\"", "schedule = \"linear\"", "precision = \"fp32\"",
                           "device = \"cpu\"", "kind = \"synthetic\""})
    CHECK_MESSAGE(dumped.find(line) != std::string::npos, line);
  // "gelu" means the exact-erf GELU everywhere (ffn-train's blocks and ffn-demo both read
  // ffn_activation), "gelu_tanh" GPT-2's approximation; the gated kinds use the tanh GELU
  // and SiLU.
  CHECK(ffn_activation(FfnKind::gelu).act == Activation::gelu_erf);
  CHECK(!ffn_activation(FfnKind::gelu).gated);
  CHECK(ffn_activation(FfnKind::geglu).act == Activation::gelu_tanh);
  CHECK(ffn_activation(FfnKind::geglu).gated);
  CHECK(ffn_activation(FfnKind::swiglu).act == Activation::silu);
  CHECK(ffn_activation(FfnKind::swiglu).gated);
  CHECK(ffn_activation(FfnKind::gelu_tanh).act == Activation::gelu_tanh);  // GPT-2's
  CHECK(!ffn_activation(FfnKind::gelu_tanh).gated);
  CHECK(Config::parse("[model]\nffn = \"gelu_tanh\"\n", "t.toml", {}).model.ffn == FfnKind::gelu_tanh);
  CHECK(compute_dtype(Precision::automatic, Device::cpu()) == DType::f32);
  CHECK(compute_dtype(Precision::automatic, Device::cuda(0)) == DType::bf16);
  CHECK(compute_dtype(Precision::fp16, Device::cuda(0)) == DType::f16);
  expect_config_error("[runtime]\ndevice = \"cpu\"\nprecision = \"bf16\"\n", {},
                      "runtime.precision: \"bf16\" needs a GPU");
  expect_config_error("[runtime]\ndevice = \"gpu0\"\n", {}, "runtime.device: expected");
  expect_config_error("[runtime]\ndevice = 3\n", {}, "runtime.device: expected");
  expect_config_error(
      "[train]\nschedule = \"step\"\n", {},
      "train.schedule: expected one of \"constant\", \"linear\", \"cosine\", got \"step\"");
  // Note [Dropout probability]: one range, [0, 1], here as in the layers and kernels.
  CHECK(Config::parse("", "t.toml", {"model.dropout=1.0"}).model.dropout == 1.0);
  expect_config_error("", {"model.dropout=1.5"},
                      "model.dropout: expected a number in [0, 1], got 1.5");
  // Devices: "auto" is decided in one place; a GPU that is not there is named.
  CHECK_THROWS_WITH_AS(
      resolve_device_spec("gpu0", "--device"),
      doctest::Contains("[config] --device: expected auto, cpu, cuda or cuda:N, got 'gpu0'"),
      Error);
  if (cuda_device_count() == 0) {
    CHECK(resolve_device({}, "runtime.device") == Device::cpu());
    CHECK_THROWS_WITH_AS(resolve_device({Device::cuda(0)}, "runtime.device"),
                         doctest::Contains("[config] runtime.device: \"cuda:0\" requested but"),
                         Error);
    CHECK(resolve_device_spec("cpu", "--device") == Device::cpu());
  }
}

TEST_CASE("config errors name the key (unknown, wrong type, out of range, cross-key)") {
  expect_config_error("[train]\nlrr = 1\n", {}, "train.lrr: unknown key");
  expect_config_error("[trian]\nlr = 1\n", {}, "trian: unknown section");
  expect_config_error("[train]\nlr = \"fast\"\n", {}, "train.lr: expected a number > 0, got \"fast\"");
  expect_config_error("[train]\nlr = -1\n", {}, "train.lr: expected a number > 0, got -1");
  expect_config_error("[train]\niters = 2.5\n", {}, "train.iters: expected an integer >= 1");
  expect_config_error("[model]\nffn = \"relu\"\n", {}, "model.ffn: expected one of");
  expect_config_error("[runtime]\nfused_attention = 1\n", {}, "runtime.fused_attention: expected");
  expect_config_error("[runtime]\nclassifier_chunk = -1\n", {},
                      "runtime.classifier_chunk: expected an integer >= 0, got -1");
  expect_config_error("[model]\nd_model = 10\nheads = 3\n", {}, "model.heads: d_model=10");
  // The llama arch: no biases, a gated MLP, kv_heads dividing heads, an even head size.
  const std::string llama = "[model]\narch = \"llama\"\nffn = \"swiglu\"\nbias = false\n";
  CHECK(Config::parse(llama, "t.toml", {"model.kv_heads=1"}).model.kv_heads == 1);
  expect_config_error(llama, {"model.bias=true"}, "model.bias: the llama arch has no biases");
  expect_config_error(llama, {"model.ffn=\"gelu\""}, "model.ffn: the llama arch's MLP is gated");
  expect_config_error(llama, {"model.kv_heads=3", "model.heads=4"},
                      "model.kv_heads: 3 does not divide heads=4");
  expect_config_error(llama, {"model.heads=64"}, "model.heads: rotary embeddings need an even");
  expect_config_error("[model]\nkv_heads = 1\n", {},
                      "model.kv_heads: grouped-query attention needs model.arch = \"llama\"");
  expect_config_error("[model]\narch = \"mamba\"\n", {}, "model.arch: expected one of");
  expect_config_error("[runtime]\nnproc = 3\n[train]\nbatch_size = 16\n", {},
                      "train.batch_size: the global batch 16 is not divisible by runtime.nproc=3");
  expect_config_error("", {"train.nope=1"}, "train.nope: unknown key");
  expect_config_error("", {"train.lr=-0.5"}, "train.lr: expected a number > 0, got -0.5");
  expect_config_error("", {"train.lr"}, "--set train.lr: expected section.key=value");
  expect_config_error("[data]\nkind = \"text\"\n", {}, "data.path: data.kind=\"text\" needs a path");
  expect_config_error("[train\nlr=1", {}, "test.toml:1:");
}

TEST_CASE("data: character vocabulary, token files in both layouts, deterministic batches") {
  const fs::path dir = temp_dir("data");
  std::ofstream(dir / "t.txt") << "hello world, hello tokens\n";
  DataSection d;
  d.kind = DataKind::text;
  d.path = (dir / "t.txt").string();
  d.val_fraction = 0.25;
  const Dataset ds = load_dataset(d, 4);
  CHECK(ds.vocab_size == 14);  // h e l o w r d t k n s , space newline
  CHECK(ds.train.size() + ds.val.size() == 26);
  CHECK(decode_chars(ds.chars, ds.train).substr(0, 5) == "hello");
  CHECK_THROWS_WITH_AS(encode_chars(ds.chars, "hello Zed"),
                       doctest::Contains("'Z' (byte 0x5a) at position 6 is not in the vocabulary"),
                       Error);
  // nanoGPT (headerless) and llm.c (256 x int32 header) uint16 files hold the same tokens.
  std::vector<uint16_t> toks(300);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 37) % 50257);
  {
    std::ofstream a(dir / "plain.bin", std::ios::binary);
    a.write(reinterpret_cast<const char*>(toks.data()), toks.size() * 2);
    std::ofstream b(dir / "llmc.bin", std::ios::binary);
    int32_t header[256] = {20240520, 1, static_cast<int32_t>(toks.size())};
    b.write(reinterpret_cast<const char*>(header), sizeof(header));
    b.write(reinterpret_cast<const char*>(toks.data()), toks.size() * 2);
  }
  const auto plain = read_token_file((dir / "plain.bin").string());
  CHECK(plain == read_token_file((dir / "llmc.bin").string()));
  CHECK(plain[5] == 185);
  CHECK(read_token_file_layout((dir / "llmc.bin").string()).layout == "llm.c v1 header");
  CHECK(read_token_file_layout((dir / "plain.bin").string()).layout == "headerless uint16");
  // Note [Token file layouts]: an llm.c file with a foreign magic is refused, not read as
  // tokens; version 2 holds uint32 tokens; other versions are named.
  auto llmc = [&](const char* name, int32_t magic, int32_t version, int width) {
    std::ofstream f(dir / name, std::ios::binary);
    int32_t header[256] = {magic, version, static_cast<int32_t>(toks.size())};
    f.write(reinterpret_cast<const char*>(header), sizeof(header));
    for (uint16_t t : toks) {
      const uint32_t w = t;
      f.write(reinterpret_cast<const char*>(&w), width);
    }
    return (dir / name).string();
  };
  CHECK_THROWS_WITH_AS(read_token_file(llmc("magic.bin", 12345, 1, 2)),
                       doctest::Contains("looks like an llm.c token file"), Error);
  CHECK_THROWS_WITH_AS(read_token_file(llmc("magic.bin", 12345, 1, 2)),
                       doctest::Contains("its magic is 12345, not 20240520"), Error);
  CHECK(read_token_file(llmc("v2.bin", 20240520, 2, 4)) == plain);
  CHECK_THROWS_WITH_AS(read_token_file(llmc("v7.bin", 20240520, 7, 2)),
                       doctest::Contains("llm.c header version 7"), Error);
  fs::resize_file(dir / "llmc.bin", 1024 + 100);
  CHECK_THROWS_WITH_AS(read_token_file((dir / "llmc.bin").string()),
                       doctest::Contains("header says 300 tokens"), Error);
  // Batches: a pure function of (seed, n); targets are inputs shifted by one.
  const Batch b1 = sample_batch(plain, 4, 8, 7, 3), b2 = sample_batch(plain, 4, 8, 7, 3);
  CHECK(b1.x.to_vector() == b2.x.to_vector());
  CHECK(b1.x.to_vector() != sample_batch(plain, 4, 8, 7, 4).x.to_vector());
  const auto xv = b1.x.to_vector(), yv = b1.y.to_vector();
  for (int i = 0; i < 7; ++i) CHECK(yv[i] == xv[i + 1]);
  // A rank's shard is its rows of the global batch.
  const Batch half = sample_batch(plain, 4, 8, 7, 3, 1, 2);
  const auto hv = half.x.to_vector();
  CHECK(std::vector<double>(xv.begin() + 16, xv.end()) == hv);
  fs::remove_all(dir);
}

TEST_CASE("safetensors round trip; truncated, bit-flipped, zero-byte and newer files refused") {
  const fs::path dir = temp_dir("st");
  Generator g(1);
  NamedTensors ts = {{"a", ffn::test::rand64({3, 4}, g).to(DType::f32)},
                     {"b.weight", ffn::test::rand64({5}, g).to(DType::bf16)},
                     {"ids", Tensor::from_vector({1, 2, 3}, {3}, DType::i32)}};
  const std::string path = (dir / "x.safetensors").string();
  save_safetensors(path, ts);
  const NamedTensors back = load_safetensors(path);
  REQUIRE(back.size() == 3);
  for (const auto& [n, t] : back) {
    const auto it = std::find_if(ts.begin(), ts.end(), [&](auto& p) { return p.first == n; });
    REQUIRE(it != ts.end());
    CHECK(t.dtype() == it->second.dtype());
    CHECK(t.to_vector() == it->second.to_vector());
  }
  // The header is plain safetensors JSON.
  const std::string bytes = slurp(path);
  uint64_t hn;
  std::memcpy(&hn, bytes.data(), 8);
  const json::Value h = json::parse(bytes.substr(8, hn), "header");
  CHECK(h.find("b.weight")->find("dtype")->str == "BF16");
  // Bit flip in the data.
  std::string flipped = bytes;
  flipped[bytes.size() - 3] ^= 0x10;
  std::ofstream(dir / "flip.safetensors", std::ios::binary) << flipped;
  CHECK_THROWS_WITH_AS(load_safetensors((dir / "flip.safetensors").string()),
                       doctest::Contains("is corrupted (CRC-32"), Error);
  std::ofstream(dir / "cut.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() - 10);
  CHECK_THROWS_WITH_AS(load_safetensors((dir / "cut.safetensors").string()),
                       doctest::Contains("is truncated"), Error);
  std::ofstream(dir / "zero.safetensors", std::ios::binary);
  CHECK_THROWS_WITH_AS(load_safetensors((dir / "zero.safetensors").string()),
                       doctest::Contains("is truncated (0 bytes"), Error);
  fs::remove_all(dir);
}

TEST_CASE("safetensors: the reference checks — overlap, gap, trailing bytes, metadata types, dtype named") {
  const fs::path dir = temp_dir("stcheck");
  // A file from a header and data, as another writer might lay it out.
  auto craft = [&](const std::string& name, const std::string& header, size_t data_bytes) {
    std::string f(8, '\0');
    const uint64_t n = header.size();
    std::memcpy(f.data(), &n, 8);
    f += header + std::string(data_bytes, '\x01');
    std::ofstream(dir / name, std::ios::binary) << f;
    return (dir / name).string();
  };
  // Valid, with tensors stored in the reverse of name order.
  const auto ok = load_safetensors(craft(
      "ok.st", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}})",
      16));
  CHECK(ok.size() == 2);
  CHECK_THROWS_WITH_AS(
      load_safetensors(craft("overlap.st",
                             R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                             12)),
      doctest::Contains("overlap"), Error);
  CHECK_THROWS_WITH_AS(
      load_safetensors(craft("gap.st",
                             R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                             20)),
      doctest::Contains("bytes [8, 12) before tensor 'b' belong to no tensor"), Error);
  CHECK_THROWS_WITH_AS(
      load_safetensors(craft("tail.st", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12)),
      doctest::Contains("4 bytes of data after the last tensor"), Error);
  CHECK_THROWS_WITH_AS(
      load_safetensors(craft("meta.st",
                             R"({"__metadata__":{"step":3},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                             8)),
      doctest::Contains("__metadata__ value of 'step' is not a string"), Error);
  CHECK_THROWS_WITH_AS(
      load_safetensors(craft("dtype.st", R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2)),
      doctest::Contains("has dtype 'F8_E4M3', which this reader does not take"), Error);
  CHECK_THROWS_WITH_AS(
      load_safetensors(craft("offs.st", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8)),
      doctest::Contains("no data_offsets [begin, end]"), Error);
  fs::remove_all(dir);
}

TEST_CASE("a checkpoint file replaced by a valid but different safetensors file is named as such") {
  const fs::path dir = temp_dir("replaced");
  TrainState st;
  st.iter = 3;
  Generator g(2);
  const NamedTensors ts{{"w", ffn::test::rand64({4, 4}, g).to(DType::f32)},
                        {"v", ffn::test::rand64({4}, g).to(DType::f32)}};
  const std::string ck = save_checkpoint(dir.string(), st, ts, ts, "", 2);
  // The same tensors rewritten with other metadata: valid, smaller, not what was recorded.
  save_safetensors((fs::path(ck) / "model.safetensors").string(), ts);
  CHECK_THROWS_WITH_AS(read_train_state(ck),
                       doctest::Contains("is a valid safetensors file but not the one this checkpoint wrote"),
                       Error);
  fs::remove_all(dir);
}

namespace {
Config tiny_config(const std::string& dir, int64_t iters) {
  return ffn::test::tiny_run(dir, iters, {"model.dropout=0.1"});
}
std::vector<std::string> metric_lines(const std::string& dir, const char* key) {
  std::ifstream in(fs::path(dir) / "metrics.jsonl");
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);)
    if (l.find(key) != std::string::npos) out.push_back(l.substr(0, l.find("\"ms_per_iter\"")));
  return out;
}
// Runs a and b of `iters` iterations computed the same: every iteration's train loss, every
// eval, and the bytes of their final checkpoints' weights and optimizer state.
void check_same_run(const std::string& a, const std::string& b, int64_t iters) {
  const auto la = metric_lines(a, "train_loss"), lb = metric_lines(b, "train_loss");
  REQUIRE(la.size() == static_cast<size_t>(iters));
  CHECK(la == lb);
  CHECK(metric_lines(a, "val_loss") == metric_lines(b, "val_loss"));
  const std::string ckpt = "ckpt-" + std::to_string(iters);
  for (const char* f : {"model.safetensors", "optim.safetensors"})
    CHECK_MESSAGE(slurp(fs::path(a) / ckpt / f) == slurp(fs::path(b) / ckpt / f), f);
}
}  // namespace

TEST_CASE("resume is bit-exact: N steps + resume + N steps == 2N steps") {
  const fs::path root = temp_dir("resume");
  const std::string a = (root / "straight").string(), b = (root / "split").string();
  TrainOptions quiet;
  quiet.quiet = true;
  run_training(tiny_config(a, 10), quiet);
  TrainOptions first = quiet;
  first.stop_after = 5;
  const TrainResult r1 = run_training(tiny_config(b, 10), first);
  CHECK(r1.iters_done == 5);
  TrainOptions second = quiet;
  second.resume = b;
  const TrainResult r2 = run_training(tiny_config(b, 10), second);
  CHECK(r2.iters_done == 10);
  check_same_run(a, b, 10);
  CHECK(fs::exists(fs::path(a) / "loss.svg"));
  // Corrupted or incompatible checkpoints are refused, naming the file.
  const fs::path model = fs::path(b) / "ckpt-10" / "model.safetensors";
  std::string bytes = slurp(model);
  bytes[bytes.size() / 2] ^= 1;
  std::ofstream(model, std::ios::binary) << bytes;
  // (Named explicitly: given the run, --resume would fall back to the intact ckpt-5.)
  TrainOptions again = quiet;
  again.resume = (fs::path(b) / "ckpt-10").string();
  CHECK_THROWS_WITH_AS(run_training(tiny_config(b, 12), again),
                       doctest::Contains("model.safetensors' is corrupted"), Error);
  std::ofstream(model, std::ios::binary) << bytes.substr(0, 100);
  CHECK_THROWS_WITH_AS(run_training(tiny_config(b, 12), again), doctest::Contains("(truncated)"),
                       Error);
  std::ofstream(fs::path(b) / "ckpt-10" / "state.toml", std::ios::app) << "version = 99\n";
  CHECK_THROWS_AS(run_training(tiny_config(b, 12), again), Error);
  Config other = tiny_config(a, 12);
  other.model.d_model = 32;
  again.resume = a;
  CHECK_THROWS_WITH_AS(run_training(other, again), doctest::Contains("different model shape"),
                       Error);
  // A fresh run refuses to clobber a run dir with checkpoints.
  CHECK_THROWS_WITH_AS(run_training(tiny_config(a, 10), quiet),
                       doctest::Contains("already holds checkpoints"), Error);
  fs::remove_all(root);
}

FFN_GPU_TEST("a GPU run with tuned GEMMs resumes bit-exact: the choices travel in the checkpoint") {
  const fs::path root = temp_dir("gemm-choices");
  const std::string a = (root / "straight").string(), b = (root / "split").string();
  // 4096 rows a step at d_model 256: the FFN's products reach m·n·k = 2^30 and are timed.
  auto cfg = [](const std::string& dir) {
    return ffn::test::tiny_run(
        dir, 8,
        {"runtime.device=cuda", "runtime.gemm_autotune=true", "model.d_model=256", "model.heads=4",
         "model.context=256", "train.batch_size=16", "model.dropout=0.1"});
  };
  TrainOptions quiet;
  quiet.quiet = true;
  reset_gemm_choices();
  run_training(cfg(a), quiet);
  CHECK(gemm_choice_stats().timed > 0);
  CHECK(read_gemm_choices((fs::path(a) / "ckpt-8").string()).find("\ngemm ") != std::string::npos);
  // The first half in this process, so with the choices the straight run timed; the second
  // as a new process would start: with nothing but the checkpoint's.
  TrainOptions first = quiet;
  first.stop_after = 4;
  run_training(cfg(b), first);
  reset_gemm_choices();
  TrainOptions second = quiet;
  second.resume = b;
  run_training(cfg(b), second);
  const GemmChoiceStats st = gemm_choice_stats();
  CHECK(st.restored > 0);
  CHECK(st.timed == 0);
  CHECK(st.rejected == 0);
  check_same_run(a, b, 8);
  reset_gemm_choices();
  fs::remove_all(root);
}

FFN_GPU_TEST("a run with its step in a CUDA graph computes what one without does, bit for bit, "
             "with and without dropout and gradient accumulation, and resumes bit-exact; fp16 "
             "runs go without") {
  const fs::path root = temp_dir("cuda-graph");
  // d_model 1024: fc1's activation and dropout run in the GEMMs' epilogues (act_fused_here),
  // head 64 on the Hopper attention; small enough for seconds.
  auto cfg = [](const std::string& dir, const std::vector<std::string>& more) {
    std::vector<std::string> sets = {"runtime.device=cuda", "model.d_model=1024",
                                     "model.heads=16", "model.context=128",
                                     "train.batch_size=8"};
    sets.insert(sets.end(), more.begin(), more.end());
    return ffn::test::tiny_run(dir, 8, sets);
  };
  TrainOptions quiet;
  quiet.quiet = true;
  // Without dropout, with it, and with it over 2 accumulated micro-batches of 8.
  for (const auto& [tag, dropout, accum] :
       {std::tuple<std::string, std::string, std::string>{"0", "model.dropout=0", "train.grad_accum_steps=1"},
        {"p", "model.dropout=0.1", "train.grad_accum_steps=1"},
        {"a", "model.dropout=0.1", "train.grad_accum_steps=2"}}) {
    CAPTURE(dropout);
    CAPTURE(accum);
    const std::string a = (root / ("eager" + tag)).string(), b = (root / ("graph" + tag)).string(),
                      c = (root / ("split" + tag)).string();
    const TrainResult ra =
        run_training(cfg(a, {dropout, accum, "runtime.cuda_graph=false"}), quiet);
    CHECK(ra.graph_steps == 0);
    const TrainResult rb = run_training(cfg(b, {dropout, accum}), quiet);
    CHECK(rb.graph_steps == 7);  // the first step runs uncaptured (GEMM choices, caches)
    check_same_run(a, b, 8);
    TrainOptions first = quiet;
    first.stop_after = 4;
    run_training(cfg(c, {dropout, accum}), first);
    TrainOptions second = quiet;
    second.resume = c;
    const TrainResult rc = run_training(cfg(c, {dropout, accum}), second);
    CHECK(rc.graph_steps == 3);
    check_same_run(a, c, 8);
  }
  // fp16's loss scale changes between steps: such a run is not captured, and trains.
  const TrainResult rf =
      run_training(cfg((root / "fp16").string(), {"runtime.precision=fp16"}), quiet);
  CHECK(rf.graph_steps == 0);
  CHECK(rf.iters_done == 8);
  fs::remove_all(root);
}

TEST_CASE("a padded vocabulary stays out of checkpoints; a run resumes with another padding") {
  const fs::path root = temp_dir("padvocab");
  const std::string a = (root / "padded").string(), b = (root / "plain").string();
  TrainOptions quiet;
  quiet.quiet = true;
  Config pa = tiny_config(a, 6), pb = tiny_config(b, 6);
  REQUIRE(pa.model.vocab_pad_to == 128);  // the default
  pb.model.vocab_pad_to = 1;
  run_training(pa, quiet);
  run_training(pb, quiet);
  // The same initial weights and the same losses, up to GEMM rounding.
  const auto la = metric_lines(a, "train_loss"), lb = metric_lines(b, "train_loss");
  REQUIRE(la.size() == lb.size());
  REQUIRE(!la.empty());
  for (size_t i = 0; i < la.size(); ++i) {
    auto loss = [](const std::string& l) {
      return std::strtod(l.c_str() + l.find("\"train_loss\":") + 13, nullptr);
    };
    const double x = loss(la[i]), y = loss(lb[i]);
    CHECK(x > 0.5);
    CHECK(x == doctest::Approx(y).epsilon(1e-4));
  }
  // Both files hold [vocab, d] embeddings and optimizer state: the files do not see the
  // padding (same names, same shapes).
  auto shapes = [](const fs::path& f) {
    std::map<std::string, Shape> m;
    for (const auto& [n, t] : load_safetensors(f.string())) m[n] = t.shape();
    return m;
  };
  for (const char* f : {"model.safetensors", "optim.safetensors"}) {
    const auto sa = shapes(fs::path(a) / "ckpt-6" / f), sb = shapes(fs::path(b) / "ckpt-6" / f);
    CHECK_MESSAGE(sa == sb, f);
    REQUIRE(sa.count("wte.weight") + sa.count("wte.weight.exp_avg") == 1);
    const Shape w = sa.count("wte.weight") ? sa.at("wte.weight") : sa.at("wte.weight.exp_avg");
    CHECK(w[0] < 128);
  }
  // The padded run resumes without padding, and the unpadded one with it.
  TrainOptions ra = quiet, rb = quiet;
  ra.resume = a;
  rb.resume = b;
  Config ca = resume_config(a, {"train.iters=8", "model.vocab_pad_to=1"});
  Config cb = resume_config(b, {"train.iters=8", "model.vocab_pad_to=64"});
  CHECK(run_training(ca, ra).iters_done == 8);
  CHECK(run_training(cb, rb).iters_done == 8);
  fs::remove_all(root);
}

TEST_CASE("a llama run: HF Llama names in the checkpoint, bit-exact resume, it learns") {
  const fs::path root = temp_dir("llama");
  const std::string a = (root / "straight").string(), b = (root / "split").string();
  auto cfg = [](const std::string& dir) {
    Config c = tiny_config(dir, 8);
    c.model.arch = Arch::llama;
    c.model.ffn = FfnKind::swiglu;
    c.model.bias = false;
    c.model.kv_heads = 1;
    c.model.tie_embeddings = false;
    return c;
  };
  TrainOptions quiet;
  quiet.quiet = true;
  run_training(cfg(a), quiet);
  TrainOptions first = quiet;
  first.stop_after = 4;
  run_training(cfg(b), first);
  TrainOptions second = quiet;
  second.resume = b;
  CHECK(run_training(cfg(b), second).iters_done == 8);
  check_same_run(a, b, 8);
  std::map<std::string, Shape> shapes;
  const std::string model = (fs::path(a) / "ckpt-8" / "model.safetensors").string();
  for (const auto& [n, t] : load_safetensors(model)) shapes[n] = t.shape();
  CHECK(shapes.count("model.embed_tokens.weight"));
  CHECK(shapes.count("model.layers.1.self_attn.k_proj.weight"));
  CHECK(shapes.count("model.layers.0.mlp.gate_proj.weight"));
  CHECK(shapes.count("model.norm.weight"));
  CHECK(shapes.count("lm_head.weight"));
  CHECK(shapes.at("lm_head.weight") == shapes.at("model.embed_tokens.weight"));  // not padded
  CHECK(shapes.at("model.layers.1.self_attn.k_proj.weight") == Shape{32, 64});  // 1 kv head
  // Learning: the val loss falls over 40 iterations.
  const std::string c = (root / "learn").string();
  Config lc = cfg(c);
  lc.train.iters = 40;
  lc.run.eval_every = 40;
  run_training(lc, quiet);
  const auto vals = metric_lines(c, "val_loss");
  REQUIRE(vals.size() >= 2);
  auto val = [](const std::string& l) {
    return std::strtod(l.c_str() + l.find("\"val_loss\":") + 11, nullptr);
  };
  CHECK(val(vals.back()) < 0.8 * val(vals.front()));
  fs::remove_all(root);
}

TEST_CASE("a kill during a checkpoint save leaves the previous checkpoint loadable") {
  const fs::path root = temp_dir("kill");
  TrainOptions quiet;
  quiet.quiet = true;
  run_training(tiny_config(root.string(), 4), quiet);
  // What a crash mid-save leaves behind: a half-written temp directory.
  fs::create_directories(root / "ckpt-8.tmp");
  std::ofstream(root / "ckpt-8.tmp" / "model.safetensors") << "partial";
  CHECK(resolve_checkpoint(root.string()) == (root / "ckpt-4").string());
  TrainOptions resume = quiet;
  resume.resume = root.string();
  CHECK(run_training(tiny_config(root.string(), 8), resume).iters_done == 8);
  fs::remove_all(root);
}

TEST_CASE("tiny.toml learns on the CPU: val loss falls below 45% of its start") {
  const fs::path root = temp_dir("tiny");
  Config c = Config::load(std::string(FFN_SOURCE_DIR) + "/configs/tiny.toml",
                          {"run.dir=" + root.string(), "runtime.device=cpu"});
  TrainOptions quiet;
  quiet.quiet = true;
  const TrainResult r = run_training(c, quiet);
  MESSAGE("tiny.toml: val loss ", r.first_val_loss, " -> ", r.best_val_loss, " in ", r.iters_done,
          " iters, ", r.ms_per_iter, " ms/iter");
  CHECK(r.first_val_loss > 3.0);  // ~ln(vocab) at the start
  CHECK(r.best_val_loss < 0.45 * r.first_val_loss);
  fs::remove_all(root);
}

TEST_CASE("AdamW in groups: the same update, each group's hook after its update, decay per parameter") {
  auto params = [] {
    std::vector<std::pair<std::string, Var>> ps;
    for (int i = 0; i < 5; ++i) {
      std::string name = "p";
      name += std::to_string(i);
      Var v(Tensor::from_vector({1.0 + i, -2.0, 0.5 * i}, {3}, DType::f64), true, name);
      v.set_grad(Tensor::from_vector({0.1 * i, 0.3, -0.2}, {3}, DType::f64));
      ps.emplace_back(name, v);
    }
    return ps;
  };
  AdamWOptions o;
  o.hyper.weight_decay = 0.1;
  o.decay = {true, false, true, true, false};  // 1-D parameters, decayed where this says
  o.grad_clip = 0.5;
  auto plain = params(), grouped = params();
  AdamW a(plain, o);
  std::vector<std::pair<size_t, double>> seen;  // (group, p4's first value) at each hook
  AdamWOptions g = o;
  g.groups = {2, 0, 3};  // p0 p1 | none | p2 p3 p4
  g.after_group = [&](size_t k) { seen.emplace_back(k, grouped[4].second.value().to_vector()[0]); };
  AdamW b(grouped, g);
  for (int step = 0; step < 3; ++step) {
    a.step(0.01, 1.0);
    seen.clear();
    b.step(0.01, 1.0);
  }
  for (size_t i = 0; i < 5; ++i)
    CHECK(plain[i].second.value().to_vector() == grouped[i].second.value().to_vector());
  // Every group's hook, in order, each after its own group's update only.
  REQUIRE(seen.size() == 3);
  CHECK((seen[0].first == 0 && seen[1].first == 1 && seen[2].first == 2));
  CHECK(seen[0].second == seen[1].second);
  CHECK(seen[2].second != seen[1].second);
  CHECK(seen[2].second == grouped[4].second.value().to_vector()[0]);
  // Decay where asked: p1 (no decay) and p0 (decay) differ from an all-decay run.
  AdamWOptions all = o;
  all.decay = {};
  all.decay_matrices_only = false;
  auto c = params();
  AdamW ac(c, all);
  for (int step = 0; step < 3; ++step) ac.step(0.01, 1.0);
  CHECK(c[0].second.value().to_vector() == plain[0].second.value().to_vector());
  CHECK(c[1].second.value().to_vector() != plain[1].second.value().to_vector());
  AdamWOptions bad = o;
  bad.groups = {2, 2};
  CHECK_THROWS_WITH_AS(AdamW(params(), bad), doctest::Contains("[adamw] groups cover 4 parameters of 5"),
                       Error);
}

TEST_CASE("AdamW skips non-finite steps, counts them, and gives up after K in a row") {
  Var w(Tensor::from_vector({1.0, 2.0}, {2}, DType::f64), true, "w");
  AdamWOptions o;
  o.max_nonfinite_in_row = 3;
  AdamW opt({{"w", w}}, o);
  w.set_grad(Tensor::from_vector({0.1, 0.1}, {2}, DType::f64));
  CHECK(!opt.step(0.1, 1.0).skipped);
  const auto after_good = w.value().to_vector();
  w.set_grad(Tensor::from_vector({NAN, 0.1}, {2}, DType::f64));
  CHECK(opt.step(0.1, 1.0).skipped);
  CHECK(w.value().to_vector() == after_good);
  w.set_grad(Tensor::from_vector({0.1, 0.1}, {2}, DType::f64));
  CHECK(opt.step(0.1, INFINITY).skipped);
  CHECK(opt.skipped() == 2);
  CHECK_THROWS_WITH_AS(opt.step(0.1, NAN), doctest::Contains("3 steps in a row had a non-finite"),
                       Error);
  // launch()/finish(): one step in flight at a time, counters only between steps.
  w.set_grad(Tensor::from_vector({0.1, 0.1}, {2}, DType::f64));
  AdamW two({{"w", w}}, o);
  two.launch(0.1, Tensor::full({}, 1.0, DType::f64));
  CHECK(two.in_flight());
  CHECK_THROWS_WITH_AS(two.launch(0.1, Tensor::full({}, 1.0, DType::f64)),
                       doctest::Contains("[adamw] launch() while the previous step is in flight"),
                       Error);
  CHECK_THROWS_WITH_AS(two.counters(), doctest::Contains("while a step is in flight"), Error);
  const StepReport rep = two.finish();
  CHECK(rep.loss == 1.0);
  CHECK(two.counters() == std::vector<int64_t>{1, 0, 0});
  CHECK_THROWS_WITH_AS(two.finish(), doctest::Contains("[adamw] finish() without a launched step"),
                       Error);
  // Clipping: a gradient of norm 10 with clip 1 moves like one of norm 1 (Adam is scale-free
  // except through eps, so check the reported norm and that the step happened).
  Var v(Tensor::from_vector({0.0}, {1}, DType::f64), true);
  AdamWOptions oc;
  oc.grad_clip = 1.0;
  AdamW clip({{"v", v}}, oc);
  v.set_grad(Tensor::from_vector({10.0}, {1}, DType::f64));
  CHECK(clip.step(0.1, 1.0).grad_norm == doctest::Approx(10.0));
  CHECK(v.value().item() == doctest::Approx(-0.1));
  // Loss scaling halves on overflow, doubles after the interval.
  LossScaler s(true, 1024.0, 2);
  s.update(true);
  CHECK(s.scale() == 512.0);
  s.update(false);
  s.update(false);
  CHECK(s.scale() == 1024.0);
  // Schedules.
  CHECK(lr_at(LrSchedule::cosine, 0, 1.0, 0.1, 10, 100) == doctest::Approx(1.0 / 11));
  CHECK(lr_at(LrSchedule::cosine, 10, 1.0, 0.1, 10, 100) == doctest::Approx(1.0));
  CHECK(lr_at(LrSchedule::cosine, 55, 1.0, 0.1, 10, 100) == doctest::Approx(0.55));
  CHECK(lr_at(LrSchedule::cosine, 500, 1.0, 0.1, 10, 100) == doctest::Approx(0.1));
  CHECK(lr_at(LrSchedule::linear, 55, 1.0, 0.1, 10, 100) == doctest::Approx(0.55));
  CHECK(lr_at(LrSchedule::constant, 55, 1.0, 0.1, 10, 100) == 1.0);
}

TEST_CASE("ffn-train exits 2 on config errors (before touching a GPU) and explains --help") {
  const fs::path root = temp_dir("cli");
  const std::string bin = FFN_TRAIN_BIN;
  const std::string cfg = std::string(FFN_SOURCE_DIR) + "/configs/tiny.toml";
  auto run = [&](const std::string& args) {
    const std::string cmd = bin + " " + args + " > " + (root / "out.txt").string() + " 2>&1";
    const int st = std::system(cmd.c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  CHECK(run(cfg + " --set train.lrr=1") == 2);
  CHECK(slurp(root / "out.txt").find("[config] train.lrr: unknown key") != std::string::npos);
  CHECK(run(cfg + " --set train.lr=-1") == 2);
  CHECK(slurp(root / "out.txt").find("train.lr: expected a number > 0, got -1") != std::string::npos);
  CHECK(run(cfg + " --set runtime.nproc=3") == 2);
  CHECK(run(root.string() + "/missing.toml") == 2);
  // --nproc starts the workers (fork + exec of this binary); each refuses data parallelism
  // on the CPU before touching anything, and the launcher passes the exit code on.
  CHECK(run(cfg + " --nproc 2 --set runtime.device=cpu --set run.dir=" + (root / "dp").string()) ==
        2);
  const std::string dp = slurp(root / "out.txt");
  CHECK_MESSAGE(dp.find("data parallelism across processes needs GPUs") != std::string::npos, dp);
  CHECK_MESSAGE(dp.find("[launch] worker") != std::string::npos, dp);
  CHECK(run("--help") == 0);
  CHECK(slurp(root / "out.txt").find("--resume") != std::string::npos);
  // --help lists every config key with its default and a description (and no stale ones).
  CHECK(Config::undocumented_keys() == std::vector<std::string>{});
  CHECK_MESSAGE(slurp(root / "out.txt").find("train.grad_accum_steps = 1") != std::string::npos,
                slurp(root / "out.txt"));
  CHECK(slurp(root / "out.txt").find("micro-batches per optimizer step") != std::string::npos);
  CHECK(run(cfg + " --print-config --set model.layers=3") == 0);
  CHECK(slurp(root / "out.txt").find("layers = 3") != std::string::npos);
  fs::remove_all(root);
}
