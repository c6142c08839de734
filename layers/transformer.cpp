// layers/transformer.cpp — construction and forward of the GPT pieces (layers/transformer.h).
#include "layers/transformer.h"

#include <cmath>
#include <tuple>
#include <vector>

#include "kernels/checks.h"
#include "kernels/gemm.h"
#include "layers/llama.h"

namespace ffn {

namespace {
// N(0, std) rows drawn as for a [num, dim] table, then zero rows up to `rows` (Note [Padded
// vocabulary]).
Tensor padded_randn(int64_t num, int64_t dim, int64_t rows, double std, const ParamInit& place,
                    Generator& init) {
  Tensor w = Tensor::randn({num, dim}, init, place.dtype, place.device, 0.0, std);
  if (rows <= num) return w;
  Tensor padded = Tensor::zeros({rows, dim}, place.dtype, place.device);
  padded.narrow(0, 0, num).copy_(w);
  return padded;
}
}  // namespace

Embedding::Embedding(int64_t num, int64_t dim, double init_std, const ParamInit& place,
                     Generator& init, int64_t rows)
    : num_(num) {
  FFN_CHECK(num > 0 && dim > 0, "[embedding] num=", num, " and dim=", dim, " must be > 0");
  w_ = register_parameter("weight", padded_randn(num, dim, rows, init_std, place, init));
}

bool Embedding::kernel_checks_ids(const Tensor& ids, bool check_ids) const {
  check_same_device(ids, w_.value(), "embedding", "ids", "weight");
  // The kernels check against the table's rows; padding rows are not ids.
  if (check_ids && num_ < w_.value().size(0)) {
    detail::check_indices(ids.contiguous(), num_, "embedding", "ids", true);
    return false;
  }
  return check_ids;
}

Var Embedding::forward(const Tensor& ids, bool check_ids) {
  return fn::embedding(ids, w_, kernel_checks_ids(ids, check_ids));
}

Var Embedding::forward_sum(const Tensor& ids, const Var& pos, DType dtype, bool check_ids) {
  return fn::embedding_sum(ids, w_, pos, dtype, kernel_checks_ids(ids, check_ids));
}

LayerNorm::LayerNorm(int64_t dim, bool bias, const ParamInit& place, double eps)
    : dim_(dim), eps_(eps) {
  FFN_CHECK(dim > 0, "[layer_norm] dim must be > 0, got ", dim);
  w_ = register_parameter("weight", Tensor::full({dim}, 1.0, place.dtype, place.device));
  if (bias) b_ = register_parameter("bias", Tensor::zeros({dim}, place.dtype, place.device));
}

namespace {
// A norm's input: [..., dim], in the weight's dtype or the fp32 stream of a 16-bit model.
void check_norm_input(const Tensor& x, int64_t dim, const Tensor& w, const char* op) {
  FFN_CHECK(x.dim() >= 1 && x.size(-1) == dim, "[", op, "] x.shape[-1]=", x.dim() ? x.size(-1) : 0,
            " != dim=", dim, " (x.shape=", shape_str(x.shape()), ")");
  if (!(is_half(w.dtype()) && x.dtype() == acc_dtype(w.dtype())))
    check_same_dtype(x, w, op, "x", "weight");
  check_same_device(x, w, op, "x", "weight");
}
}  // namespace

void LayerNorm::check_input(const Tensor& x) const {
  check_norm_input(x, dim_, w_.value(), "layer_norm");
}

Var LayerNorm::forward_impl(const Var& x) {
  return fn::layer_norm(x, w_, b_, eps_);
}

std::pair<Var, Var> LayerNorm::forward_after_add(const Var& res, const Var& h,
                                                 const DropoutSpec& d) {
  check_input(res.value());
  return fn::add_layer_norm(res, h, d, w_, b_, eps_);
}

std::pair<Var, Var> LayerNorm::forward_after_linear_add(const Var& res, const Var& xin,
                                                        Linear& proj, const DropoutSpec& d) {
  check_input(res.value());
  return fn::linear_add_layer_norm(res, xin, proj.weight(), proj.bias(), d, w_, b_, eps_);
}

RMSNorm::RMSNorm(int64_t dim, const ParamInit& place, double eps) : dim_(dim), eps_(eps) {
  FFN_CHECK(dim > 0, "[rms_norm] dim must be > 0, got ", dim);
  w_ = register_parameter("weight", Tensor::full({dim}, 1.0, place.dtype, place.device));
}

void RMSNorm::check_input(const Tensor& x) const {
  check_norm_input(x, dim_, w_.value(), "rms_norm");
}

bool RMSNorm::folds(const Tensor& x) const {
  return folded_ && rms_fold() && gemm_epilogues() && x.is_cuda() && is_half(x.dtype()) &&
         x.dtype() == w_.value().dtype();
}

namespace {
// The folded norm's statistics as its output (RMSNorm's comment): [rows of x], no gradient.
Var stats_var(const Tensor& rstd, const Tensor& x) {
  Shape rows = x.shape();
  rows.pop_back();
  return Var(rstd.reshape(rows));
}
}  // namespace

Var RMSNorm::forward_impl(const Var& x) {
  if (folds(x.value())) return stats_var(fn::rms_stats(x, w_, eps_), x.value());
  return fn::rms_norm(x, w_, eps_);
}

std::pair<Var, Var> RMSNorm::forward_after_add(const Var& res, const Var& h, const DropoutSpec& d) {
  check_input(res.value());
  if (folds(res.value())) {
    auto [a, rstd] = fn::add_rms_stats(res, h, d, w_, eps_);
    return {a, stats_var(rstd, res.value())};
  }
  return fn::add_layer_norm(res, h, d, w_, Var(), eps_, /*rms=*/true);
}

std::pair<Var, Var> RMSNorm::forward_after_linear_add(const Var& res, const Var& xin, Linear& proj,
                                                      const DropoutSpec& d) {
  check_input(res.value());
  if (folds(res.value())) return forward_after_add(res, proj.forward(xin), d);
  return fn::linear_add_layer_norm(res, xin, proj.weight(), proj.bias(), d, w_, Var(), eps_,
                                   /*rms=*/true);
}

namespace {
LinearOptions linear_opts(int64_t in, int64_t out, bool bias, double std, const ParamInit& at) {
  return LinearOptions{in, out, bias, std, at};
}
}  // namespace

CausalSelfAttention::CausalSelfAttention(const AttentionOptions& opt,
                                         std::shared_ptr<Generator> rng, Generator& init)
    : opt_(opt),
      rng_(std::move(rng)),
      c_attn_(linear_opts(opt.d_model, 3 * opt.d_model, opt.bias, opt.init_std, opt.place), init),
      c_proj_(linear_opts(opt.d_model, opt.d_model, opt.bias, opt.proj_init_std, opt.place), init) {
  FFN_CHECK(opt.heads > 0 && opt.d_model % opt.heads == 0, "[attention] d_model=", opt.d_model,
            " is not divisible by heads=", opt.heads);
  for (float p : {opt.attn_dropout, opt.resid_dropout}) check_dropout_p(p, "attention");
  register_module("c_attn", c_attn_);
  register_module("c_proj", c_proj_);
}

void CausalSelfAttention::check_input(const Tensor& x) const {
  FFN_CHECK(x.dim() == 3 && x.size(2) == opt_.d_model, "[attention] x must be [B, T, ",
            opt_.d_model, "], got ", shape_str(x.shape()));
}

Var CausalSelfAttention::forward_heads(const Var& x) {
  check_input(x.value());
  FFN_CHECK(!(is_training() && opt_.resid_dropout > 0),
            "[attention] forward_heads leaves out c_proj and its residual dropout (p = ",
            opt_.resid_dropout, "); use forward()");
  return heads(x);
}

Var CausalSelfAttention::heads(const Var& x) {
  const DropoutSpec attn =
      is_training() && opt_.attn_dropout > 0 ? rng_->dropout(opt_.attn_dropout) : DropoutSpec{};
  return fn::causal_attention(c_attn_.forward(x), opt_.heads, attn, opt_.fused);
}

Var CausalSelfAttention::forward_impl(const Var& x) {
  Var y = c_proj_.forward(heads(x));
  if (is_training() && opt_.resid_dropout > 0)
    y = fn::dropout(y, rng_->dropout(opt_.resid_dropout));
  return y;
}

namespace {
double proj_std(const GptConfig& cfg) {
  return cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.layers));
}
// The block applies the residual dropout itself (in fn::dropout_add), so the attention
// module drops only its probabilities.
AttentionOptions attn_opts(const GptConfig& cfg) {
  return AttentionOptions{cfg.d_model, cfg.heads,     cfg.dropout,   0.0f,
                          cfg.bias,    cfg.init_std,  proj_std(cfg), cfg.place,
                          cfg.fused_attention};
}
}  // namespace

TransformerBlock::TransformerBlock(const GptConfig& cfg, std::shared_ptr<Generator> rng,
                                   Generator& init)
    : d_model_(cfg.d_model),
      dropout_(cfg.dropout),
      rng_(rng),
      ln_1_(cfg.d_model, cfg.bias, cfg.place),
      attn_(attn_opts(cfg), rng, init),
      ln_2_(cfg.d_model, cfg.bias, cfg.place) {
  FeedForwardOptions f;
  f.d_model = cfg.d_model;
  f.hidden = static_cast<int64_t>(std::llround(cfg.ffn_mult * static_cast<double>(cfg.d_model)));
  FFN_CHECK(f.hidden > 0, "[model] ffn_mult=", cfg.ffn_mult, " gives an empty hidden layer");
  f.act = ffn_activation(cfg.ffn).act;
  f.gated = ffn_activation(cfg.ffn).gated;
  f.dropout = 0.0f;      // nanoGPT drops only the MLP output,
  f.out_dropout = 0.0f;  // which the block does in its residual add
  f.bias = cfg.bias;
  f.init_std = cfg.init_std;
  f.place = cfg.place;
  // Weights come from `init` (identical on every rank); `rng` only draws dropout masks.
  mlp_ = std::make_unique<FeedForward>(f, rng, &init);
  register_module("ln_1", ln_1_);
  register_module("attn", attn_);
  register_module("ln_2", ln_2_);
  register_module("mlp", *mlp_);
}

void TransformerBlock::check_input(const Tensor& x) const {
  FFN_CHECK(x.dim() == 3 && x.size(2) == d_model_, "[block] x must be [B, T, ", d_model_,
            "], got ", shape_str(x.shape()));
}

Var PreNormBlock::forward_impl(const Var& x) {
  const Open o = open_impl(x, first_norm().forward(x));
  return fn::dropout_add(o.a, o.m, o.d);
}

PreNormBlock::Open TransformerBlock::open_impl(const Var& x, const Var& x_norm) {
  // x is the residual stream (fp32 for 16-bit models); the branches compute in the
  // parameters' dtype; each residual add shares its passes with the norm after it.
  const bool drop = is_training() && dropout_ > 0.0f;
  auto spec = [&] { return drop ? rng_->dropout(dropout_) : DropoutSpec{}; };
  // a = x + dropout(c_proj(heads)), c_proj's GEMM ending in the add and ln_2 where it can.
  // The attention's dropout is drawn before the residual's, as when c_proj ran in it.
  const Var heads = attn_.forward_heads(x_norm);
  const auto [a, a_norm] = ln_2_.forward_after_linear_add(x, heads, attn_.out_proj(), spec());
  const Var m = mlp_->forward(a_norm);
  return {a, m, spec()};
}

GPT::GPT(const GptConfig& cfg, std::shared_ptr<Generator> rng, Generator& init)
    : cfg_(cfg), rng_(rng), drop_(cfg.dropout, rng) {
  FFN_CHECK(cfg.layers > 0, "[model] layers must be > 0, got ", cfg.layers);
  FFN_CHECK(cfg.vocab_pad_to >= 1, "[model] vocab_pad_to must be >= 1, got ", cfg.vocab_pad_to);
  const bool llama = cfg.arch == Arch::llama;
  FFN_CHECK(!llama || !cfg.bias, "[model] the llama arch has no biases (model.bias = false)");
  FFN_CHECK(llama || cfg.kv_heads == 0 || cfg.kv_heads == cfg.heads,
            "[model] kv_heads (grouped-query attention) needs the llama arch");
  // Weights are drawn in registration order, so a gpt model's initial values do not depend on
  // the options added later.
  wte_ = std::make_unique<Embedding>(cfg.vocab_size, cfg.d_model, cfg.init_std, cfg.place, init,
                                     cfg.padded_vocab());
  if (llama) {
    model_.add("embed_tokens", *wte_);
  } else {
    wpe_ = std::make_unique<Embedding>(cfg.context, cfg.d_model, cfg.init_std, cfg.place, init);
    register_module("wte", *wte_);
    register_module("wpe", *wpe_);
  }
  register_module("drop", drop_);
  for (int64_t i = 0; i < cfg.layers; ++i) {
    if (llama) {
      h_.push_back(std::make_unique<LlamaBlock>(cfg, rng, init));
      model_.add("layers." + std::to_string(i), *h_.back());
    } else {
      h_.push_back(std::make_unique<TransformerBlock>(cfg, rng, init));
      register_module("h." + std::to_string(i), *h_.back());
    }
  }
  if (llama) {
    ln_f_ = std::make_unique<RMSNorm>(cfg.d_model, cfg.place, cfg.norm_eps);
    model_.add("norm", *ln_f_);
    register_module("model", model_);
  } else {
    ln_f_ = std::make_unique<LayerNorm>(cfg.d_model, cfg.bias, cfg.place);
    register_module("ln_f", *ln_f_);
  }
  if (!cfg.tie_embeddings)  // drawn like the embedding, padding rows zero
    lm_head_ = register_parameter("lm_head.weight",
                                  padded_randn(cfg.vocab_size, cfg.d_model, cfg.padded_vocab(),
                                               cfg.init_std, cfg.place, init));
  // GPT-2: the projections into the residual stream start smaller (1/√(2·layers)); the
  // llama blocks draw o_proj and down_proj that way themselves.
  if (!llama)
    for (auto& [name, v] : named_parameters()) {
      const bool proj = name.ends_with("attn.c_proj.weight") || name.ends_with("mlp.fc2.weight");
      if (proj)
        v.mutable_value() = Tensor::randn(v.shape(), init, cfg.place.dtype, cfg.place.device, 0.0,
                                          proj_std(cfg));
    }
}

Var GPT::hidden(const Tensor& ids, bool ids_in_range) {
  FFN_CHECK(ids.dim() == 2, "[gpt] ids must be [B, T], got ", ids.desc());
  FFN_CHECK(ids.size(1) >= 1 && ids.size(1) <= cfg_.context, "[gpt] sequence length ",
            ids.size(1), " must be in [1, context=", cfg_.context, "]");
  // Note [Mixed-precision residual stream]: with 16-bit parameters the residual stream
  // (embeddings, residual adds, LayerNorm inputs) is kept in fp32, as PyTorch's autocast
  // does; only the branches (attention, FFN, the LM head) run in 16 bits.
  const DType stream = cfg_.fp32_residual ? acc_dtype(cfg_.place.dtype) : cfg_.place.dtype;
  // Token and position embeddings in one pass (Note [Embeddings in one pass]).
  Var x = wte_->forward_sum(ids, wpe_ ? wpe_->weight() : Var(), stream, !ids_in_range);
  x = drop_.forward(x);
  // Each block's last residual add runs in one pass with the norm after it: the next
  // block's first norm, or ln_f (Note [Residual add and norm]).
  Var x_norm = h_.front()->first_norm().forward(x);
  for (size_t i = 0; i < h_.size(); ++i) {
    const PreNormBlock::Open o = h_[i]->forward_open(x, x_norm);
    ResidualNorm& next = i + 1 < h_.size() ? h_[i + 1]->first_norm() : *ln_f_;
    std::tie(x, x_norm) = next.forward_after_add(o.a, o.m, o.d);
  }
  return x_norm;
}

Var GPT::forward(const Tensor& ids, bool ids_in_range) {
  return fn::leading_columns(fn::linear(hidden(ids, ids_in_range), head_weight(), Var()),
                             cfg_.vocab_size);
}

Var GPT::loss(const Tensor& ids, const Tensor& targets, bool ids_in_range) {
  FFN_CHECK(targets.shape() == ids.shape(), "[gpt] targets.shape=", shape_str(targets.shape()),
            " != ids.shape=", shape_str(ids.shape()));
  // The padded logits go to the loss as they are; it leaves the padding columns out.
  const Var h = hidden(ids, ids_in_range);
  if (!cfg_.fused_classifier)
    return fn::cross_entropy(fn::linear(h, head_weight(), Var()), targets, !ids_in_range,
                             cfg_.vocab_size);
  return fn::linear_cross_entropy(h, head_weight(), targets, !ids_in_range, cfg_.vocab_size,
                                  classifier_chunk(targets.numel()));
}

int64_t GPT::classifier_chunk(int64_t rows) const {
  if (cfg_.classifier_chunk > 0) return cfg_.classifier_chunk;
  const int64_t row_bytes =
      cfg_.padded_vocab() * static_cast<int64_t>(dtype_size(cfg_.place.dtype));
  const int64_t chunks =
      std::max<int64_t>(1, (rows * row_bytes + kClassifierChunkBytes - 1) / kClassifierChunkBytes);
  return (rows + chunks - 1) / chunks;
}

int64_t GPT::stored_parameters() const {
  const int64_t tables = cfg_.tie_embeddings ? 1 : 2;
  return num_parameters() - tables * (cfg_.padded_vocab() - cfg_.vocab_size) * cfg_.d_model;
}

double GPT::flops_per_token(int64_t t) const {
  const int64_t positions = wpe_ ? wpe_->weight().value().numel() : 0;
  const double n = static_cast<double>(stored_parameters() - positions);
  return 6.0 * n + 12.0 * static_cast<double>(cfg_.layers * t * cfg_.d_model);
}

GPT::NamedTensors GPT::stored_view(NamedTensors ts) const {
  const int64_t vp = cfg_.padded_vocab();
  if (vp == cfg_.vocab_size) return ts;
  auto padded = [](const std::string& name) {
    for (const char* p : {"wte.weight", "model.embed_tokens.weight", "lm_head.weight"}) {
      const std::string base(p);
      if (name == base || name.starts_with(base + ".")) return true;
    }
    return false;
  };
  for (auto& [name, t] : ts)
    if (padded(name) && t.dim() == 2 && t.size(0) == vp) t = t.narrow(0, 0, cfg_.vocab_size);
  return ts;
}

}  // namespace ffn
