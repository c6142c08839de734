// tests/test_util.h — shared helpers of the doctest suites: GPU gating, scratch directories
// and files, tensor comparisons and the finite-difference gradient check.
//
// Gradient-check rule (docs/design.md, PyTorch gradcheck's): CPU, fp64, central
// differences with eps = 1e-6; an analytic entry a passes against the numeric n
// when |a - n| <= atol + rtol·|n| with atol = 1e-5, rtol = 1e-3. Inputs with at
// most 4096 elements are checked entry by entry. Larger inputs are checked on
// 256 random entries plus 4 random directions v (entries ±1) comparing
// (L(x+εv) - L(x-εv))/2ε with ⟨∇L, v⟩; a directional sum of n terms carries
// n times the per-entry rounding, so its atol is scaled by √n.
// L is ⟨g, f(x)⟩ for a fixed random g, so every output entry is exercised.
#pragma once

#include <doctest/doctest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/generator.h"

namespace ffn::test {

bool gpu_available();

// An empty directory <tmp>/ffn-test-<name>-<pid> (removed first if it exists).
std::filesystem::path temp_dir(const std::string& name);
// A whole file's bytes ("" if it cannot be read).
std::string slurp(const std::filesystem::path& p);
// Skips a TEST_CASE visibly (doctest counts it as skipped) when no GPU is usable.
#define FFN_GPU_TEST(name) TEST_CASE(name* doctest::skip(!::ffn::test::gpu_available()))

// max |t| over all entries.
double max_abs(const Tensor& t);
// max |a - b| over all entries (shapes must match).
double max_abs_diff(const Tensor& a, const Tensor& b);
// ‖a - b‖₂ / ‖b‖₂ (0 when both are 0).
double rel_l2(const Tensor& a, const Tensor& b);
// Asserts |a - e| <= atol + rtol·|e| everywhere; reports the worst entry on failure.
void check_close(const Tensor& actual, const Tensor& expected, double atol, double rtol,
                 const std::string& what);

// The one rule for a CUDA kernel against its CPU reference (docs/design.md "Precision and
// tolerances"). `gpu` is the kernel's output, `ref64` the CPU reference in f64 on the same
// (rounded) inputs, `naive32` the CPU reference run in f32 on them. Never NaN, and:
//  * f32: |gpu - ref| <= atol + rtol32·|ref| with
//      atol = max(1, reduce_len)·2⁻²³·term_bound + 1e-6·max(max|ref|, scale):
//    the worst-case rounding of a sum of reduce_len terms each at most term_bound
//    (0 for elementwise outputs, which carry one rounding), plus a floor of 1e-6 of the
//    output's scale (`scale` for outputs that cancel to ~0 from large terms).
//  * bf16/f16: max|gpu - ref64| <= factor16·max|rounded(naive32) - ref64| + 1e-6·scale:
//    no worse than factor16 (2, flash-attention's rule) times the same math done naively
//    at that precision.
struct RefRule {
  double reduce_len = 1;
  double term_bound = 0;
  double scale = 0;
  double rtol32 = 1e-5;
  double factor16 = 2.0;
};
void check_against_reference(const Tensor& gpu, const Tensor& ref64, const Tensor& naive32,
                             DType dt, const std::string& what, const RefRule& rule = {});

// db against the f64 column sums of d ([..., n], the values as stored): sums of 16-bit (or
// f64) values accumulated in fp32 (f64 on the CPU) and rounded once to db's dtype, so within
// that rounding (u·|sum|, u = 2^-8 bf16, 2^-11 f16) and fp32's accumulation (2^-22·Σ|x|).
void check_column_sums(const Tensor& db, const Tensor& d, const std::string& what);

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  int64_t full_limit = 4096;
  int samples = 256;
  int directions = 4;
  uint64_t seed = 1234;
};

// Checks the gradients of f at `inputs` (f64 CPU tensors) w.r.t. every input whose
// `wrt` flag is set. f must be deterministic (rebuild dropout specs inside it).
// Returns the number of entries/directions compared.
int64_t gradcheck(const std::function<Var(const std::vector<Var>&)>& f,
                  const std::vector<Tensor>& inputs, const std::vector<std::string>& names,
                  const GradcheckOptions& opt = {}, const std::vector<bool>& wrt = {});

// Same check on existing leaf Vars (e.g. a layer's parameters plus its input); their
// values are perturbed in place and restored. Gradients of `vars` are reset first.
int64_t gradcheck_vars(const std::function<Var()>& f, std::vector<Var> vars,
                       const GradcheckOptions& opt = {});

// Random f64 tensor in [-1, 1) on the CPU.
Tensor rand64(const Shape& shape, Generator& g, double scale = 1.0);

}  // namespace ffn::test
