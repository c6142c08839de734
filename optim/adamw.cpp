// optim/adamw.cpp — AdamW's bookkeeping around the fused kernel, loss scaling, schedules.
#include "optim/adamw.h"

#include <cmath>
#include <numbers>

namespace ffn {

AdamW::AdamW(std::vector<std::pair<std::string, Var>> named_params, const AdamWOptions& opt)
    : params_(std::move(named_params)), opt_(opt) {
  FFN_CHECK(opt.grad_clip >= 0, "[adamw] grad_clip must be >= 0, got ", opt.grad_clip);
  FFN_CHECK(opt.max_nonfinite_in_row >= 1, "[adamw] max_nonfinite_in_row must be >= 1");
  FFN_CHECK(opt.decay.empty() || opt.decay.size() == params_.size(), "[adamw] decay has ",
            opt.decay.size(), " entries for ", params_.size(), " parameters");
  size_t grouped = 0;
  for (size_t g : opt.groups) grouped += g;
  FFN_CHECK(opt.groups.empty() || grouped == params_.size(), "[adamw] groups cover ", grouped,
            " parameters of ", params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [name, p] = params_[i];
    FFN_CHECK(p.defined() && p.requires_grad(), "[adamw] parameter ", name,
              " is undefined or does not require grad");
    const Tensor& w = p.value();
    AdamWSlot s;
    s.param = w;
    const DType acc = acc_dtype(w.dtype());
    s.m = Tensor::zeros(w.shape(), acc, w.device());
    s.v = Tensor::zeros(w.shape(), acc, w.device());
    if (is_half(w.dtype())) s.master = w.to(DType::f32);
    s.decay = opt.decay.empty() ? !opt.decay_matrices_only || w.dim() >= 2 : opt.decay[i];
    slots_.push_back(std::move(s));
  }
}

Tensor& AdamW::decision() {
  if (!decision_.defined()) {
    FFN_CHECK(!params_.empty(), "[adamw] no parameters to optimize");
    std::vector<double> d(kDecisionSize, 0.0);
    d[0] = static_cast<double>(steps_);
    decision_ = Tensor::from_vector(d, {kDecisionSize}, DType::f64,
                                    params_[0].second.value().device());
  }
  return decision_;
}

void AdamW::launch(double lr, const Tensor& loss, double grad_divisor) {
  FFN_CHECK(!in_flight_, "[adamw] launch() while the previous step is in flight (call finish())");
  set_lr(lr);
  queue(loss, grad_divisor);
  start_report();
}

void AdamW::set_lr(double lr) {
  FFN_CHECK(std::isfinite(lr) && lr >= 0, "[adamw] lr must be finite and >= 0, got ", lr);
  decision().narrow(0, 7, 1).fill_(lr);  // Note [Device-side step decision]: [7]
}

void AdamW::queue(const Tensor& loss, double grad_divisor) {
  NoGradGuard no_grad;
  FFN_CHECK(grad_divisor > 0 && std::isfinite(grad_divisor), "[adamw] grad_divisor must be > 0");
  std::vector<AdamWSlot> live;
  std::vector<size_t> live_index;  // live[j] is parameter live_index[j]
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Var& p = params_[i].second;
    if (!p.grad().defined()) continue;
    AdamWSlot s = slots_[i];
    s.param = p.value();  // the layers may have replaced the tensor (e.g. Module::to)
    s.grad = p.grad().contiguous();
    grads.push_back(s.grad);
    live.push_back(std::move(s));
    live_index.push_back(i);
  }
  Tensor& dec = decision();
  Tensor sumsq = grads.empty() ? Tensor::zeros({1}, DType::f64, dec.device())
                               : global_grad_sumsq(grads);
  if (opt_.reduce_sumsq) opt_.reduce_sumsq(sumsq);
  const AdamWDecide d{grad_divisor, opt_.grad_clip, opt_.hyper.beta1, opt_.hyper.beta2};
  adamw_decide(loss, sumsq, d, dec);
  const AdamWHyper& h = opt_.hyper;  // its lr is not read: the decision's [7] is
  if (opt_.groups.empty()) {
    if (!live.empty()) adamw_step(live, h, dec);
  } else {  // group by group, with the caller's work queued after each
    size_t end = 0, j = 0;
    for (size_t g = 0; g < opt_.groups.size(); ++g) {
      end += opt_.groups[g];
      std::vector<AdamWSlot> part;
      for (; j < live.size() && live_index[j] < end; ++j) part.push_back(live[j]);
      if (!part.empty()) adamw_step(part, h, dec);
      if (opt_.after_group) opt_.after_group(g);
    }
  }
}

void AdamW::start_report() {
  FFN_CHECK(!in_flight_, "[adamw] a step's report started while the previous one is in flight "
            "(call finish())");
  report_.start(decision());
  in_flight_ = true;
}

StepReport AdamW::finish() {
  FFN_CHECK(in_flight_, "[adamw] finish() without a launched step");
  in_flight_ = false;
  const std::vector<double> d = report_.wait();
  StepReport r;
  r.loss = d[5];
  r.grad_norm = d[6];
  r.skipped = d[1] == 0.0;
  if (r.skipped) {
    ++skipped_total_;
    ++skipped_in_row_;
    FFN_CHECK(skipped_in_row_ < opt_.max_nonfinite_in_row, "[adamw] ", skipped_in_row_,
              " steps in a row had a non-finite loss or gradient (last: loss=", d[5],
              ", grad_norm=", r.grad_norm, ") after ", steps_,
              " good steps; giving up. Lower the lr, check the data, or use bf16/fp32.");
    return r;
  }
  skipped_in_row_ = 0;
  ++steps_;
  FFN_CHECK(static_cast<double>(steps_) == d[0], "[adamw] internal: the device counted ", d[0],
            " updates, the host ", steps_);
  return r;
}

StepReport AdamW::step(double lr, const Tensor& loss, double grad_divisor) {
  launch(lr, loss, grad_divisor);
  return finish();
}

StepReport AdamW::step(double lr, double loss, double grad_divisor) {
  FFN_CHECK(!params_.empty(), "[adamw] no parameters to optimize");
  const Device dev = params_[0].second.value().device();
  return step(lr, Tensor::full({1}, loss, DType::f64, dev), grad_divisor);
}

void AdamW::zero_grad() {
  for (auto& [name, p] : params_) p.zero_grad();
}

std::vector<std::pair<std::string, Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& n = params_[i].first;
    out.emplace_back(n + ".exp_avg", slots_[i].m);
    out.emplace_back(n + ".exp_avg_sq", slots_[i].v);
    if (slots_[i].master.defined()) out.emplace_back(n + ".master", slots_[i].master);
  }
  return out;
}

std::vector<int64_t> AdamW::counters() const {
  FFN_CHECK(!in_flight_, "[adamw] counters() while a step is in flight (call finish())");
  return {steps_, skipped_total_, skipped_in_row_};
}

void AdamW::set_counters(const std::vector<int64_t>& c) {
  FFN_CHECK(c.size() == 3 && c[0] >= 0 && c[1] >= 0 && c[2] >= 0,
            "[adamw] bad optimizer counters in the checkpoint");
  FFN_CHECK(!in_flight_, "[adamw] set_counters() while a step is in flight");
  steps_ = c[0];
  skipped_total_ = c[1];
  skipped_in_row_ = c[2];
  decision_ = Tensor();  // re-seeded from steps_ at the next launch()
}

void LossScaler::update(bool overflow) {
  if (!enabled_) return;
  if (overflow) {
    scale_ = std::max(1.0, scale_ / 2);
    good_ = 0;
  } else if (++good_ >= interval_) {
    scale_ = std::min(scale_ * 2, 16777216.0);
    good_ = 0;
  }
}

void LossScaler::set_state(const std::vector<double>& s) {
  FFN_CHECK(s.size() == 2 && s[0] >= 1.0, "[loss_scale] bad loss-scaler state in the checkpoint");
  scale_ = s[0];
  good_ = static_cast<int64_t>(s[1]);
}

double lr_at(LrSchedule s, int64_t iter, double lr, double min_lr, int64_t warmup,
             int64_t decay_iters) {
  if (iter < warmup)
    return lr * static_cast<double>(iter + 1) / static_cast<double>(warmup + 1);
  if (s == LrSchedule::constant) return lr;
  if (iter >= decay_iters) return min_lr;
  const double ratio =
      static_cast<double>(iter - warmup) / static_cast<double>(std::max<int64_t>(1, decay_iters - warmup));
  if (s == LrSchedule::linear) return lr - ratio * (lr - min_lr);
  return min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * ratio)) * (lr - min_lr);
}

}  // namespace ffn
