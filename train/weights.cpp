// train/weights.cpp — weight layouts and their conversions (Note [Weight layouts]).
#include "train/weights.h"

#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace fs = std::filesystem;

namespace ffn::train {

namespace {

constexpr const char* kPrefix = "transformer.";

// A block's tensors: our name, the GPT-2 name, whether HF stores it transposed, a bias.
struct BlockName {
  const char* ours;
  const char* gpt2;
  bool conv1d;
  bool bias;
};
constexpr BlockName kBlock[] = {
    {"ln_1.weight", "ln_1.weight", false, false},
    {"ln_1.bias", "ln_1.bias", false, true},
    {"attn.c_attn.weight", "attn.c_attn.weight", true, false},
    {"attn.c_attn.bias", "attn.c_attn.bias", false, true},
    {"attn.c_proj.weight", "attn.c_proj.weight", true, false},
    {"attn.c_proj.bias", "attn.c_proj.bias", false, true},
    {"ln_2.weight", "ln_2.weight", false, false},
    {"ln_2.bias", "ln_2.bias", false, true},
    {"mlp.fc1.weight", "mlp.c_fc.weight", true, false},
    {"mlp.fc1.bias", "mlp.c_fc.bias", false, true},
    {"mlp.fc2.weight", "mlp.c_proj.weight", true, false},
    {"mlp.fc2.bias", "mlp.c_proj.bias", false, true},
};

// One tensor of the model in our layout and where it lives in the other two.
struct Slot {
  std::string ours, gpt2;  // gpt2 without the "transformer." prefix
  bool conv1d = false, bias = false;
};

std::vector<Slot> slots(int layers) {
  std::vector<Slot> out{{"wte.weight", "wte.weight"}, {"wpe.weight", "wpe.weight"}};
  for (int n = 0; n < layers; ++n) {
    const std::string p = "h." + std::to_string(n) + ".";
    for (const BlockName& b : kBlock) out.push_back({p + b.ours, p + b.gpt2, b.conv1d, b.bias});
  }
  out.push_back({"ln_f.weight", "ln_f.weight"});
  out.push_back({"ln_f.bias", "ln_f.bias", false, true});
  return out;
}

std::string strip(const std::string& n) {
  return n.rfind(kPrefix, 0) == 0 ? n.substr(std::string(kPrefix).size()) : n;
}

int count_layers(const std::map<std::string, Tensor>& by_name) {
  int layers = 0;
  for (const auto& [n, t] : by_name)
    if (n.rfind("h.", 0) == 0) {
      const size_t dot = n.find('.', 2);
      const std::string idx = n.substr(2, dot - 2);
      if (!idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos)
        layers = std::max(layers, std::stoi(idx) + 1);
    }
  return layers;
}

Tensor transposed(const Tensor& t) { return t.permute({1, 0}).contiguous(); }

[[noreturn]] void refuse(const std::string& origin, const std::string& what) {
  throw Error("[weights] '" + origin + "': " + what, ErrorKind::config);
}

}  // namespace

const char* weight_layout_name(WeightLayout l) {
  switch (l) {
    case WeightLayout::ffn: return "ffn";
    case WeightLayout::hf_gpt2: return "hf-gpt2";
    case WeightLayout::nanogpt: return "nanogpt";
  }
  return "?";
}

WeightLayout parse_weight_layout(const std::string& s) {
  for (WeightLayout l : {WeightLayout::ffn, WeightLayout::hf_gpt2, WeightLayout::nanogpt})
    if (s == weight_layout_name(l)) return l;
  config_error("--to: expected hf-gpt2, nanogpt or ffn, got \"" + s + "\"");
}

NamedTensors read_weights(const std::string& path, std::string* file_used) {
  std::string file = path;
  if (fs::is_directory(path)) file = (fs::path(resolve_checkpoint(path)) / "model.safetensors").string();
  FFN_CHECK(fs::is_regular_file(file), "[weights] '", path,
            "' is neither a run directory, a ckpt-* directory nor a .safetensors file");
  if (file_used) *file_used = file;
  return load_safetensors(file);
}

WeightLayout detect_weight_layout(const NamedTensors& ts, const std::string& origin) {
  std::map<std::string, Tensor> by_name;
  for (const auto& [n, t] : ts) by_name[strip(n)] = t;
  if (by_name.count("h.0.mlp.fc1.weight")) return WeightLayout::ffn;
  const auto c_attn = by_name.find("h.0.attn.c_attn.weight");
  const auto wte = by_name.find("wte.weight");
  if (by_name.count("model.embed_tokens.weight"))
    refuse(origin, "a Llama model (model.embed_tokens.weight): model.arch = \"llama\" runs "
                   "store HuggingFace Llama's names already, so they need no conversion; "
                   "ffn-convert converts GPT layouts");
  if (c_attn == by_name.end() || wte == by_name.end() || !by_name.count("h.0.mlp.c_fc.weight"))
    refuse(origin, "not a GPT in any known layout (no wte.weight, h.0.attn.c_attn.weight and "
                   "h.0.mlp.fc1/c_fc.weight)");
  const Tensor& w = c_attn->second;
  const int64_t d = wte->second.dim() == 2 ? wte->second.size(1) : -1;
  if (w.dim() == 2 && w.size(0) == d && w.size(1) == 3 * d) return WeightLayout::hf_gpt2;
  if (w.dim() == 2 && w.size(0) == 3 * d && w.size(1) == d) return WeightLayout::nanogpt;
  refuse(origin, "h.0.attn.c_attn.weight is " + shape_str(w.shape()) + ", neither [d, 3d] (HF) " +
                     "nor [3d, d] (nanoGPT) for wte's d = " + std::to_string(d));
}

NamedTensors to_ffn_layout(const NamedTensors& ts, const std::string& origin) {
  const WeightLayout layout = detect_weight_layout(ts, origin);
  const bool gpt2 = layout != WeightLayout::ffn, hf = layout == WeightLayout::hf_gpt2;
  std::map<std::string, Tensor> by_name;
  std::map<std::string, std::string> original;  // stripped → as written in the file
  for (const auto& [n, t] : ts) {
    const std::string s = gpt2 ? strip(n) : n;
    by_name[s] = t;
    original[s] = n;
  }
  const bool prefixed = gpt2 && original["wte.weight"].rfind(kPrefix, 0) == 0;
  auto shown = [&](const std::string& s) {
    auto it = original.find(s);
    return it != original.end() ? it->second : (prefixed ? kPrefix + s : s);
  };
  const int layers = count_layers(by_name);
  if (layers == 0) refuse(origin, "no transformer blocks (h.0.*)");
  const bool bias = by_name.count("h.0.ln_1.bias") > 0;
  if (!by_name.count("wte.weight")) refuse(origin, "tensor '" + shown("wte.weight") + "' is missing");
  const Tensor& wte = by_name.at("wte.weight");
  if (wte.dim() != 2) refuse(origin, "tensor '" + shown("wte.weight") + "' is not 2-D");
  const int64_t d = wte.size(1);
  // The FFN width from the first block's output projection; fc1 is as wide (GPT-2 layouts)
  // or, for our gated FFNs, twice as wide (value and gate), which is then fc1's own width.
  int64_t h = -1, h1 = -1;
  {
    const std::string n2 = gpt2 ? "h.0.mlp.c_proj.weight" : "h.0.mlp.fc2.weight";
    if (by_name.count(n2) && by_name.at(n2).dim() == 2) h = by_name.at(n2).size(hf ? 0 : 1);
    h1 = h;
    if (!gpt2 && by_name.count("h.0.mlp.fc1.weight") && by_name.at("h.0.mlp.fc1.weight").dim() == 2)
      h1 = by_name.at("h.0.mlp.fc1.weight").size(0);
  }
  std::set<std::string> used;
  NamedTensors out;
  for (const Slot& sl : slots(layers)) {
    if (sl.bias && !bias) continue;
    const std::string src = gpt2 ? sl.gpt2 : sl.ours;
    auto it = by_name.find(src);
    if (it == by_name.end()) refuse(origin, "tensor '" + shown(src) + "' is missing");
    used.insert(src);
    const Tensor& t = it->second;
    if (!is_float(t.dtype()))
      refuse(origin, "tensor '" + shown(src) + "' has dtype " + dtype_name(t.dtype()) +
                         "; weights must be floating point");
    // The shape in our layout, then as the file's layout stores it.
    Shape want;
    const std::string& o = sl.ours;
    if (o == "wte.weight") want = {wte.size(0), d};
    else if (o == "wpe.weight") want = {t.dim() == 2 ? t.size(0) : -1, d};
    else if (o.find("c_attn.weight") != std::string::npos) want = {3 * d, d};
    else if (o.find("c_attn.bias") != std::string::npos) want = {3 * d};
    else if (o.find("attn.c_proj.weight") != std::string::npos) want = {d, d};
    else if (o.find("fc1.weight") != std::string::npos) want = {h1, d};
    else if (o.find("fc1.bias") != std::string::npos) want = {h1};
    else if (o.find("fc2.weight") != std::string::npos) want = {d, h};
    else want = {d};  // layer-norm gains and biases, c_proj/fc2 biases
    const Shape stored = hf && sl.conv1d ? Shape{want[1], want[0]} : want;
    if (t.shape() != stored)
      refuse(origin, "tensor '" + shown(src) + "' is " + shape_str(t.shape()) + ", expected " +
                         shape_str(stored) +
                         (hf && sl.conv1d ? " (HF Conv1D layout: [in, out])" : ""));
    out.emplace_back(sl.ours, hf && sl.conv1d ? transposed(t) : t);
  }
  for (const auto& [n, t] : by_name) {
    if (used.count(n)) continue;
    auto ends_with = [&n](const std::string& suffix) {
      return n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    const bool mask_buffer =
        gpt2 && n.rfind("h.", 0) == 0 && (ends_with(".attn.bias") || ends_with(".attn.masked_bias"));
    if (mask_buffer) continue;  // HF's causal-mask buffers
    if (gpt2 && n == "lm_head.weight") {
      if (t.shape() != wte.shape() || t.to(DType::f64).to_vector() != wte.to(DType::f64).to_vector())
        refuse(origin, "lm_head.weight differs from wte.weight: an untied head is not supported");
      continue;
    }
    refuse(origin, "tensor '" + original[n] + "' is not part of a " + weight_layout_name(layout) +
                       " GPT with " + std::to_string(layers) + " layers");
  }
  return out;
}

NamedTensors from_ffn_layout(const NamedTensors& ffn, WeightLayout to) {
  NamedTensors canon = to_ffn_layout(ffn, "the model");  // validated, in our order
  if (to == WeightLayout::ffn) return canon;
  std::map<std::string, Tensor> by_name(canon.begin(), canon.end());
  const bool bias = by_name.count("h.0.ln_1.bias") > 0;
  if (by_name.at("h.0.mlp.fc1.weight").size(0) != by_name.at("h.0.mlp.fc2.weight").size(1))
    config_error("--to: a gated FFN (model.ffn = geglu or swiglu) has no GPT-2 layout; keep "
                 "--to ffn");
  if (to == WeightLayout::hf_gpt2 && !bias)
    config_error("--to: HF GPT-2 always has biases; a model.bias = false model converts to "
                 "nanogpt or ffn");
  const int layers = count_layers(by_name);
  NamedTensors out;
  for (const Slot& sl : slots(layers)) {
    auto it = by_name.find(sl.ours);
    if (it == by_name.end()) continue;  // biases of a bias-free model
    const bool t = to == WeightLayout::hf_gpt2 && sl.conv1d;
    out.emplace_back(kPrefix + sl.gpt2, t ? transposed(it->second) : it->second);
  }
  if (to == WeightLayout::nanogpt) out.emplace_back("lm_head.weight", by_name.at("wte.weight"));
  return out;
}

}  // namespace ffn::train
