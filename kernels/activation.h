// kernels/activation.h — scalar activation math shared by the CPU references and
// the CUDA kernels (host/device), so both compute the same formulas.
//
//   gelu_erf(x)  = x/2 · (1 + erf(x/√2))  (float: x·Φ(x) by an erfc, Note [erfc GELU])
//   gelu_tanh(x) = x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³)))  (computed as x·σ(2u))
//   silu(x)      = x · σ(x)
//   identity(x)  = x       (bias + dropout without an activation)
// T is float or double; 16-bit inputs are converted to float by the caller.
#pragma once

#include <cmath>
#include <string>
#include <type_traits>

#include "core/dtype.h"  // FFN_HD
#include "core/names.h"

namespace ffn {

enum class Activation : uint8_t { gelu_erf, gelu_tanh, silu, identity };
// Canonical names first; "gelu" (= gelu_erf, PyTorch's nn.GELU() default) and "swish" are
// aliases.
inline constexpr NameOf<Activation> kActivationNames[] = {
    {Activation::gelu_erf, "gelu_erf"}, {Activation::gelu_tanh, "gelu_tanh"},
    {Activation::silu, "silu"},         {Activation::identity, "identity"},
    {Activation::gelu_erf, "gelu"},     {Activation::silu, "swish"}};

inline const char* activation_name(Activation a) {
  return name_of(kActivationNames, a);
}
Activation parse_activation(const std::string& s);

namespace act_math {

// exp and a/b; on the GPU the float versions use the hardware units: ex2.approx and
// rcp.approx, as __expf (relative error ~2⁻²¹·(2 + 1.2|x|)) and __fdividef (2 ulp) do, but
// in their .ftz forms: without it each call also carries the denormal range fix-ups (a
// compare and two predicated multiplies per exp, four more instructions per reciprocal),
// which the activation warpgroups of the fused GEMM spend their time on (Note [Activation
// warpgroup]). A result below 2⁻¹²⁶ (an exp of x < -87, a quotient by more than 2¹²⁶)
// becomes 0. Every use below is a sigmoid 1/(1 + e) or an erfc tail, where the errors stay
// relative.
FFN_HD float exp_(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.44269504088896340736f));
  return y;
#else
  return expf(x);
#endif
}
FFN_HD double exp_(double x) {
  return exp(x);
}
FFN_HD float div_(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
  return a * r;
#else
  return a / b;
#endif
}
FFN_HD double div_(double a, double b) {
  return a / b;
}
// div_(a, b) given r = div_(1, b): on the GPU that is a times the same reciprocal, so a·r is
// bit for bit div_(a, b), with one reciprocal where two calls of the asm made two (ptxas does
// not merge them); elsewhere a / b.
FFN_HD float div_shared(float a, float b, float r) {
#if defined(__CUDA_ARCH__)
  (void)b;
  return a * r;
#else
  (void)r;
  return a / b;
#endif
}
FFN_HD double div_shared(double a, double b, double) {
  return a / b;
}

// Note [erfc GELU]: gelu_erf in float is x·Φ(x) with Φ(-|x|) = erfc(a)/2, a = |x|/√2, from
// Numerical Recipes' erfc: t = 1/(1 + a/2), erfc(a) = t·exp(-a² + P(t)) with a degree-9 P
// (fractional error < 1.2e-7 for every a ≥ 0). Against 0.5·x·(1 + erff(x/√2)) it has no
// cancellation for negative x and costs about two thirds of the instructions. It is evaluated
// in base 2: with s = |x|·√(log2(e)/2) (so s² = a²·log2(e) = x²·log2(e)/2),
// t = 1/(1 + s/(2√log2(e))) and P' = log2(e)·P − 1 (the coefficients scaled, the factor 1/2
// folded in), Φ(-|x|) = t·2^(P'(t) − s²): one reciprocal, nine FMAs, one ex2 with no scaling
// multiply, and the derivative's pdf φ(x) = 2^(−s²)/√(2π) shares s². Against the base-e form
// (ex2 of a scaled argument, 0.5·t, pdf from its own x²): 91.6M → 85.0M warp instructions in
// gpt2_small's fc1 backward activation GEMM (ncu), fc1's activation GEMMs 0.163 → 0.158 ms
// forward and 0.212 → 0.203 backward (ffn-bench --act-epilogues, H200, session 24, alternated
// twice, before s² was made non-contracted: the forward is one instruction longer than that,
// not re-timed); the same accuracy (largest relative error of Φ and of the derivative over
// |x| < 12 within 20% of the base-e form's in an fp32 model of both). This is what the fused
// GEMM's activation warpgroups spend their time on (Note [Activation warpgroup]). CPU
// reference, unfused kernels and GEMM epilogues all call these functions, so fused and
// unfused outputs stay bit-identical. double: 0.5·erfc(-x/√2) and exp(-x²/2).
FFN_HD float ex2_(float x) {  // 2^x (ex2.approx.ftz on the GPU, as exp_)
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}
// Note [erfc GELU for 16-bit outputs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A kernel that stores bf16 or f16 rounds every output to 8 or 11 significant bits, so the
// 1e-7 of Note [erfc GELU]'s degree-9 P is spent on digits the rounding throws away. For
// 16-bit storage Φ(−|x|) = t·R(t)·2^(−s²) with t = 1/(1 + 0.36·s) and a degree-5 polynomial
// R (a minimax fit of Φ(−|x|)·2^(s²)/t over |x| ≤ 12, relative error, session 33): the
// largest relative error of Φ(−|x|) is 3.1e-6 in double and 1.5e-5 evaluated in float (an
// fp32 model; the degree-9 form: 1.1e-7 and 1.4e-5), the derivative's relative to
// max(|g|, 0.01) 7.4e-5 (session 25's form: 3.4e-5 and 6.1e-4), against half an ulp of 2^-9
// (bf16) and 2^-12 (f16 near 1). 2^(−s²) is the pdf's factor as well (φ(x) = 2^(−s²)/√(2π)), so the
// backward's value and derivative take one ex2 and one reciprocal an element: one MUFU
// operation fewer than Note [erfc GELU]'s form, whose tail is t·2^(P'(t) − s²) (session 25's
// short form was that, with a degree-5 P'), and the ex2 leaves the longest dependency chain
// (reciprocal, polynomial, two products) of the activation warpgroups (Note [Activation
// warpgroup]). Measured (H100, session 33, ffn-bench --act-epilogues, alternated three times,
// ms): gpt2's fc1 backward with db1 0.228, 0.232, 0.232 -> 0.225, 0.226, 0.226; its forward
// unchanged within the rounds' drift (0.162-0.171 -> 0.156-0.172); welder_fc2 (f16)
// 1.424, 1.423 -> 1.421, 1.415. Which form a kernel uses is its storage type's
// (act_math::value<S> and friends, S the stored type): every GPU kernel that stores 16-bit
// activations, fused or not, takes the short one, so fused and unfused outputs stay
// bit-identical; f32 and f64 storage (the CPU references, the f32 GPU kernels) keep the
// degree-9 form, so those stay bit-identical to each other.
// tests/kernels/test_bias_act_dropout.cpp checks both forms' errors on a grid.
//
// The degree-9 form (Note [erfc GELU]): Φ(-|x|), and s2 = x²·log2(e)/2. s² is a product that
// is never contracted into an FMA (in either form), so the value is the same bits whether or
// not the caller also uses s2 (left to the compiler, P' − s² became one FMA where s² had no
// other use and not where the pdf used it too: the forward's hd and the backward's
// recomputed hd differed in the last bit).
FFN_HD float erfc_half_tail(float x, float& s2) {
  const float s = fabsf(x) * 0.8493218003f;
  const float t = div_(1.0f, fmaf(0.4162773056f, s, 1.0f));
  float p = 0.246517298f;
  p = fmaf(p, t, -1.18611495f);
  p = fmaf(p, t, 2.14747446f);
  p = fmaf(p, t, -1.63775315f);
  p = fmaf(p, t, 0.402321582f);
  p = fmaf(p, t, -0.26875686f);
  p = fmaf(p, t, 0.139630057f);
  p = fmaf(p, t, 0.539700616f);
  p = fmaf(p, t, 1.4427292f);
  p = fmaf(p, t, -2.82574822f);
#if defined(__CUDA_ARCH__)
  s2 = __fmul_rn(s, s);
#else
  s2 = s * s;  // host code is built with -ffp-contract=off
#endif
  return t * ex2_(p - s2);
}
// The 16-bit form: Φ(-|x|), and g = 2^(−s²) (the pdf's factor).
FFN_HD float erfc_half_tail_short(float x, float& g) {
  const float s = fabsf(x) * 0.8493218003f;
  const float t = div_(1.0f, fmaf(0.36f, s, 1.0f));
  float r = -0.0772995576f;
  r = fmaf(r, t, 0.2007971704f);
  r = fmaf(r, t, -0.0035128165f);
  r = fmaf(r, t, 0.1407784820f);
  r = fmaf(r, t, 0.1169192046f);
  r = fmaf(r, t, 0.1223163307f);
#if defined(__CUDA_ARCH__)
  g = ex2_(-__fmul_rn(s, s));
#else
  g = ex2_(-(s * s));
#endif
  return (t * r) * g;
}
template <bool kShort = false>
FFN_HD float gelu_erf_cdf(float x) {  // Φ(x)
  float q;
  if constexpr (kShort) {
    float g;
    q = erfc_half_tail_short(x, g);
  } else {
    float s2;
    q = erfc_half_tail(x, s2);
  }
  return x < 0.0f ? q : 1.0f - q;
}
template <bool kShort = false>
FFN_HD double gelu_erf_cdf(double x) {
  return 0.5 * erfc(x * -0.70710678118654752440);
}
// Φ(x) and φ(x) = exp(-x²/2)/√(2π) together.
template <bool kShort = false>
FFN_HD void gelu_erf_cdf_pdf(float x, float& cdf, float& pdf) {
  float q, g;
  if constexpr (kShort) {
    q = erfc_half_tail_short(x, g);
  } else {
    float s2;
    q = erfc_half_tail(x, s2);
    g = ex2_(-s2);
  }
  cdf = x < 0.0f ? q : 1.0f - q;
  pdf = 0.3989422804f * g;
}
template <bool kShort = false>
FFN_HD void gelu_erf_cdf_pdf(double x, double& cdf, double& pdf) {
  cdf = gelu_erf_cdf(x);
  pdf = 0.39894228040143267794 * exp(-0.5 * x * x);
}

// Whether storage type S takes the short erfc (Note [erfc GELU for 16-bit outputs]): the
// 16-bit types; void (the default: store as computed) and wider types do not.
template <class S>
FFN_HD constexpr bool short_erfc() {
  if constexpr (std::is_void_v<S>)
    return false;
  else
    return sizeof(S) == 2;
}

// gelu_tanh(x) = x/2·(1 + tanh(u)) = x·σ(2u), u = √(2/π)·(x + 0.044715·x³): the sigmoid
// form has no cancellation for negative x and costs one exp.
//
// Note [tanh GELU in base 2]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// In float, e = exp(−2u) is 2^(x·(A + B·x²)) with A = −2k·log2(e), B = −2kc·log2(e)
// (k = √(2/π), c = 0.044715): x², one FMA, one multiply and ex2, where the plain form took
// c·x, ·x, an FMA, the ·(−2k) and exp_'s ·log2(e), two instructions more before the ex2; and
// the derivative σ + x·σ(1 − σ)·2k(1 + 3c·x²) is fma(x·(C + D·x²), σ − σ², σ) with C = 2k,
// D = 6kc and σ − σ² = fma(−σ, σ, σ) (one rounding of the exact value), four instructions
// where it took eight. This is the work the fused GEMM's activation warpgroups are bound by
// (Note [Activation warpgroup]; ffn_d1024's and ffn_d4096's FFN use this activation). The
// value and derivative take the same e and σ in value, grad and value_grad, so the recomputed
// hd stays bit for bit the forward's. double keeps the textbook form.
namespace tanh_gelu {
constexpr float kA = -2.0f * 0.79788456080286535588f * 1.44269504088896340736f;
constexpr float kB = -2.0f * 0.79788456080286535588f * 0.044715f * 1.44269504088896340736f;
constexpr float kC = 2.0f * 0.79788456080286535588f;
constexpr float kD = 6.0f * 0.79788456080286535588f * 0.044715f;
FFN_HD float e(float x, float x2) {  // exp(−2u)
  return ex2_(x * fmaf(kB, x2, kA));
}
FFN_HD float grad(float x, float x2, float s) {  // from σ(2u) = s
  return fmaf(x * fmaf(kD, x2, kC), fmaf(-s, s, s), s);
}
}  // namespace tanh_gelu
// S (Note [erfc GELU for 16-bit outputs]): the type the caller stores the result as; void
// (the default) for T itself.
template <class S = void, class T>
FFN_HD T value(T x, Activation a) {
  switch (a) {
    case Activation::gelu_erf:
      return x * gelu_erf_cdf<short_erfc<S>()>(x);
    case Activation::gelu_tanh: {
      if constexpr (std::is_same_v<T, float>) {  // Note [tanh GELU in base 2]
        return div_(x, 1.0f + tanh_gelu::e(x, x * x));
      } else {
        const T u = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
        return div_(x, T(1) + exp_(T(-2) * u));
      }
    }
    case Activation::silu:
      return div_(x, T(1) + exp_(-x));
    case Activation::identity:
      return x;
  }
  return x;
}

// d value / dx
template <class S = void, class T>
FFN_HD T grad(T x, Activation a) {
  switch (a) {
    case Activation::gelu_erf: {
      T cdf, pdf;
      gelu_erf_cdf_pdf<short_erfc<S>()>(x, cdf, pdf);
      return cdf + x * pdf;
    }
    case Activation::gelu_tanh: {
      if constexpr (std::is_same_v<T, float>) {  // Note [tanh GELU in base 2]
        const float x2 = x * x;
        return tanh_gelu::grad(x, x2, div_(1.0f, 1.0f + tanh_gelu::e(x, x2)));
      } else {
        const T k = T(0.79788456080286535588), c = T(0.044715);
        const T s = div_(T(1), T(1) + exp_(T(-2) * k * (x + c * x * x * x)));  // σ(2u)
        return s + x * s * (T(1) - s) * T(2) * k * (T(1) + T(3) * c * x * x);
      }
    }
    case Activation::silu: {
      const T s = div_(T(1), T(1) + exp_(-x));
      return s * (T(1) + x * (T(1) - s));
    }
    case Activation::identity:
      return T(1);
  }
  return T(1);
}

// value and grad together (backward kernels recompute the forward for dW2): the
// sigmoid or erf is evaluated once. Same formulas as value() and grad().
template <class S = void, class T>
FFN_HD void value_grad(T x, Activation a, T& v, T& g) {
  switch (a) {
    case Activation::gelu_erf: {
      T cdf, pdf;
      gelu_erf_cdf_pdf<short_erfc<S>()>(x, cdf, pdf);
      v = x * cdf;
      g = cdf + x * pdf;
      return;
    }
    case Activation::gelu_tanh: {
      if constexpr (std::is_same_v<T, float>) {  // Note [tanh GELU in base 2]
        const float x2 = x * x, e = tanh_gelu::e(x, x2), s = div_(1.0f, 1.0f + e);
        v = div_shared(x, 1.0f + e, s);
        g = tanh_gelu::grad(x, x2, s);
      } else {
        const T k = T(0.79788456080286535588), c = T(0.044715);
        const T e = exp_(T(-2) * k * (x + c * x * x * x));
        const T s = div_(T(1), T(1) + e);
        v = div_shared(x, T(1) + e, s);
        g = s + x * s * (T(1) - s) * T(2) * k * (T(1) + T(3) * c * x * x);
      }
      return;
    }
    case Activation::silu: {
      const T e = exp_(-x);
      const T s = div_(T(1), T(1) + e);
      v = div_shared(x, T(1) + e, s);
      g = s * (T(1) + x * (T(1) - s));
      return;
    }
    case Activation::identity:
      break;
  }
  v = x;
  g = T(1);
}

}  // namespace act_math
}  // namespace ffn
