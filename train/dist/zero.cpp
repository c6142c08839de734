// train/dist/zero.cpp — ZeRO-1's parameter ownership, parameter broadcast and checkpoint
// gather (train/dist/zero.h, Note [ZeRO-1]).
#include "train/dist/zero.h"

#include <algorithm>
#include <map>
#include <numeric>

namespace ffn::train {

std::vector<int> zero_owners(const std::vector<std::pair<std::string, Var>>& params, int world) {
  FFN_CHECK(world >= 1, "[zero] world must be >= 1, got ", world);
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), 0);
  // Largest first; ties in registration order (stable), so the result depends on shapes only.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return params[a].second.value().numel() > params[b].second.value().numel();
  });
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  std::vector<int> owner(params.size(), 0);
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = r;
    load[static_cast<size_t>(r)] += params[i].second.value().numel();
  }
  return owner;
}

namespace {
// Copies `ts` into `flat` back to back (pack) or `flat` into `ts` (unpack).
void pack(const std::vector<Tensor>& ts, Tensor& flat) {
  int64_t off = 0;
  for (const Tensor& t : ts) {
    flat.narrow(0, off, t.numel()).copy_(t.reshape({t.numel()}));
    off += t.numel();
  }
}
void unpack(const Tensor& flat, std::vector<Tensor>& ts) {
  int64_t off = 0;
  for (Tensor& t : ts) {
    Tensor view = t.reshape({t.numel()});  // contiguous parameters and state: a view
    view.copy_(flat.narrow(0, off, t.numel()));
    off += t.numel();
  }
}
}  // namespace

ZeroShards::ZeroShards(std::vector<std::pair<std::string, Var>> params, std::vector<int> owners,
                       Comm& comm)
    : params_(std::move(params)), owners_(std::move(owners)), comm_(comm) {
  FFN_CHECK(owners_.size() == params_.size(), "[zero] ", owners_.size(), " owners for ",
            params_.size(), " parameters");
  for (int r = 0; r < comm_.world(); ++r) {
    std::map<DType, Group> by_dtype;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (owners_[i] != r) continue;
      const Tensor& v = params_[i].second.value();
      FFN_CHECK(v.is_contiguous(), "[zero] parameter ", params_[i].first, " is not contiguous");
      Group& g = by_dtype[v.dtype()];
      g.owner = r;
      g.params.push_back(i);
    }
    for (auto& [dt, g] : by_dtype) {
      int64_t n = 0;
      for (size_t i : g.params) n += params_[i].second.value().numel();
      g.buffer = Tensor::empty({n}, dt, params_[g.params[0]].second.value().device());
      groups_.push_back(std::move(g));
    }
  }
}

int64_t ZeroShards::owned_numel() const {
  int64_t n = 0;
  for (size_t i = 0; i < params_.size(); ++i)
    if (owners_[i] == comm_.rank()) n += params_[i].second.value().numel();
  return n;
}

void ZeroShards::broadcast_params() {
  auto values = [&](const Group& g) {
    std::vector<Tensor> ts;
    for (size_t i : g.params) ts.push_back(params_[i].second.value());
    return ts;
  };
  for (Group& g : groups_)
    if (g.owner == comm_.rank()) pack(values(g), g.buffer);
  for (Group& g : groups_) comm_.broadcast(g.buffer, g.owner, "ZeRO-1 parameters");
  comm_.wait();
  for (Group& g : groups_)
    if (g.owner != comm_.rank()) {
      std::vector<Tensor> ts = values(g);
      unpack(g.buffer, ts);
    }
}

NamedTensors ZeroShards::gather_state(const NamedTensors& local) {
  // What AdamW::state() holds for parameter i (Note [Master weights]).
  struct Entry {
    std::string name;
    Tensor full;
  };
  std::map<std::string, Tensor> mine(local.begin(), local.end());
  std::vector<std::vector<Entry>> per_param(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& v = params_[i].second.value();
    const DType acc = acc_dtype(v.dtype());
    const std::string& n = params_[i].first;
    per_param[i] = {{n + ".exp_avg", Tensor::empty(v.shape(), acc, v.device())},
                    {n + ".exp_avg_sq", Tensor::empty(v.shape(), acc, v.device())}};
    if (is_half(v.dtype()))
      per_param[i].push_back({n + ".master", Tensor::empty(v.shape(), DType::f32, v.device())});
  }
  // One broadcast per owner and state dtype, in rank order.
  for (int r = 0; r < comm_.world(); ++r) {
    std::map<DType, std::vector<Entry*>> by_dtype;
    for (size_t i = 0; i < params_.size(); ++i)
      if (owners_[i] == r)
        for (Entry& e : per_param[i]) by_dtype[e.full.dtype()].push_back(&e);
    for (auto& [dt, entries] : by_dtype) {
      int64_t total = 0;
      for (const Entry* e : entries) total += e->full.numel();
      Tensor flat = Tensor::empty({total}, dt, entries[0]->full.device());
      std::vector<Tensor> ts;
      for (Entry* e : entries) {
        if (r == comm_.rank()) {
          auto it = mine.find(e->name);
          FFN_CHECK(it != mine.end(), "[zero] this rank owns '", e->name,
                    "' but its optimizer has no such state");
          e->full.copy_(it->second);
        }
        ts.push_back(e->full);
      }
      if (r == comm_.rank()) pack(ts, flat);
      comm_.broadcast(flat, r, "ZeRO-1 checkpoint gather");
      comm_.wait();
      if (r != comm_.rank()) unpack(flat, ts);
    }
  }
  NamedTensors out;
  for (auto& entries : per_param)
    for (Entry& e : entries) out.emplace_back(e.name, e.full);
  return out;
}

}  // namespace ffn::train
