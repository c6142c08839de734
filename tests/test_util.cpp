// tests/test_util.cpp — scratch directories and files, comparisons and the finite-difference
// gradient check.
#include "tests/test_util.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

namespace ffn::test {

std::filesystem::path temp_dir(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path p =
      fs::temp_directory_path() / ("ffn-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool gpu_available() {
  static const bool ok = cuda_device_count() > 0;
  return ok;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector()) m = std::max(m, std::fabs(v));
  return m;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const auto va = a.to_vector(), vb = b.to_vector();
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::fabs(va[i] - vb[i]));
  return m;
}

double rel_l2(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const auto va = a.to_vector(), vb = b.to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    num += (va[i] - vb[i]) * (va[i] - vb[i]);
    den += vb[i] * vb[i];
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return std::sqrt(num / den);
}

void check_column_sums(const Tensor& db, const Tensor& d, const std::string& what) {
  const Tensor d2 = d.to(Device::cpu()).to(DType::f64).view_2d();
  const std::vector<double> v = d2.to_vector();
  const std::vector<double> got = db.to(Device::cpu()).to(DType::f64).to_vector();
  const int64_t rows = d2.size(0), w = d2.size(1);
  REQUIRE(static_cast<int64_t>(got.size()) == w);
  const double u = db.dtype() == DType::bf16 ? std::ldexp(1.0, -8)
                   : db.dtype() == DType::f16 ? std::ldexp(1.0, -11)
                                              : 1e-15;
  double worst = 0;
  for (int64_t c = 0; c < w; ++c) {
    double sum = 0, abs = 0;
    for (int64_t r = 0; r < rows; ++r) sum += v[r * w + c], abs += std::abs(v[r * w + c]);
    const double tol = u * std::abs(sum) + std::ldexp(1.0, -22) * abs + 1e-12;
    worst = std::max(worst, std::abs(got[c] - sum) / tol);
  }
  CHECK_MESSAGE(worst <= 1.0, what, ": column sums vs f64 sums of the rows, worst error/tol ",
                worst);
}

void check_against_reference(const Tensor& gpu, const Tensor& ref64, const Tensor& naive32,
                             DType dt, const std::string& what, const RefRule& rule) {
  const Tensor g = gpu.to(Device::cpu()).to(DType::f64);
  for (double v : g.to_vector()) REQUIRE_MESSAGE(!std::isnan(v), what, ": NaN in GPU output");
  const double scale = std::max(max_abs(ref64), rule.scale);
  if (dt == DType::f32) {
    const double atol = std::max(1.0, rule.reduce_len) * std::ldexp(1.0, -23) * rule.term_bound +
                        1e-6 * scale;
    check_close(g, ref64, atol, rule.rtol32, what);
    return;
  }
  const double naive_err = max_abs_diff(naive32.to(dt).to(DType::f64), ref64);
  const double err = max_abs_diff(g, ref64);
  CHECK_MESSAGE(err <= rule.factor16 * naive_err + 1e-6 * scale, what, " ", dtype_name(dt),
                ": gpu error ", err, " vs naive error ", naive_err, " (x", rule.factor16,
                " allowed)");
}

void check_close(const Tensor& actual, const Tensor& expected, double atol, double rtol,
                 const std::string& what) {
  REQUIRE_MESSAGE(actual.shape() == expected.shape(), what, ": shape ", shape_str(actual.shape()),
                  " vs ", shape_str(expected.shape()));
  const auto va = actual.to_vector(), ve = expected.to_vector();
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    const double lim = atol + rtol * std::fabs(ve[i]);
    const double err = std::fabs(va[i] - ve[i]);
    if (!(err <= lim)) {  // also catches NaN
      ++bad;
      const double excess = std::isnan(err) ? INFINITY : err - lim;
      if (worst < 0 || excess > worst_excess)
        worst = static_cast<int64_t>(i), worst_excess = excess;
    }
  }
  if (bad) {
    std::ostringstream os;
    os << what << ": " << bad << " of " << va.size() << " entries out of tolerance (atol " << atol
       << ", rtol " << rtol << "); worst at flat index " << worst << ": got " << va[worst]
       << ", expected " << ve[worst];
    FAIL_CHECK(os.str());
  }
}

Tensor rand64(const Shape& shape, Generator& g, double scale) {
  return Tensor::uniform(shape, g, -scale, scale, DType::f64);
}

int64_t gradcheck(const std::function<Var(const std::vector<Var>&)>& f,
                  const std::vector<Tensor>& inputs, const std::vector<std::string>& names,
                  const GradcheckOptions& opt, const std::vector<bool>& wrt) {
  REQUIRE(names.size() == inputs.size());
  std::vector<Var> vars;
  for (size_t i = 0; i < inputs.size(); ++i) {
    REQUIRE(inputs[i].dtype() == DType::f64);
    vars.emplace_back(inputs[i].clone(), wrt.empty() || wrt[i], names[i]);
  }
  return gradcheck_vars([&]() { return f(vars); }, vars, opt);
}

int64_t gradcheck_vars(const std::function<Var()>& f, std::vector<Var> vars,
                       const GradcheckOptions& opt) {
  for (Var& v : vars) {
    REQUIRE(v.value().dtype() == DType::f64);
    REQUIRE(v.value().is_contiguous());
    v.zero_grad();
  }
  Generator rng(opt.seed);
  const Var out = f();
  const Tensor gout = rand64(out.shape(), rng);
  out.backward(gout);
  const auto gvec = gout.to_vector();

  auto loss = [&]() {
    NoGradGuard ng;
    const auto y = f().value().to_vector();
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += gvec[i] * y[i];
    return s;
  };

  int64_t compared = 0;
  for (size_t k = 0; k < vars.size(); ++k) {
    if (!vars[k].requires_grad()) continue;
    const std::string& name = vars[k].name();
    Tensor& x = vars[k].mutable_value();
    double* p = x.data<double>();
    const int64_t n = x.numel();
    const Tensor& ga = vars[k].grad();
    REQUIRE_MESSAGE(ga.defined(), "no gradient reached input '", name, "'");
    const auto grad = ga.to_vector();

    std::vector<int64_t> idx;
    if (n <= opt.full_limit) {
      for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    } else {
      const Tensor pick =
          Tensor::uniform({opt.samples}, rng, 0.0, static_cast<double>(n), DType::f64);
      for (double v : pick.to_vector())
        idx.push_back(std::min<int64_t>(n - 1, static_cast<int64_t>(v)));
    }
    for (int64_t i : idx) {
      const double orig = p[i];
      p[i] = orig + opt.eps;
      const double lp = loss();
      p[i] = orig - opt.eps;
      const double lm = loss();
      p[i] = orig;
      const double num = (lp - lm) / (2 * opt.eps);
      const double ana = grad[i];
      ++compared;
      if (!(std::fabs(ana - num) <= opt.atol + opt.rtol * std::fabs(num))) {
        FAIL_CHECK("gradient of input '", name, "' ", shape_str(x.shape()), " at flat index ", i,
                   ": analytic ", ana, " vs numeric ", num);
        return compared;
      }
    }
    if (n > opt.full_limit) {
      const std::vector<double> orig(p, p + n);
      for (int d = 0; d < opt.directions; ++d) {
        const auto v = Tensor::uniform({n}, rng, -1.0, 1.0, DType::f64).to_vector();
        double dot = 0;
        for (int64_t i = 0; i < n; ++i) dot += grad[i] * (v[i] < 0 ? -1.0 : 1.0);
        for (int64_t i = 0; i < n; ++i) p[i] = orig[i] + opt.eps * (v[i] < 0 ? -1.0 : 1.0);
        const double lp = loss();
        for (int64_t i = 0; i < n; ++i) p[i] = orig[i] - opt.eps * (v[i] < 0 ? -1.0 : 1.0);
        const double lm = loss();
        for (int64_t i = 0; i < n; ++i) p[i] = orig[i];
        const double num = (lp - lm) / (2 * opt.eps);
        ++compared;
        const double tol = opt.atol * std::sqrt(static_cast<double>(n)) + opt.rtol * std::fabs(num);
        if (!(std::fabs(dot - num) <= tol)) {
          FAIL_CHECK("directional derivative of input '", name, "' ", shape_str(x.shape()),
                     ": analytic ", dot, " vs numeric ", num);
          return compared;
        }
      }
    }
  }
  return compared;
}

}  // namespace ffn::test
