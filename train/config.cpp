// train/config.cpp — TOML (toml++) → Config with key-path errors, overrides, and dump.
#include "train/config.h"

#include <toml++/toml.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/philox.h"

namespace ffn::train {

void config_error(const std::string& msg) {
  throw Error("[config] " + msg, ErrorKind::config);
}

namespace {

std::string describe(const toml::node& n) {
  std::ostringstream os;
  if (n.is_string())
    os << '"' << *n.value<std::string>() << '"';
  else if (n.is_table())
    os << "a table";
  else if (n.is_array())
    os << "an array";
  else
    n.visit([&](auto&& v) { os << v; });
  return os.str();
}

enum class Kind { integer, number, string, boolean };

struct Field {
  std::string path;
  Kind kind;
  std::function<void(const toml::node&)> read;  // throws config errors naming `path`
  std::function<std::string()> write;
};

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The shortest text that reads back as the same double (3e-3, not 0.0030000000000000001).
std::string fmt_double(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // keep it a TOML float
  return s;
}

Field int_field(const std::string& path, int64_t& ref, int64_t lo, const char* what) {
  return {path, Kind::integer,
          [&ref, path, lo, what](const toml::node& n) {
            if (!n.is_integer())
              config_error(path + ": expected an integer " + what + ", got " + describe(n));
            const int64_t v = *n.value<int64_t>();
            if (v < lo)
              config_error(path + ": expected an integer " + what + ", got " + std::to_string(v));
            ref = v;
          },
          [&ref]() { return std::to_string(ref); }};
}

Field num_field(const std::string& path, double& ref, std::function<bool(double)> ok,
                const char* what) {
  return {path, Kind::number,
          [&ref, path, ok, what](const toml::node& n) {
            if (!n.is_number())
              config_error(path + ": expected a number " + what + ", got " + describe(n));
            const double v = *n.value<double>();
            if (!std::isfinite(v) || !ok(v))
              config_error(path + ": expected a number " + what + ", got " + describe(n));
            ref = v;
          },
          [&ref]() { return fmt_double(ref); }};
}

Field str_field(const std::string& path, std::string& ref, std::vector<std::string> choices) {
  return {path, Kind::string,
          [&ref, path, choices](const toml::node& n) {
            std::string list;
            for (const auto& c : choices) list += (list.empty() ? "" : ", ") + quote(c);
            if (!n.is_string())
              config_error(path + ": expected a string" +
                           (choices.empty() ? "" : " (one of " + list + ")") + ", got " +
                           describe(n));
            const std::string v = *n.value<std::string>();
            bool found = choices.empty();
            for (const auto& c : choices) found = found || c == v;
            if (!found) config_error(path + ": expected one of " + list + ", got " + quote(v));
            ref = v;
          },
          [&ref]() { return quote(ref); }};
}

// A choice key: read through the enum's name table (core/names.h), aliases accepted,
// written back by its canonical name.
template <class E, size_t N>
Field enum_field(const std::string& path, E& ref, const NameOf<E> (&table)[N]) {
  std::vector<std::string> choices;
  for (const auto& e : table)
    if (name_of(table, e.value) == e.name) choices.push_back(e.name);
  return {path, Kind::string,
          [&ref, &table, path, choices](const toml::node& n) {
            std::string list;
            for (const auto& c : choices) list += (list.empty() ? "" : ", ") + quote(c);
            if (!n.is_string())
              config_error(path + ": expected a string (one of " + list + "), got " + describe(n));
            const auto v = value_of(table, *n.value<std::string>());
            if (!v)
              config_error(path + ": expected one of " + list + ", got " +
                           quote(*n.value<std::string>()));
            ref = *v;
          },
          [&ref, &table]() { return quote(name_of(table, ref)); }};
}

Field bool_field(const std::string& path, bool& ref) {
  return {path, Kind::boolean,
          [&ref, path](const toml::node& n) {
            if (!n.is_boolean()) config_error(path + ": expected true or false, got " + describe(n));
            ref = *n.value<bool>();
          },
          [&ref]() { return std::string(ref ? "true" : "false"); }};
}

std::vector<Field> fields(Config& c) {
  auto pos = [](double v) { return v > 0; };
  auto nonneg = [](double v) { return v >= 0; };
  auto unit = [](double v) { return v >= 0 && v < 1; };
  auto frac = [](double v) { return v > 0 && v < 1; };
  return {
      str_field("run.dir", c.run.dir, {}),
      int_field("run.seed", c.run.seed, 0, ">= 0"),
      int_field("run.log_every", c.run.log_every, 1, ">= 1"),
      int_field("run.eval_every", c.run.eval_every, 1, ">= 1"),
      int_field("run.eval_iters", c.run.eval_iters, 1, ">= 1"),
      int_field("run.checkpoint_every", c.run.checkpoint_every, 0, ">= 0"),
      int_field("run.keep_checkpoints", c.run.keep_checkpoints, 1, ">= 1"),
      {"runtime.device", Kind::string,
       [&c](const toml::node& n) {
         const auto r = n.is_string() ? DeviceRequest::try_parse(*n.value<std::string>())
                                      : std::nullopt;
         if (!r)
           config_error("runtime.device: expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\", got " +
                        describe(n));
         c.runtime.device = *r;
       },
       [&c]() { return quote(c.runtime.device.str()); }},
      enum_field("runtime.precision", c.runtime.precision, kPrecisionNames),
      int_field("runtime.nproc", c.runtime.nproc, 1, ">= 1"),
      bool_field("runtime.gemm_autotune", c.runtime.gemm_autotune),
      bool_field("runtime.gemm_epilogues", c.runtime.gemm_epilogues),
      bool_field("runtime.fp32_residual", c.runtime.fp32_residual),
      bool_field("runtime.fused_attention", c.runtime.fused_attention),
      bool_field("runtime.fused_classifier", c.runtime.fused_classifier),
      bool_field("runtime.cuda_graph", c.runtime.cuda_graph),
      int_field("runtime.classifier_chunk", c.runtime.classifier_chunk, 0, ">= 0"),
      enum_field("data.kind", c.data.kind, kDataKindNames),
      str_field("data.path", c.data.path, {}),
      str_field("data.val_path", c.data.val_path, {}),
      num_field("data.val_fraction", c.data.val_fraction, frac, "in (0, 1)"),
      enum_field("model.arch", c.model.arch, kArchNames),
      int_field("model.vocab_size", c.model.vocab_size, 0, ">= 0 (0: from the data)"),
      int_field("model.vocab_pad_to", c.model.vocab_pad_to, 1, ">= 1 (1: no padding)"),
      int_field("model.context", c.model.context, 1, ">= 1"),
      int_field("model.layers", c.model.layers, 1, ">= 1"),
      int_field("model.heads", c.model.heads, 1, ">= 1"),
      int_field("model.d_model", c.model.d_model, 1, ">= 1"),
      enum_field("model.ffn", c.model.ffn, kFfnKindNames),
      num_field("model.ffn_mult", c.model.ffn_mult, pos, "> 0"),
      num_field("model.dropout", c.model.dropout, dropout_p_valid, "in [0, 1]"),
      bool_field("model.bias", c.model.bias),
      int_field("model.kv_heads", c.model.kv_heads, 0, ">= 0 (0: heads)"),
      num_field("model.rope_theta", c.model.rope_theta, pos, "> 0"),
      num_field("model.norm_eps", c.model.norm_eps, pos, "> 0"),
      bool_field("model.tie_embeddings", c.model.tie_embeddings),
      int_field("train.batch_size", c.train.batch_size, 1, ">= 1"),
      int_field("train.grad_accum_steps", c.train.grad_accum_steps, 1, ">= 1"),
      int_field("train.zero", c.train.zero, 0, "0 or 1"),
      int_field("train.iters", c.train.iters, 1, ">= 1"),
      num_field("train.lr", c.train.lr, pos, "> 0"),
      num_field("train.min_lr", c.train.min_lr, nonneg, ">= 0"),
      int_field("train.warmup", c.train.warmup, 0, ">= 0"),
      int_field("train.decay_iters", c.train.decay_iters, 0, ">= 0 (0: iters)"),
      enum_field("train.schedule", c.train.schedule, kLrScheduleNames),
      num_field("train.weight_decay", c.train.weight_decay, nonneg, ">= 0"),
      bool_field("train.decay_matrices_only", c.train.decay_matrices_only),
      num_field("train.beta1", c.train.beta1, unit, "in [0, 1)"),
      num_field("train.beta2", c.train.beta2, unit, "in [0, 1)"),
      num_field("train.eps", c.train.eps, pos, "> 0"),
      num_field("train.grad_clip", c.train.grad_clip, nonneg, ">= 0 (0: off)"),
      int_field("train.max_nonfinite", c.train.max_nonfinite, 1, ">= 1"),
  };
}

// Checks that involve several keys.
void cross_check(const Config& c) {
  if (c.model.d_model % c.model.heads != 0)
    config_error("model.heads: d_model=" + std::to_string(c.model.d_model) +
                 " is not divisible by heads=" + std::to_string(c.model.heads));
  const int64_t kv = c.model.kv_heads ? c.model.kv_heads : c.model.heads;
  if (c.model.heads % kv != 0)
    config_error("model.kv_heads: " + std::to_string(kv) + " does not divide heads=" +
                 std::to_string(c.model.heads));
  if (c.model.arch == Arch::gpt && kv != c.model.heads)
    config_error("model.kv_heads: grouped-query attention needs model.arch = \"llama\"");
  if (c.model.arch == Arch::llama) {
    if (c.model.bias)
      config_error("model.bias: the llama arch has no biases; set model.bias = false");
    if (!ffn_activation(c.model.ffn).gated)
      config_error("model.ffn: the llama arch's MLP is gated: \"swiglu\" (Llama's) or "
                   "\"geglu\", got \"" + std::string(name_of(kFfnKindNames, c.model.ffn)) + "\"");
    if ((c.model.d_model / c.model.heads) % 2 != 0)
      config_error("model.heads: rotary embeddings need an even head size, d_model / heads = " +
                   std::to_string(c.model.d_model / c.model.heads));
  }
  if (c.train.zero > 1)
    config_error("train.zero: " + std::to_string(c.train.zero) +
                 " is not a ZeRO stage this trainer has (0: off, 1: sharded optimizer state)");
  if (c.train.batch_size % c.runtime.nproc != 0)
    config_error("train.batch_size: the global batch " + std::to_string(c.train.batch_size) +
                 " is not divisible by runtime.nproc=" + std::to_string(c.runtime.nproc));
  if (c.train.min_lr > c.train.lr)
    config_error("train.min_lr: " + fmt_double(c.train.min_lr) + " is above train.lr=" +
                 fmt_double(c.train.lr));
  if (c.data.kind != DataKind::synthetic && c.data.path.empty())
    config_error("data.path: data.kind=\"" + std::string(name_of(kDataKindNames, c.data.kind)) +
                 "\" needs a path");
  if (c.data.kind == DataKind::tokens && c.model.vocab_size == 0)
    config_error("model.vocab_size: token files need an explicit vocab size (e.g. 50257)");
  if (c.runtime.device.device && c.runtime.device.device->is_cpu())
    compute_dtype(c.runtime.precision, Device::cpu());  // a 16-bit precision is refused here
}

void apply(std::vector<Field>& fs, const toml::table& root, const std::string& origin) {
  std::set<std::string> sections;
  for (const Field& f : fs) sections.insert(f.path.substr(0, f.path.find('.')));
  for (auto&& [skey, snode] : root) {
    const std::string s(skey.str());
    if (!sections.count(s)) {
      std::string known;
      for (const auto& k : sections) known += (known.empty() ? "" : ", ") + k;
      config_error(s + ": unknown section in " + origin + " (known: " + known + ")");
    }
    const toml::table* t = snode.as_table();
    if (!t) config_error(s + ": expected a table [" + s + "], got " + describe(snode));
    for (auto&& [kkey, knode] : *t) {
      const std::string path = s + "." + std::string(kkey.str());
      Field* f = nullptr;
      for (Field& x : fs)
        if (x.path == path) f = &x;
      if (!f) {
        std::string known;
        for (const Field& x : fs)
          if (x.path.rfind(s + ".", 0) == 0)
            known += (known.empty() ? "" : ", ") + x.path.substr(s.size() + 1);
        config_error(path + ": unknown key in " + origin + " (known in [" + s + "]: " + known + ")");
      }
      f->read(knode);
    }
  }
}

}  // namespace

DType compute_dtype(Precision p, Device dev) {
  switch (p) {
    case Precision::automatic: return dev.is_cuda() ? DType::bf16 : DType::f32;
    case Precision::fp32: return DType::f32;
    case Precision::bf16:
    case Precision::fp16:
      if (dev.is_cpu())
        config_error("runtime.precision: \"" + std::string(name_of(kPrecisionNames, p)) +
                     "\" needs a GPU; the CPU computes in fp32");
      return p == Precision::bf16 ? DType::bf16 : DType::f16;
  }
  return DType::f32;
}

Config Config::parse(const std::string& text, const std::string& origin,
                     const std::vector<std::string>& overrides) {
  Config c;
  std::vector<Field> fs = fields(c);
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << origin << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
       << e.description();
    config_error(os.str());
  }
  apply(fs, root, origin);
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      config_error("--set " + o + ": expected section.key=value");
    const std::string path = o.substr(0, eq), value = o.substr(eq + 1);
    Field* f = nullptr;
    for (Field& x : fs)
      if (x.path == path) f = &x;
    if (!f) config_error(path + ": unknown key (from --set " + o + ")");
    toml::table one;
    if (f->kind == Kind::string && (value.empty() || value.front() != '"')) {
      one.insert("v", value);
    } else {
      try {
        one = toml::parse("v = " + value, "--set " + path);
      } catch (const toml::parse_error&) {
        one = toml::table{};
        one.insert("v", value);  // not a TOML value: the wrong-type error below names it
      }
    }
    f->read(*one.get("v"));
  }
  cross_check(c);
  return c;
}

Config Config::load(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    config_error(path + ": is a directory, not a config file (e.g. configs/tiny.toml)");
  std::ifstream in(path, std::ios::binary);
  if (!in) config_error(path + ": cannot open the config file");
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // A file with nothing in it is a mistake (a truncated copy, the wrong path), not a request
  // for every default; a file of comments alone is taken as meant.
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    config_error(path + ": the config file is empty; start from one in configs/ (every key has "
                 "a default, so a file may hold just a comment)");
  return parse(text, path, overrides);
}

// One line per key for `ffn-train --help` (key_help); a test checks that every key the
// reader takes has one and that none is stale.
const std::map<std::string, std::string>& key_docs() {
  static const std::map<std::string, std::string> docs = {
      {"run.dir", "where metrics.jsonl, loss.svg, config.toml and checkpoints go"},
      {"run.seed", "seeds the weights, the data order and the dropout masks"},
      {"run.log_every", "iterations between progress lines and metrics.jsonl entries"},
      {"run.eval_every", "iterations between val/train loss estimates"},
      {"run.eval_iters", "batches per loss estimate"},
      {"run.checkpoint_every", "iterations between checkpoints (0: at every eval)"},
      {"run.keep_checkpoints", "how many checkpoints to keep (the newest)"},
      {"runtime.device", "\"auto\" (the GPU if there is one), \"cpu\", \"cuda\" or \"cuda:N\""},
      {"runtime.precision",
       "\"auto\" (bf16 on GPUs, fp32 on the CPU), \"fp32\", \"bf16\" or \"fp16\""},
      {"runtime.nproc", "data-parallel processes, one GPU each (same as --nproc)"},
      {"runtime.gemm_autotune",
       "time cuBLASLt candidates per shape; the choices go into checkpoints, so resume stays "
       "bit-exact"},
      {"runtime.gemm_epilogues",
       "GPU 16-bit runs: fc1's activation (and its bias gradient) inside the GEMMs"},
      {"runtime.fp32_residual", "16-bit runs: keep the residual stream in fp32"},
      {"runtime.fused_attention", "GPU 16-bit runs: the fused attention kernels"},
      {"runtime.fused_classifier", "the loss without storing the [B·T, vocab] logits"},
      {"runtime.classifier_chunk", "rows per chunk of the fused classifier (0: automatic)"},
      {"runtime.cuda_graph",
       "GPU runs: capture the training step once as a CUDA graph and replay it (one process, "
       "no fp16 loss scaling; otherwise said at start)"},
      {"data.kind", "\"synthetic\" (embedded corpus), \"text\" (characters) or \"tokens\" (.bin)"},
      {"data.path", "the text file or token file"},
      {"data.val_path", "tokens: a separate validation file (else the last val_fraction)"},
      {"data.val_fraction", "share of the data held out for validation"},
      {"model.arch",
       "\"gpt\" (LayerNorm, learned positions) or \"llama\" (RMSNorm, rotary, HF names)"},
      {"model.vocab_size", "vocabulary size (0: from the data; token files need it)"},
      {"model.vocab_pad_to", "LM-head rows padded to a multiple of this (1: none; not in files)"},
      {"model.context", "tokens per sequence"},
      {"model.layers", "transformer blocks"},
      {"model.heads", "attention heads (must divide d_model)"},
      {"model.d_model", "width of the residual stream"},
      {"model.ffn", "FFN kind: \"gelu\" (erf), \"gelu_tanh\" (GPT-2's), \"geglu\" or \"swiglu\""},
      {"model.ffn_mult", "FFN hidden width / d_model"},
      {"model.dropout", "dropout probability (attention, FFN, residual)"},
      {"model.bias", "biases in the linear layers"},
      {"model.kv_heads", "llama: key/value heads, dividing heads (0: heads)"},
      {"model.rope_theta", "llama: the rotary embeddings' base"},
      {"model.norm_eps", "llama: RMSNorm's eps"},
      {"model.tie_embeddings", "LM head tied to the token embedding (false: its own)"},
      {"train.batch_size", "sequences per micro-batch, over all GPUs"},
      {"train.grad_accum_steps", "micro-batches per optimizer step (gradients summed in fp32)"},
      {"train.zero", "1: ZeRO-1, AdamW's state sharded over the data-parallel ranks"},
      {"train.iters", "optimizer steps"},
      {"train.lr", "peak learning rate"},
      {"train.min_lr", "learning rate at the end of the decay"},
      {"train.warmup", "linear warm-up steps"},
      {"train.decay_iters", "steps of the decay (0: train.iters)"},
      {"train.schedule", "after warm-up: \"cosine\", \"linear\" or \"constant\""},
      {"train.weight_decay", "AdamW decoupled weight decay"},
      {"train.decay_matrices_only", "weight decay on 2-D weights only (not biases or LayerNorm)"},
      {"train.beta1", "AdamW beta1"},
      {"train.beta2", "AdamW beta2"},
      {"train.eps", "AdamW epsilon"},
      {"train.grad_clip", "global gradient-norm clip (0: off)"},
      {"train.max_nonfinite", "non-finite steps in a row before the run stops"},
  };
  return docs;
}

std::string Config::keys_help() {
  Config defaults;
  std::ostringstream os;
  os << "Config keys (file or --set section.key=value; default after '='):\n";
  for (const Field& f : fields(defaults)) {
    const auto it = key_docs().find(f.path);
    std::string line = "  " + f.path + " = " + f.write();
    if (line.size() < 44) line.resize(44, ' ');
    os << line << "  " << (it == key_docs().end() ? "" : it->second) << "\n";
  }
  return os.str();
}

std::vector<std::string> Config::undocumented_keys() {
  Config defaults;
  std::vector<std::string> out;
  std::set<std::string> known;
  for (const Field& f : fields(defaults)) {
    known.insert(f.path);
    if (!key_docs().count(f.path)) out.push_back(f.path);
  }
  for (const auto& [k, doc] : key_docs())
    if (!known.count(k)) out.push_back("(stale doc) " + k);
  return out;
}

std::vector<std::pair<std::string, std::string>> Config::entries() const {
  Config copy = *this;
  std::vector<std::pair<std::string, std::string>> out;
  for (const Field& f : fields(copy)) out.emplace_back(f.path, f.write());
  return out;
}

std::string Config::to_toml(const std::map<std::string, std::string>& resolved) const {
  std::ostringstream os;
  os << "# fused-ffn resolved config: every key, defaults included"
     << (resolved.empty() ? "" : "; \"# resolved:\" is what this run used (for \"auto\" values)")
     << ".\n";
  std::string section;
  for (const auto& [path, value] : entries()) {
    const std::string s = path.substr(0, path.find('.'));
    if (s != section) {
      os << (section.empty() ? "" : "\n") << "[" << s << "]\n";
      section = s;
    }
    os << path.substr(s.size() + 1) << " = " << value;
    if (auto it = resolved.find(path); it != resolved.end()) os << "  # resolved: " << it->second;
    os << "\n";
  }
  return os.str();
}

}  // namespace ffn::train
