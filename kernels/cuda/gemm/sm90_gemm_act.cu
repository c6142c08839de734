// kernels/cuda/gemm/sm90_gemm_act.cu — the Hopper GEMM with the FFN's activation in its
// epilogue (kernels/cuda/gemm/sm90_gemm.h, Note [Activation epilogues]): fc1's forward and the
// dhd product of the backward, and the gated FFN's fc1 forward and dhd product (Note [GLU
// warpgroup]), each instantiated per activation.
#include "kernels/checks.h"  // check_dropout
#include "kernels/cuda/gemm/kernel.cuh"
#include "kernels/cuda/gemm/sm90_gemm.h"

namespace ffn::cuda {

namespace {

bool aligned16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// z (backward's input) and hd (an output) must match out: [m, n], out's dtype, contiguous and
// 16-byte aligned; b is an optional contiguous [n] of the same dtype on the same GPU.
void check_act_tensors(const char* what, const Tensor& out, const Tensor* z, const Tensor& hd,
                       const Tensor& b) {
  auto check = [&](const Tensor& t, const char* name) {
    FFN_CHECK(t.defined() && t.is_cuda() && t.dtype() == out.dtype() && t.shape() == out.shape() &&
                  t.is_contiguous() && aligned16(t),
              "[sm90_gemm] ", what, ": ", name, " must be a contiguous, 16-byte aligned ",
              shape_str(out.shape()), " ", dtype_name(out.dtype()), " tensor on the GPU, got ",
              t.defined() ? shape_str(t.shape()) : std::string("none"), " ",
              t.defined() ? dtype_name(t.dtype()) : "");
  };
  if (z) check(*z, "z");
  check(hd, "hd");
  if (b.defined())
    FFN_CHECK(b.is_cuda() && b.dtype() == out.dtype() && b.dim() == 1 &&
                  b.size(0) == out.size(1) && b.is_contiguous() && aligned16(b),
              "[sm90_gemm] ", what, ": the bias must be a contiguous, 16-byte aligned [",
              out.size(1), "] ", dtype_name(out.dtype()), " tensor, got ", shape_str(b.shape()),
              " ", dtype_name(b.dtype()));
}

// db = the column sums of the per-128-row-tile partials [tiles_m, n] (fp32), summed in a fixed
// order as Note [Deterministic column sums]' stage 2.
template <class T>
void sum_partials(const Tensor& part, Tensor& db) {
  const int n = static_cast<int>(part.size(1));
  reduce_partials_kernel<float, T>
      <<<static_cast<unsigned>((n + 31) / 32), dim3(32, 8), 0, stream(db.device().index)>>>(
          static_cast<const float*>(part.data_ptr()), part.size(0), n,
          static_cast<T*>(db.data_ptr()));
  FFN_CHECK_CUDA(cudaGetLastError());
}

// The activation on warpgroups of its own (Note [Activation warpgroup]; automatic too), or
// with the cooperative and ping-pong schedules on the consumers' accumulators (ActTma, Note
// [Activation epilogues]). Never split: these products fill the GPU.
template <bool kBackward>
void run_act(const Tensor& a, const Tensor& b, Tensor& out, Tensor& hd, const Tensor* z,
             const Tensor& bias, Activation act, const DropoutSpec& d, Sm90Schedule schedule,
             Tensor* db = nullptr) {
  gemm::Tiling t;
  t.pingpong = schedule == Sm90Schedule::pingpong;
  t.bn = !t.pingpong && out.size(1) >= 256 ? 256 : 128;
  const int m = static_cast<int>(out.size(0)), n = static_cast<int>(out.size(1));
  auto typed = [&]<class T>() {
    const T* zp = z ? static_cast<const T*>(z->data_ptr()) : nullptr;
    const T* bp = bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr;
    auto go = [&]<Activation A>() {
      if (schedule == Sm90Schedule::automatic || schedule == Sm90Schedule::act_warpgroups) {
        Tensor part;
        if (db) part = Tensor::empty({(m + 127) / 128, n}, DType::f32, out.device());
        gemm::launch_act<T, A, kBackward>(a, b, out, hd, z, bp, DeviceMask::from(d),
                                          db ? static_cast<float*>(part.data_ptr()) : nullptr);
        if (db) sum_partials<T>(part, *db);
        return;
      }
      const gemm::ActTma<T, A, kBackward> epi{zp, bp, m, n};
      gemm::launch_tiling<T, false, kBackward>(a, b, out, epi, t, &hd);
    };
    switch (act) {
      case Activation::gelu_erf: go.template operator()<Activation::gelu_erf>(); break;
      case Activation::gelu_tanh: go.template operator()<Activation::gelu_tanh>(); break;
      case Activation::silu: go.template operator()<Activation::silu>(); break;
      default: FFN_THROW("[sm90_gemm] no activation epilogue for ", activation_name(act));
    }
  };
  if (out.dtype() == DType::bf16)
    typed.template operator()<__nv_bfloat16>();
  else
    typed.template operator()<__half>();
}

// Dropout runs only on the activation warpgroups (ActTma has no mask).
void check_act_dropout(const char* what, const DropoutSpec& d, Sm90Schedule schedule) {
  detail::check_dropout(d, "sm90_gemm");
  FFN_CHECK(!d.active() || schedule == Sm90Schedule::automatic ||
                schedule == Sm90Schedule::act_warpgroups,
            "[sm90_gemm] ", what, ": dropout (p = ", d.p,
            ") runs only with the act_warpgroups schedule");
}

}  // namespace

bool sm90_gemm_act_supported(const Tensor& a, const Tensor& b, bool backward, Activation act,
                             const Tensor& out) {
  if (act != Activation::gelu_erf && act != Activation::gelu_tanh && act != Activation::silu)
    return false;
  if (!sm90_gemm_supported(a, b, out, false, !backward)) return false;
  return out.size(1) % 8 == 0 && aligned16(out);
}

void sm90_gemm_nt_act(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                      const DropoutSpec& d, Tensor& z, Tensor& hd, Sm90Schedule schedule) {
  FFN_CHECK(sm90_gemm_act_supported(x, w, false, act, z), "[sm90_gemm] the activation forward ",
            "cannot run x ", shape_str(x.shape()), " ", dtype_name(x.dtype()), " · w ",
            shape_str(w.shape()), "ᵀ -> z ", shape_str(z.shape()), " with ", activation_name(act),
            " (sm90_gemm_act_supported says which operands it takes)");
  check_act_tensors("the activation forward", z, nullptr, hd, b);
  check_act_dropout("the activation forward", d, schedule);
  run_act<false>(x, w, z, hd, nullptr, b, act, d, schedule);
}

void sm90_gemm_nn_act_backward(const Tensor& dy, const Tensor& w, const Tensor& z, const Tensor& b,
                               Activation act, const DropoutSpec& d, Tensor& dz, Tensor& hd,
                               Sm90Schedule schedule, Tensor* db) {
  FFN_CHECK(sm90_gemm_act_supported(dy, w, true, act, dz), "[sm90_gemm] the activation backward ",
            "cannot run dy ", shape_str(dy.shape()), " ", dtype_name(dy.dtype()), " · w ",
            shape_str(w.shape()), " -> dz ", shape_str(dz.shape()), " with ",
            activation_name(act), " (sm90_gemm_act_supported says which operands it takes)");
  check_act_tensors("the activation backward", dz, &z, hd, b);
  check_act_dropout("the activation backward", d, schedule);
  if (db) {
    FFN_CHECK(schedule == Sm90Schedule::automatic || schedule == Sm90Schedule::act_warpgroups,
              "[sm90_gemm] the activation backward sums db only with the act_warpgroups schedule");
    FFN_CHECK(db->defined() && db->is_cuda() && db->dtype() == dz.dtype() && db->dim() == 1 &&
                  db->size(0) == dz.size(1) && db->is_contiguous(),
              "[sm90_gemm] the activation backward: db must be a contiguous [", dz.size(1), "] ",
              dtype_name(dz.dtype()), " tensor on the GPU, got ",
              db->defined() ? shape_str(db->shape()) : std::string("none"));
  }
  run_act<true>(dy, w, dz, hd, &z, b, act, d, schedule, db);
}

bool sm90_gemm_glu_supported(const Tensor& x, const Tensor& w, Activation act, const Tensor& z) {
  if (act != Activation::gelu_erf && act != Activation::gelu_tanh && act != Activation::silu)
    return false;
  if (!sm90_gemm_supported(x, w, z, false, true)) return false;
  return z.size(1) % 128 == 0 && aligned16(z);
}

void sm90_gemm_nt_glu(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                      const DropoutSpec& d, Tensor& z, Tensor& out) {
  FFN_CHECK(sm90_gemm_glu_supported(x, w, act, z), "[sm90_gemm] the GLU forward cannot run x ",
            shape_str(x.shape()), " ", dtype_name(x.dtype()), " · w ", shape_str(w.shape()),
            "ᵀ -> z ", shape_str(z.shape()), " with ", activation_name(act),
            " (sm90_gemm_glu_supported says which operands it takes)");
  detail::check_dropout(d, "sm90_gemm");
  const int64_t h = z.size(1) / 2;
  FFN_CHECK(out.defined() && out.is_cuda() && out.dtype() == z.dtype() && out.dim() == 2 &&
                out.size(0) == z.size(0) && out.size(1) == h && out.is_contiguous() &&
                aligned16(out),
            "[sm90_gemm] the GLU forward: out must be a contiguous, 16-byte aligned [", z.size(0),
            ", ", h, "] ", dtype_name(z.dtype()), " tensor on the GPU, got ",
            out.defined() ? shape_str(out.shape()) : std::string("none"));
  if (b.defined())
    FFN_CHECK(b.is_cuda() && b.dtype() == z.dtype() && b.dim() == 1 && b.size(0) == 2 * h &&
                  b.is_contiguous() && aligned16(b),
              "[sm90_gemm] the GLU forward: the bias must be a contiguous, 16-byte aligned [",
              2 * h, "] ", dtype_name(z.dtype()), " tensor, got ", shape_str(b.shape()));
  auto typed = [&]<class T>() {
    const T* bp = b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr;
    auto go = [&]<Activation A>() {
      gemm::launch_act<T, A, false, true>(x, w, z, out, nullptr, bp, DeviceMask::from(d));
    };
    switch (act) {
      case Activation::gelu_erf:
        go.template operator()<Activation::gelu_erf>();
        break;
      case Activation::gelu_tanh:
        go.template operator()<Activation::gelu_tanh>();
        break;
      case Activation::silu:
        go.template operator()<Activation::silu>();
        break;
      default:
        FFN_THROW("[sm90_gemm] no GLU epilogue for ", activation_name(act));
    }
  };
  if (z.dtype() == DType::bf16)
    typed.template operator()<__nv_bfloat16>();
  else
    typed.template operator()<__half>();
}

bool sm90_gemm_glu_backward_supported(const Tensor& dy, const Tensor& w, Activation act,
                                      const Tensor& out) {
  if (act != Activation::gelu_erf && act != Activation::gelu_tanh && act != Activation::silu)
    return false;
  if (!sm90_gemm_supported(dy, w, out, false, false)) return false;
  return out.size(1) % 8 == 0 && aligned16(out);
}

void sm90_gemm_nn_glu_backward(const Tensor& dy, const Tensor& w, const Tensor& z, const Tensor& b,
                               Activation act, const DropoutSpec& d, Tensor& dz, Tensor& out,
                               Tensor* db) {
  FFN_CHECK(sm90_gemm_glu_backward_supported(dy, w, act, out),
            "[sm90_gemm] the GLU backward cannot run dy ", shape_str(dy.shape()), " ",
            dtype_name(dy.dtype()), " · w ", shape_str(w.shape()), " -> out ",
            shape_str(out.shape()), " with ", activation_name(act),
            " (sm90_gemm_glu_backward_supported says which operands it takes)");
  detail::check_dropout(d, "sm90_gemm");
  const int64_t m = out.size(0), h = out.size(1);
  auto check = [&](const Tensor* t, const char* name, const Shape& shape) {
    FFN_CHECK(t->defined() && t->is_cuda() && t->dtype() == out.dtype() && t->shape() == shape &&
                  t->is_contiguous() && aligned16(*t),
              "[sm90_gemm] the GLU backward: ", name, " must be a contiguous, 16-byte aligned ",
              shape_str(shape), " ", dtype_name(out.dtype()), " tensor on the GPU, got ",
              t->defined() ? shape_str(t->shape()) : std::string("none"), " ",
              t->defined() ? dtype_name(t->dtype()) : "");
  };
  check(&z, "z", {m, 2 * h});
  check(&dz, "dz", {m, 2 * h});
  if (b.defined()) check(&b, "the bias", {2 * h});
  if (db) check(db, "db", {2 * h});
  auto typed = [&]<class T>() {
    const T* bp = b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr;
    Tensor part;
    if (db) part = Tensor::empty({(m + 127) / 128, 2 * h}, DType::f32, out.device());
    float* pp = db ? static_cast<float*>(part.data_ptr()) : nullptr;
    auto go = [&]<Activation A>() {
      gemm::launch_act<T, A, true, true>(dy, w, dz, out, &z, bp, DeviceMask::from(d), pp);
    };
    switch (act) {
      case Activation::gelu_erf:
        go.template operator()<Activation::gelu_erf>();
        break;
      case Activation::gelu_tanh:
        go.template operator()<Activation::gelu_tanh>();
        break;
      case Activation::silu:
        go.template operator()<Activation::silu>();
        break;
      default:
        FFN_THROW("[sm90_gemm] no GLU epilogue for ", activation_name(act));
    }
    if (db) sum_partials<T>(part, *db);
  };
  if (z.dtype() == DType::bf16)
    typed.template operator()<__nv_bfloat16>();
  else
    typed.template operator()<__half>();
}

}  // namespace ffn::cuda
