// layers/module.cpp — parameter registry and recursion over child modules.
#include "layers/module.h"

namespace ffn {

std::vector<std::pair<std::string, Var>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Var>> out = params_;
  for (const auto& [cname, child] : children_)
    for (auto& [pname, v] : child->named_parameters()) out.emplace_back(cname + "." + pname, v);
  return out;
}

std::vector<Var> Module::parameters() const {
  std::vector<Var> out;
  for (auto& [name, v] : named_parameters()) out.push_back(v);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Var& v : parameters()) n += v.value().numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad() {
  for (Var& v : parameters()) v.zero_grad();
}

void Module::to(Device device, DType dtype) {
  for (auto& [name, v] : params_) {
    v.mutable_value() = v.value().to(dtype).to(device);
    v.zero_grad();
  }
  for (auto& [name, child] : children_) child->to(device, dtype);
}

Var& Module::register_parameter(const std::string& name, Tensor value) {
  for (auto& [n, v] : params_)
    FFN_CHECK(n != name, "[module] parameter '", name, "' registered twice");
  params_.emplace_back(name, Var(std::move(value), true, name));
  return params_.back().second;
}

void Module::register_module(const std::string& name, Module& child) {
  children_.emplace_back(name, &child);
}

}  // namespace ffn
