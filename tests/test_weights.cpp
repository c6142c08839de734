// tests/test_weights.cpp — weights that travel (Note [Weight layouts]): ffn → hf-gpt2 → ffn
// and ffn → nanogpt → ffn give back a checkpoint's model.safetensors byte for byte; an
// HF-layout file written by hand starts a run whose first eval equals the source model's;
// missing tensors, transposed shapes, integer dtypes and truncated files are refused by name.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "tests/test_util.h"
#include "tests/train_test_util.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/io/safetensors.h"
#include "train/trainer.h"
#include "train/weights.h"

using namespace ffn;
using namespace ffn::train;
namespace fs = std::filesystem;
using ffn::test::slurp;
using ffn::test::temp_dir;

namespace {

Config tiny(const fs::path& dir, int64_t iters) {
  return ffn::test::tiny_run(dir, iters);
}

TrainOptions quiet() {
  TrainOptions o;
  o.quiet = true;
  return o;
}

int convert(const std::string& args, const fs::path& out) {
  const std::string cmd = std::string(FFN_CONVERT_BIN) + " " + args + " > " + out.string() + " 2>&1";
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string val_loss_at(const fs::path& run, int64_t iter) {
  std::ifstream in(run / "metrics.jsonl");
  const std::string key = "{\"iter\": " + std::to_string(iter) + ", \"val_loss\": ";
  for (std::string l; std::getline(in, l);)
    if (l.rfind(key, 0) == 0) return l.substr(key.size(), l.find(',', key.size()) - key.size());
  return "";
}

}  // namespace

TEST_CASE("weights: ffn -> hf-gpt2 -> ffn and ffn -> nanogpt -> ffn are byte-identical") {
  const fs::path root = temp_dir("weights-roundtrip");
  run_training(tiny(root / "run", 4), quiet());
  const fs::path model = root / "run" / "ckpt-4" / "model.safetensors";
  const fs::path out = root / "out.txt";
  for (const char* to : {"hf-gpt2", "nanogpt"}) {
    const fs::path mid = root / (std::string(to) + ".safetensors");
    const fs::path back = root / (std::string(to) + "-back.safetensors");
    REQUIRE_MESSAGE(convert((root / "run").string() + " " + mid.string() + " --to " + to, out) == 0,
                    slurp(out));
    REQUIRE_MESSAGE(convert(mid.string() + " " + back.string() + " --to ffn", out) == 0, slurp(out));
    CHECK_MESSAGE(slurp(back) == slurp(model), to);
    CHECK(slurp(out).find(std::string("(") + to + ", ") != std::string::npos);  // detected
  }
  // What the files hold: HF names with Conv1D weights ([in, out]); nanoGPT adds the tied head.
  std::map<std::string, Tensor> ours, hf, nano;
  for (auto& [n, t] : load_safetensors(model.string())) ours[n] = t;
  for (auto& [n, t] : load_safetensors((root / "hf-gpt2.safetensors").string())) hf[n] = t;
  for (auto& [n, t] : load_safetensors((root / "nanogpt.safetensors").string())) nano[n] = t;
  CHECK(hf.size() == ours.size());
  CHECK(nano.size() == ours.size() + 1);
  const Tensor& c_fc = hf.at("transformer.h.1.mlp.c_fc.weight");
  const Tensor& fc1 = ours.at("h.1.mlp.fc1.weight");
  REQUIRE(c_fc.shape() == Shape{fc1.size(1), fc1.size(0)});
  CHECK(c_fc.to_vector() == fc1.permute({1, 0}).contiguous().to_vector());
  CHECK(hf.at("transformer.h.0.attn.c_attn.bias").to_vector() ==
        ours.at("h.0.attn.c_attn.bias").to_vector());
  CHECK(nano.at("transformer.h.1.mlp.c_fc.weight").to_vector() == fc1.to_vector());
  CHECK(nano.at("lm_head.weight").to_vector() == ours.at("wte.weight").to_vector());
  fs::remove_all(root);
}

TEST_CASE("weights: a hand-made HF GPT-2 file starts a run whose first eval equals the source's") {
  const fs::path root = temp_dir("weights-init");
  run_training(tiny(root / "src", 4), quiet());  // evals at 0 and 4
  // Written here, not by ffn-convert: the hub's naming (no "transformer." prefix), Conv1D
  // weights, the causal-mask buffers HF files carry, float32.
  NamedTensors hf;
  for (auto& [n, t] : load_safetensors((root / "src" / "ckpt-4" / "model.safetensors").string())) {
    std::string name = n;
    Tensor v = t;
    const bool conv1d = n.find("c_attn.weight") != std::string::npos ||
                        n.find("c_proj.weight") != std::string::npos ||
                        n.find("fc1.weight") != std::string::npos ||
                        n.find("fc2.weight") != std::string::npos;
    if (conv1d) v = t.permute({1, 0}).contiguous();
    if (auto p = name.find("mlp.fc1"); p != std::string::npos) name.replace(p, 7, "mlp.c_fc");
    if (auto p = name.find("mlp.fc2"); p != std::string::npos) name.replace(p, 7, "mlp.c_proj");
    hf.emplace_back(name, v);
  }
  hf.emplace_back("h.0.attn.bias", Tensor::zeros({1, 1, 4, 4}));
  const fs::path file = root / "gpt2-like.safetensors";
  save_safetensors(file.string(), hf);
  CHECK(detect_weight_layout(load_safetensors(file.string()), "x") == WeightLayout::hf_gpt2);

  TrainOptions o = quiet();
  o.init_from = file.string();
  run_training(tiny(root / "dst", 1), o);
  const std::string v_src = val_loss_at(root / "src", 4), v_dst = val_loss_at(root / "dst", 0);
  REQUIRE(!v_src.empty());
  CHECK(v_dst == v_src);
  // A config of another shape is refused naming the first tensor that differs.
  Config other = tiny(root / "other", 1);
  other.model.d_model = 32;
  CHECK_THROWS_WITH_AS(run_training(other, o), doctest::Contains("tensor 'wte.weight' is [33, 64]"),
                       Error);
  TrainOptions both = o;
  both.resume = (root / "src").string();
  CHECK_THROWS_WITH_AS(run_training(tiny(root / "src", 8), both),
                       doctest::Contains("a resumed run has its weights already"), Error);
  fs::remove_all(root);
}

TEST_CASE("weights: a missing tensor, a transposed shape, an integer dtype and a truncated file are refused") {
  const fs::path root = temp_dir("weights-refuse");
  run_training(tiny(root / "run", 1), quiet());
  const NamedTensors ours = read_weights((root / "run").string());
  const NamedTensors hf = from_ffn_layout(ours, WeightLayout::hf_gpt2);
  auto without = [](NamedTensors ts, const std::string& name) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [&](auto& p) { return p.first == name; }), ts.end());
    return ts;
  };
  CHECK_THROWS_WITH_AS(to_ffn_layout(without(hf, "transformer.h.1.ln_2.bias"), "f"),
                       doctest::Contains("tensor 'transformer.h.1.ln_2.bias' is missing"), Error);
  CHECK_THROWS_WITH_AS(to_ffn_layout(without(ours, "wte.weight"), "f"),
                       doctest::Contains("tensor 'wte.weight' is missing"), Error);
  NamedTensors bad = hf;
  for (auto& [n, t] : bad)
    if (n == "transformer.h.0.mlp.c_fc.weight") t = t.permute({1, 0}).contiguous();  // Linear, not Conv1D
  CHECK_THROWS_WITH_AS(to_ffn_layout(bad, "f"),
                       doctest::Contains("'transformer.h.0.mlp.c_fc.weight' is [256, 64], expected "
                                         "[64, 256] (HF Conv1D layout: [in, out])"),
                       Error);
  NamedTensors ints = ours;
  ints[3].second = ints[3].second.to(DType::i32);
  CHECK_THROWS_WITH_AS(to_ffn_layout(ints, "f"), doctest::Contains("has dtype i32"), Error);
  NamedTensors extra = ours;
  extra.emplace_back("h.0.mlp.gate.weight", Tensor::zeros({2}));
  CHECK_THROWS_WITH_AS(to_ffn_layout(extra, "f"), doctest::Contains("'h.0.mlp.gate.weight' is not part"),
                       Error);
  // Gated FFNs have no GPT-2 layout.
  Config gated = tiny(root / "geglu", 1);
  gated.model.ffn = FfnKind::geglu;
  run_training(gated, quiet());
  CHECK_THROWS_WITH_AS(from_ffn_layout(read_weights((root / "geglu").string()), WeightLayout::nanogpt),
                       doctest::Contains("a gated FFN"), Error);
  CHECK(from_ffn_layout(read_weights((root / "geglu").string()), WeightLayout::ffn).size() ==
        ours.size());
  const fs::path file = root / "t.safetensors";
  save_safetensors(file.string(), hf);
  fs::resize_file(file, fs::file_size(file) - 100);
  const fs::path out = root / "out.txt";
  CHECK(convert(file.string() + " " + (root / "x.safetensors").string() + " --to ffn", out) == 1);
  CHECK(slurp(out).find("is truncated") != std::string::npos);
  CHECK(convert((root / "run").string() + " " + (root / "x.safetensors").string() + " --to onnx", out) == 2);
  CHECK(slurp(out).find("--to: expected hf-gpt2, nanogpt or ffn") != std::string::npos);
  fs::remove_all(root);
}
