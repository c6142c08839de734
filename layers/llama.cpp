// layers/llama.cpp — the Llama-shaped blocks (layers/llama.h, Note [Llama projections]).
#include "layers/llama.h"

#include <cmath>

namespace ffn {

namespace {
LinearOptions no_bias(int64_t in, int64_t out, double std, const ParamInit& at) {
  return LinearOptions{in, out, false, std, at};
}
double out_std(const GptConfig& cfg) {  // o_proj and down_proj, as GPT-2's c_proj
  return cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.layers));
}
int64_t kv_heads_of(const GptConfig& cfg) {
  return cfg.kv_heads > 0 ? cfg.kv_heads : cfg.heads;
}
int64_t hidden_of(const GptConfig& cfg) {
  return static_cast<int64_t>(std::llround(cfg.ffn_mult * static_cast<double>(cfg.d_model)));
}
}  // namespace

LlamaAttention::LlamaAttention(const GptConfig& cfg, std::shared_ptr<Generator> rng,
                               Generator& init)
    : cfg_(cfg),
      head_dim_(cfg.heads > 0 ? cfg.d_model / cfg.heads : 0),
      kv_heads_(kv_heads_of(cfg)),
      rng_(std::move(rng)),
      q_proj_(no_bias(cfg.d_model, cfg.d_model, cfg.init_std, cfg.place), init),
      k_proj_(no_bias(cfg.d_model, kv_heads_of(cfg) * (cfg.d_model / cfg.heads), cfg.init_std,
                      cfg.place),
              init),
      v_proj_(no_bias(cfg.d_model, kv_heads_of(cfg) * (cfg.d_model / cfg.heads), cfg.init_std,
                      cfg.place),
              init),
      o_proj_(no_bias(cfg.d_model, cfg.d_model, out_std(cfg), cfg.place), init) {
  FFN_CHECK(cfg.heads > 0 && cfg.d_model % cfg.heads == 0, "[attention] d_model=", cfg.d_model,
            " is not divisible by heads=", cfg.heads);
  FFN_CHECK(kv_heads_ > 0 && cfg.heads % kv_heads_ == 0, "[attention] kv_heads=", kv_heads_,
            " must divide heads=", cfg.heads);
  FFN_CHECK(head_dim_ % 2 == 0, "[attention] rotary embeddings need an even head size, got ",
            head_dim_);
  check_dropout_p(cfg.dropout, "attention");
  register_module("q_proj", q_proj_);
  register_module("k_proj", k_proj_);
  register_module("v_proj", v_proj_);
  register_module("o_proj", o_proj_);
}

void LlamaAttention::check_input(const Tensor& x) const {
  FFN_CHECK(x.dim() == 3 && x.size(2) == cfg_.d_model, "[attention] x must be [B, T, ",
            cfg_.d_model, "], got ", shape_str(x.shape()));
}

Var LlamaAttention::forward_impl(const Var& x) {
  return o_proj_.forward(forward_heads(x));
}

Var LlamaAttention::qkv_weight() const {
  // One QKV weight, key/value heads repeated per group (Note [Llama projections]).
  const int64_t group = cfg_.heads / kv_heads_;
  std::vector<fn::RowRange> rows{{q_proj_.weight(), 0, cfg_.d_model}};
  for (const Linear* p : {&k_proj_, &v_proj_}) {
    if (group == 1) {
      rows.push_back({p->weight(), 0, cfg_.d_model});
      continue;
    }
    for (int64_t h = 0; h < cfg_.heads; ++h)
      rows.push_back({p->weight(), (h / group) * head_dim_, head_dim_});
  }
  return fn::concat_rows(rows);
}

DropoutSpec LlamaAttention::attention_dropout() {
  return is_training() && cfg_.dropout > 0 ? rng_->dropout(cfg_.dropout) : DropoutSpec{};
}

Var LlamaAttention::forward_heads(const Var& x) {
  check_input(x.value());
  const Var w = qkv_weight();
  return fn::rope_attention(x, w, cfg_.heads, cfg_.rope_theta, attention_dropout(),
                            cfg_.fused_attention);
}

Var LlamaAttention::forward_heads_folded(const Var& x, const RMSNorm& norm, const Tensor& rstd) {
  check_input(x.value());
  const Var w = qkv_weight();
  return fn::rms_norm_rope_attention(x, norm.weight(), rstd, norm.eps(), w, cfg_.heads,
                                     cfg_.rope_theta, attention_dropout(), cfg_.fused_attention);
}

LlamaMLP::LlamaMLP(const GptConfig& cfg, Generator& init)
    : d_model_(cfg.d_model),
      hidden_(hidden_of(cfg)),
      act_(ffn_activation(cfg.ffn).act),
      gate_proj_(no_bias(cfg.d_model, hidden_of(cfg), cfg.init_std, cfg.place), init),
      up_proj_(no_bias(cfg.d_model, hidden_of(cfg), cfg.init_std, cfg.place), init),
      down_proj_(no_bias(hidden_of(cfg), cfg.d_model, out_std(cfg), cfg.place), init) {
  FFN_CHECK(hidden_ > 0, "[model] ffn_mult=", cfg.ffn_mult, " gives an empty hidden layer");
  FFN_CHECK(ffn_activation(cfg.ffn).gated, "[model] the llama arch's MLP is gated: model.ffn ",
            "must be swiglu or geglu, got ", name_of(kFfnKindNames, cfg.ffn));
  register_module("gate_proj", gate_proj_);
  register_module("up_proj", up_proj_);
  register_module("down_proj", down_proj_);
}

void LlamaMLP::check_input(const Tensor& x) const {
  FFN_CHECK(x.dim() >= 1 && x.size(-1) == d_model_, "[mlp] x.shape[-1]=",
            x.dim() ? x.size(-1) : 0, " != d_model=", d_model_);
}

Var LlamaMLP::forward_impl(const Var& x) {
  // fc1 = [up | gate]: value half first (Note [Llama projections]).
  const Var w1 =
      fn::concat_rows({{up_proj_.weight(), 0, hidden_}, {gate_proj_.weight(), 0, hidden_}});
  return fn::ffn(x, w1, Var(), down_proj_.weight(), Var(), FfnConfig{act_, true, false}, {});
}

Var LlamaMLP::forward_folded(const Var& x, const RMSNorm& norm, const Tensor& rstd) {
  check_input(x.value());
  const Var w1 =
      fn::concat_rows({{up_proj_.weight(), 0, hidden_}, {gate_proj_.weight(), 0, hidden_}});
  return fn::rms_norm_ffn(x, norm.weight(), rstd, norm.eps(), w1, Var(), down_proj_.weight(), Var(),
                          FfnConfig{act_, true, false}, {});
}

LlamaBlock::LlamaBlock(const GptConfig& cfg, std::shared_ptr<Generator> rng, Generator& init)
    : d_model_(cfg.d_model),
      dropout_(cfg.dropout),
      rng_(rng),
      input_layernorm_(cfg.d_model, cfg.place, cfg.norm_eps),
      self_attn_(cfg, rng, init),
      post_attention_layernorm_(cfg.d_model, cfg.place, cfg.norm_eps),
      mlp_(cfg, init) {
  input_layernorm_.set_folded(true);  // where they can (RMSNorm::folds)
  post_attention_layernorm_.set_folded(true);
  register_module("input_layernorm", input_layernorm_);
  register_module("self_attn", self_attn_);
  register_module("post_attention_layernorm", post_attention_layernorm_);
  register_module("mlp", mlp_);
}

void LlamaBlock::check_input(const Tensor& x) const {
  FFN_CHECK(x.dim() == 3 && x.size(2) == d_model_, "[block] x must be [B, T, ", d_model_,
            "], got ", shape_str(x.shape()));
}

PreNormBlock::Open LlamaBlock::open_impl(const Var& x, const Var& x_norm) {
  const bool drop = is_training() && dropout_ > 0.0f;
  auto spec = [&] { return drop ? rng_->dropout(dropout_) : DropoutSpec{}; };
  // The attention's dropout is drawn before the add's. A folded norm's "output" is x's
  // statistics (RMSNorm's comment).
  const Var heads = input_layernorm_.folds(x.value())
                        ? self_attn_.forward_heads_folded(x, input_layernorm_, x_norm.value())
                        : self_attn_.forward_heads(x_norm);
  const auto [a, a_norm] =
      post_attention_layernorm_.forward_after_linear_add(x, heads, self_attn_.out_proj(), spec());
  const Var m = post_attention_layernorm_.folds(a.value())
                    ? mlp_.forward_folded(a, post_attention_layernorm_, a_norm.value())
                    : mlp_.forward(a_norm);
  return {a, m, spec()};
}

}  // namespace ffn
