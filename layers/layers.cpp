// layers/layers.cpp — construction, input checks and forward of the layers.
#include "layers/layers.h"

#include <cmath>

namespace ffn {

namespace {

Tensor init_weight(const Shape& shape, int64_t fan_in, double init_std, const ParamInit& at,
                   Generator& rng) {
  if (init_std > 0) return Tensor::randn(shape, rng, at.dtype, at.device, 0.0, init_std);
  const double bound = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(fan_in, 1)));
  return Tensor::uniform(shape, rng, -bound, bound, at.dtype, at.device);
}

Tensor init_bias(int64_t n, int64_t fan_in, double init_std, const ParamInit& at, Generator& rng) {
  if (init_std > 0) return Tensor::zeros({n}, at.dtype, at.device);
  return init_weight({n}, fan_in, 0.0, at, rng);
}

void check_features(const Tensor& x, int64_t expected, const Var& param, const char* layer,
                    const char* what) {
  FFN_CHECK(x.dim() >= 1, "[", layer, "] input must have at least one dimension, got ", x.desc());
  FFN_CHECK(x.size(-1) == expected, "[", layer, "] x.shape[-1]=", x.size(-1), " != ", what, "=",
            expected, " (x.shape=", shape_str(x.shape()), ")");
  check_same_dtype(x, param.value(), layer, "x", "weight");
  check_same_device(x, param.value(), layer, "x", "weight");
}

}  // namespace

Linear::Linear(const LinearOptions& opt, Generator& init_rng) : opt_(opt) {
  FFN_CHECK(opt.in_features > 0 && opt.out_features > 0, "[linear] in_features=", opt.in_features,
            " and out_features=", opt.out_features, " must be > 0");
  w_ =
      register_parameter("weight", init_weight({opt.out_features, opt.in_features}, opt.in_features,
                                               opt.init_std, opt.place, init_rng));
  if (opt.bias)
    b_ = register_parameter(
        "bias", init_bias(opt.out_features, opt.in_features, opt.init_std, opt.place, init_rng));
}

void Linear::check_input(const Tensor& x) const {
  check_features(x, opt_.in_features, w_, "linear", "in_features");
}

Var Linear::forward_impl(const Var& x) {
  return fn::linear(x, w_, b_);
}

Dropout::Dropout(float p, std::shared_ptr<Generator> rng) : p_(p), rng_(std::move(rng)) {
  check_dropout_p(p, "dropout");
  FFN_CHECK(rng_ || p == 0.0f, "[dropout] p=", p, " needs a Generator");
}

void Dropout::check_input(const Tensor& x) const {
  FFN_CHECK(x.defined(), "[dropout] input is an undefined tensor");
}

Var Dropout::forward_impl(const Var& x) {
  if (!is_training() || p_ == 0.0f) return x;
  return fn::dropout(x, rng_->dropout(p_));
}

FeedForward::FeedForward(const FeedForwardOptions& opt, std::shared_ptr<Generator> rng,
                         Generator* init)
    : opt_(opt), rng_(std::move(rng)) {
  const char* layer = opt.gated ? "gated_feed_forward" : "feed_forward";
  FFN_CHECK(opt.d_model > 0 && opt.hidden > 0, "[", layer, "] d_model=", opt.d_model,
            " and hidden=", opt.hidden, " must be > 0");
  for (float p : {opt.dropout, opt.out_dropout}) check_dropout_p(p, layer);
  FFN_CHECK(rng_, "[", layer, "] needs a Generator");
  const int64_t h1 = opt.gated ? 2 * opt.hidden : opt.hidden;
  Generator& g = init ? *init : *rng_;
  w1_ = register_parameter("fc1.weight",
                           init_weight({h1, opt.d_model}, opt.d_model, opt.init_std, opt.place, g));
  if (opt.bias)
    b1_ = register_parameter("fc1.bias", init_bias(h1, opt.d_model, opt.init_std, opt.place, g));
  w2_ = register_parameter(
      "fc2.weight", init_weight({opt.d_model, opt.hidden}, opt.hidden, opt.init_std, opt.place, g));
  if (opt.bias)
    b2_ = register_parameter("fc2.bias",
                             init_bias(opt.d_model, opt.hidden, opt.init_std, opt.place, g));
}

void FeedForward::check_input(const Tensor& x) const {
  check_features(x, opt_.d_model, w1_, opt_.gated ? "gated_feed_forward" : "feed_forward",
                 "d_model");
}

Var FeedForward::forward_impl(const Var& x) {
  FfnDropout d;
  if (is_training()) {
    if (opt_.dropout > 0) d.hidden = rng_->dropout(opt_.dropout);
    if (opt_.out_dropout > 0) d.out = rng_->dropout(opt_.out_dropout);
  }
  const FfnConfig cfg{opt_.act, opt_.gated, opt_.recompute};
  return fn::ffn(x, w1_, b1_, w2_, b2_, cfg, d);
}

namespace {
FeedForwardOptions gated_options(FeedForwardOptions opt) {
  opt.gated = true;
  return opt;
}
}  // namespace

GatedFeedForward::GatedFeedForward(const FeedForwardOptions& opt, std::shared_ptr<Generator> rng,
                                   Generator* init)
    : FeedForward(gated_options(opt), std::move(rng), init) {}

}  // namespace ffn
