// train/dist/ddp.cpp — the bucketed, overlapped gradient all-reduce (train/dist/ddp.h).
#include "train/dist/ddp.h"

namespace ffn::train {

GradSync::GradSync(std::vector<std::pair<std::string, Var>> params, Comm& comm,
                   int64_t bucket_bytes, bool shard, bool flat)
    : params_(std::move(params)),
      comm_(comm),
      shard_(shard),
      flat_(shard || flat),
      where_(params_.size()),
      filled_(params_.size()) {
  FFN_CHECK(bucket_bytes > 0, "[ddp] bucket_bytes must be > 0, got ", bucket_bytes);
  FFN_CHECK(!params_.empty(), "[ddp] no parameters");
  const Tensor& first = params_[0].second.value();
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& w = params_[k].second.value();
    check_same_dtype(w, first, "ddp", params_[k].first.c_str(), params_[0].first.c_str());
    check_same_device(w, first, "ddp", params_[k].first.c_str(), params_[0].first.c_str());
    if (buckets_.empty() || bytes >= bucket_bytes) {
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    where_[k] = {buckets_.size() - 1, 0};
    b.params.push_back(k);
    bytes += static_cast<int64_t>(w.nbytes());
    index_[params_[k].second.impl()] = k;
  }
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    int64_t off = 0;
    for (size_t k : buckets_[bi].params) {
      where_[k].second = off;
      off += params_[k].second.value().numel();
    }
    if (shard_) off = (off + comm_.world() - 1) / comm_.world() * comm_.world();
    if (flat_) buckets_[bi].flat = Tensor::zeros({off}, first.dtype(), first.device());
  }
  // Note [Copy-engine gradient reduction]: a window for every bucket but the last (plain:
  // the gradients in place; ZeRO-1: the flat buffer).
  if ((shard_ || !flat_) && buckets_.size() > 1) {
    std::vector<std::pair<int64_t, int64_t>> beside;  // (bytes, tensors) per bucket
    for (size_t bi = 0; bi + 1 < buckets_.size(); ++bi) {
      int64_t b = shard_ ? static_cast<int64_t>(buckets_[bi].flat.nbytes()) : 0;
      if (!shard_)
        for (size_t k : buckets_[bi].params)
          b += static_cast<int64_t>(params_[k].second.value().nbytes());
      beside.emplace_back(b, shard_ ? 1 : static_cast<int64_t>(buckets_[bi].params.size()));
    }
    beside_ = comm_.reserve_beside(beside);
  }
}

std::vector<std::vector<std::string>> GradSync::layout() const {
  std::vector<std::vector<std::string>> out;
  for (const Bucket& b : buckets_) {
    out.emplace_back();
    for (size_t k : b.params) out.back().push_back(params_[k].first);
  }
  return out;
}

Var::LeafHook GradSync::hook() {
  for (Bucket& b : buckets_) b.ready = 0, b.launched = false;
  std::fill(filled_.begin(), filled_.end(), false);
  next_ = 0;
  stats_ = SyncStats{static_cast<int>(buckets_.size()), 0};
  return [this](const Var& v) { on_ready(v); };
}

void GradSync::on_ready(const Var& v) {
  auto it = index_.find(v.impl());
  if (it == index_.end()) return;  // not a parameter of this model (e.g. an input)
  const size_t k = it->second;
  if (filled_[k]) return;
  const auto [bi, off] = where_[k];
  if (flat_) {
    Tensor slot = buckets_[bi].flat.narrow(0, off, v.value().numel());
    slot.copy_(v.grad().reshape({v.value().numel()}));
  } else if (!v.grad().is_contiguous()) {  // Note [In-place gradient buckets]
    Var(v).set_grad(v.grad().contiguous());
  }
  filled_[k] = true;
  ++buckets_[bi].ready;
  launch_ready_prefix(true);
}

void GradSync::launch_ready_prefix(bool in_backward) {
  while (next_ < buckets_.size()) {
    Bucket& b = buckets_[next_];
    if (b.ready < static_cast<int>(b.params.size())) return;
    const std::string what = "gradient bucket " + std::to_string(next_);
    const bool beside = beside_ && next_ + 1 < buckets_.size();
    if (shard_ && beside) {
      comm_.reduce_scatter_beside(b.flat, /*average=*/true, what);
    } else if (shard_) {
      comm_.reduce_scatter(b.flat, /*average=*/true, what);
    } else if (flat_) {
      comm_.all_reduce(b.flat, /*average=*/true, what);
    } else {  // the parameters' own gradients, in place, as one collective
      std::vector<Tensor> grads;
      for (size_t k : b.params) grads.push_back(params_[k].second.grad());
      if (beside)
        comm_.all_reduce_beside(grads, /*average=*/true, what);
      else
        comm_.all_reduce_many(grads, /*average=*/true, what);
    }
    b.launched = true;
    if (in_backward) ++stats_.launched_in_backward;
    ++next_;
  }
}

void GradSync::finish() {
  for (size_t bi = next_; bi < buckets_.size(); ++bi)
    for (size_t k : buckets_[bi].params)
      if (!filled_[k]) {  // no gradient this step: contribute zeros
        const auto [b, off] = where_[k];
        Var& p = params_[k].second;
        if (flat_)
          buckets_[b].flat.narrow(0, off, p.value().numel()).zero_();
        else
          p.set_grad(Tensor::zeros(p.shape(), p.value().dtype(), p.value().device()));
        filled_[k] = true;
        ++buckets_[b].ready;
      }
  launch_ready_prefix(false);
  if (beside_) comm_.finish_beside();  // Note [Copy-engine gradient reduction]
  comm_.wait();
  if (shard_ || !flat_) return;
  for (size_t k = 0; k < params_.size(); ++k) {
    const auto [bi, off] = where_[k];
    Var& p = params_[k].second;
    p.set_grad(buckets_[bi].flat.narrow(0, off, p.value().numel()).reshape(p.shape()));
  }
}

}  // namespace ffn::train
