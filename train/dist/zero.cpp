// train/dist/zero.cpp — ZeRO-1's slices, parameter all-gather and checkpoint gather/scatter
// (train/dist/zero.h, Note [ZeRO-1]).
#include "train/dist/zero.h"

#include <algorithm>
#include <map>

namespace ffn::train {

ZeroShards::ZeroShards(const GradSync& sync, std::vector<std::pair<std::string, Var>> params,
                       Comm& comm)
    : sync_(sync), params_(std::move(params)), comm_(comm) {
  const int64_t world = comm_.world(), rank = comm_.rank();
  for (size_t b = 0; b < sync_.buckets(); ++b) {
    const Tensor& g = sync_.flat(b);
    FFN_CHECK(g.numel() % world == 0, "[zero] bucket ", b, " has ", g.numel(),
              " elements, not a multiple of the world ", world, " (GradSync without shard?)");
    flat_params_.push_back(Tensor::zeros({g.numel()}, g.dtype(), g.device()));
    order_.push_back(b);
  }
  std::stable_sort(order_.begin(), order_.end(), [&](size_t a, size_t b) {
    return flat_params_[a].numel() > flat_params_[b].numel();
  });
  for (size_t b : order_) {
    const Tensor& g = sync_.flat(b);
    const int64_t chunk = g.numel() / world, lo = rank * chunk, hi = lo + chunk;
    for (size_t k : sync_.bucket_params(b)) {
      const int64_t off = sync_.where(k).second, n = params_[k].second.value().numel();
      const int64_t a = std::max(lo, off), e = std::min(hi, off + n);
      if (a >= e) continue;
      Slice s{k, b, a, a - off, e - a, ""};
      s.name = params_[k].first + "[" + std::to_string(s.from) + ":" +
               std::to_string(s.from + s.n) + "]";
      slices_.push_back(s);
    }
  }
  load_params();
  for (const Slice& s : slices_)
    slice_vars_.emplace_back(s.name, Var(flat_params_[s.bucket].narrow(0, s.at, s.n),
                                         /*requires_grad=*/true, s.name));
}

std::vector<bool> ZeroShards::decay(bool decay_matrices_only) const {
  std::vector<bool> out;
  for (const Slice& s : slices_)
    out.push_back(!decay_matrices_only || params_[s.param].second.value().dim() >= 2);
  return out;
}

int64_t ZeroShards::owned_numel() const {
  int64_t n = 0;
  for (const Slice& s : slices_) n += s.n;
  return n;
}

void ZeroShards::load_params() {
  for (size_t k = 0; k < params_.size(); ++k) {
    const auto [b, off] = sync_.where(k);
    const Tensor& v = params_[k].second.value();
    FFN_CHECK(v.is_contiguous(), "[zero] parameter ", params_[k].first, " is not contiguous");
    flat_params_[b].narrow(0, off, v.numel()).copy_(v.reshape({v.numel()}));
  }
}

void ZeroShards::bind_grads() {
  for (size_t i = 0; i < slices_.size(); ++i) {
    const Slice& s = slices_[i];
    slice_vars_[i].second.set_grad(sync_.flat(s.bucket).narrow(0, s.at, s.n));
  }
}

std::vector<size_t> ZeroShards::groups() const {
  std::vector<size_t> out;
  for (size_t b : order_)
    out.push_back(static_cast<size_t>(
        std::count_if(slices_.begin(), slices_.end(), [&](const Slice& s) { return s.bucket == b; })));
  return out;
}

void ZeroShards::gather_bucket(size_t group) {
  const size_t b = order_.at(group);
  comm_.all_gather(flat_params_[b], "ZeRO-1 parameters " + std::to_string(b));
}

void ZeroShards::gather_params() {
  comm_.wait();
  for (size_t k = 0; k < params_.size(); ++k) {
    const auto [b, off] = sync_.where(k);
    Tensor v = params_[k].second.value().reshape({params_[k].second.value().numel()});
    v.copy_(flat_params_[b].narrow(0, off, v.numel()));
  }
}

std::vector<std::pair<std::string, DType>> ZeroShards::kinds(size_t param) const {
  const DType dt = params_[param].second.value().dtype(), acc = acc_dtype(dt);
  std::vector<std::pair<std::string, DType>> out{{".exp_avg", acc}, {".exp_avg_sq", acc}};
  if (is_half(dt)) out.emplace_back(".master", DType::f32);  // Note [Master weights]
  return out;
}

NamedTensors ZeroShards::state_templates() const {
  NamedTensors out;
  for (size_t k = 0; k < params_.size(); ++k) {
    const Tensor& v = params_[k].second.value();
    for (const auto& [suffix, dt] : kinds(k))
      // Zeros: a file fills the stored rows only; padded vocabulary rows have no gradient,
      // so their state stays zero (Note [Padded vocabulary]).
      out.emplace_back(params_[k].first + suffix, Tensor::zeros(v.shape(), dt, v.device()));
  }
  return out;
}

NamedTensors ZeroShards::gather_state(const NamedTensors& local) {
  const std::map<std::string, Tensor> mine(local.begin(), local.end());
  NamedTensors out = state_templates();
  std::map<std::string, Tensor> full(out.begin(), out.end());
  // One all-gather per bucket and state kind: this rank's slices in place, the others'
  // arriving in theirs; then each parameter's part of the flat buffer is its state.
  for (size_t b = 0; b < flat_params_.size(); ++b) {
    const std::vector<size_t>& ks = sync_.bucket_params(b);
    for (size_t j = 0; j < kinds(ks[0]).size(); ++j) {
      const auto [suffix, dt] = kinds(ks[0])[j];
      Tensor flat = Tensor::zeros({flat_params_[b].numel()}, dt, flat_params_[b].device());
      for (const Slice& s : slices_) {
        if (s.bucket != b) continue;
        auto it = mine.find(s.name + suffix);
        FFN_CHECK(it != mine.end(), "[zero] the optimizer has no state '", s.name + suffix, "'");
        flat.narrow(0, s.at, s.n).copy_(it->second);
      }
      comm_.all_gather(flat, "ZeRO-1 checkpoint gather");
      comm_.wait();
      for (size_t k : ks) {
        Tensor& dst = full.at(params_[k].first + suffix);
        dst.copy_(flat.narrow(0, sync_.where(k).second, dst.numel()).reshape(dst.shape()));
      }
    }
  }
  comm_.sync();  // the caller reads these on the host (Note [NCCL timeouts])
  return out;
}

void ZeroShards::scatter_state(const NamedTensors& full, const NamedTensors& local) const {
  const std::map<std::string, Tensor> src(full.begin(), full.end()), dst(local.begin(), local.end());
  for (const Slice& s : slices_)
    for (const auto& [suffix, dt] : kinds(s.param)) {
      auto from = src.find(params_[s.param].first + suffix);
      auto to = dst.find(s.name + suffix);
      FFN_CHECK(from != src.end() && to != dst.end(), "[zero] no state '",
                params_[s.param].first + suffix, "' to scatter");
      Tensor t = to->second;
      t.copy_(from->second.reshape({from->second.numel()}).narrow(0, s.from, s.n));
    }
}

}  // namespace ffn::train
