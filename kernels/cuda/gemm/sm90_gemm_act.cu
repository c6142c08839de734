// kernels/cuda/gemm/sm90_gemm_act.cu — the Hopper GEMM with the FFN's activation in its
// epilogue (kernels/cuda/gemm/sm90_gemm.h, Note [Activation epilogues]): fc1's forward and the
// dhd product of the backward, and the gated FFN's fc1 forward and dhd product (Note [GLU
// warpgroup]), each instantiated per activation.
#include "kernels/checks.h"  // check_dropout
#include "kernels/cuda/gemm/kernel.cuh"
#include "kernels/cuda/gemm/sm90_gemm.h"

#include <map>
#include <mutex>

namespace ffn::cuda {

namespace gemm {

UnitCounter unit_counter(int dev) {
  static std::mutex mu;
  static std::map<int, int*> counters;
  std::lock_guard<std::mutex> lock(mu);
  int*& c = counters[dev];
  if (!c) {
    check_not_capturing(dev, "the Hopper GEMM's first launch (it allocates its unit counter)");
    DeviceGuard guard(dev);
    FFN_CHECK_CUDA(cudaMalloc(&c, 2 * sizeof(int)));
    FFN_CHECK_CUDA(cudaMemsetAsync(c, 0, 2 * sizeof(int), stream(dev)));
  }
  return {c, c + 1};
}

}  // namespace gemm

namespace {

bool aligned16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// The activations the epilogues are instantiated for.
bool has_epilogue(Activation act) {
  return act == Activation::gelu_erf || act == Activation::gelu_tanh || act == Activation::silu;
}

// t must be a contiguous `shape` tensor of dtype dt on the GPU, 16-byte aligned where the
// kernel moves it in 16-byte chunks (align16).
void check_operand(const char* what, const Tensor& t, const char* name, const Shape& shape,
                   DType dt, bool align16 = true) {
  FFN_CHECK(t.defined() && t.is_cuda() && t.dtype() == dt && t.shape() == shape &&
                t.is_contiguous() && (!align16 || aligned16(t)),
            "[sm90_gemm] ", what, ": ", name, " must be a contiguous",
            align16 ? ", 16-byte aligned " : " ", shape_str(shape), " ", dtype_name(dt),
            " tensor on the GPU, got ", t.defined() ? shape_str(t.shape()) : std::string("none"),
            " ", t.defined() ? dtype_name(t.dtype()) : "");
}

// z (backward's input) and hd (an output) must match out: [m, n], out's dtype, contiguous and
// 16-byte aligned; b is an optional [n] of the same kind.
void check_act_tensors(const char* what, const Tensor& out, const Tensor* z, const Tensor& hd,
                       const Tensor& b) {
  if (z) check_operand(what, *z, "z", out.shape(), out.dtype());
  check_operand(what, hd, "hd", out.shape(), out.dtype());
  if (b.defined()) check_operand(what, b, "the bias", {out.size(1)}, out.dtype());
}

// go.template operator()<T, A>() for the 16-bit element type dt and the activation act.
template <class F>
void dispatch(DType dt, Activation act, F&& go) {
  auto typed = [&]<class T>() {
    switch (act) {
      case Activation::gelu_erf:
        go.template operator()<T, Activation::gelu_erf>();
        break;
      case Activation::gelu_tanh:
        go.template operator()<T, Activation::gelu_tanh>();
        break;
      case Activation::silu:
        go.template operator()<T, Activation::silu>();
        break;
      default:
        FFN_THROW("[sm90_gemm] no activation epilogue for ", activation_name(act));
    }
  };
  if (dt == DType::bf16)
    typed.template operator()<__nv_bfloat16>();
  else
    typed.template operator()<__half>();
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
  dispatch(out.dtype(), act, [&]<class T, Activation A>() {
    const T* bp = bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr;
    if (schedule == Sm90Schedule::automatic || schedule == Sm90Schedule::act_warpgroups) {
      Tensor part;
      if (db) part = Tensor::empty({(m + 127) / 128, n}, DType::f32, out.device());
      gemm::launch_act<T, A, kBackward>(a, b, out, hd, z, bp, DeviceMask::from(d),
                                        db ? static_cast<float*>(part.data_ptr()) : nullptr);
      if (db) sum_partials<T>(part, *db);
      return;
    }
    const T* zp = z ? static_cast<const T*>(z->data_ptr()) : nullptr;
    const gemm::ActTma<T, A, kBackward> epi{zp, bp, m, n};
    gemm::launch_tiling<T, false, kBackward>(a, b, out, epi, t, &hd);
  });
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
  if (!has_epilogue(act)) return false;
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
    check_operand("the activation backward", *db, "db", {dz.size(1)}, dz.dtype(), false);
  }
  run_act<true>(dy, w, dz, hd, &z, b, act, d, schedule, db);
}

bool sm90_gemm_glu_supported(const Tensor& x, const Tensor& w, Activation act, const Tensor& z) {
  if (!has_epilogue(act)) return false;
  if (!sm90_gemm_supported(x, w, z, false, true)) return false;
  return z.size(1) % 128 == 0 && aligned16(z);
}

// The GLU kernels' optional row scale: f32 [m], contiguous, on z's GPU.
const float* row_scale_of(const char* what, const Tensor& s, int64_t m, const Tensor& z) {
  if (!s.defined()) return nullptr;
  FFN_CHECK(s.is_cuda() && s.device() == z.device() && s.dtype() == DType::f32 &&
                s.shape() == Shape{m} && s.is_contiguous(),
            "[sm90_gemm] ", what, ": row_scale must be a contiguous f32 [", m, "] tensor on ",
            z.device().str(), ", got ", s.desc());
  return static_cast<const float*>(s.data_ptr());
}

void sm90_gemm_nt_glu(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                      const DropoutSpec& d, Tensor& z, Tensor& out, const Tensor& row_scale) {
  FFN_CHECK(sm90_gemm_glu_supported(x, w, act, z), "[sm90_gemm] the GLU forward cannot run x ",
            shape_str(x.shape()), " ", dtype_name(x.dtype()), " · w ", shape_str(w.shape()),
            "ᵀ -> z ", shape_str(z.shape()), " with ", activation_name(act),
            " (sm90_gemm_glu_supported says which operands it takes)");
  detail::check_dropout(d, "sm90_gemm");
  const char* what = "the GLU forward";
  const int64_t h = z.size(1) / 2;
  check_operand(what, out, "out", {z.size(0), h}, z.dtype());
  if (b.defined()) check_operand(what, b, "the bias", {2 * h}, z.dtype());
  const float* rs = row_scale_of(what, row_scale, z.size(0), z);
  dispatch(z.dtype(), act, [&]<class T, Activation A>() {
    const T* bp = b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr;
    gemm::launch_act<T, A, false, true>(x, w, z, out, nullptr, bp, DeviceMask::from(d), nullptr,
                                        rs);
  });
}

bool sm90_gemm_glu_backward_supported(const Tensor& dy, const Tensor& w, Activation act,
                                      const Tensor& out) {
  if (!has_epilogue(act)) return false;
  if (!sm90_gemm_supported(dy, w, out, false, false)) return false;
  return out.size(1) % 8 == 0 && aligned16(out);
}

void sm90_gemm_nn_glu_backward(const Tensor& dy, const Tensor& w, const Tensor& z, const Tensor& b,
                               Activation act, const DropoutSpec& d, Tensor& dz, Tensor& out,
                               Tensor* db, const Tensor& row_scale) {
  FFN_CHECK(sm90_gemm_glu_backward_supported(dy, w, act, out),
            "[sm90_gemm] the GLU backward cannot run dy ", shape_str(dy.shape()), " ",
            dtype_name(dy.dtype()), " · w ", shape_str(w.shape()), " -> out ",
            shape_str(out.shape()), " with ", activation_name(act),
            " (sm90_gemm_glu_backward_supported says which operands it takes)");
  detail::check_dropout(d, "sm90_gemm");
  const char* what = "the GLU backward";
  const int64_t m = out.size(0), h = out.size(1);
  check_operand(what, z, "z", {m, 2 * h}, out.dtype());
  check_operand(what, dz, "dz", {m, 2 * h}, out.dtype());
  if (b.defined()) check_operand(what, b, "the bias", {2 * h}, out.dtype());
  if (db) check_operand(what, *db, "db", {2 * h}, out.dtype(), false);
  const float* rs = row_scale_of(what, row_scale, m, dz);
  FFN_CHECK(!rs || !db, "[sm90_gemm] ", what, ": db with a row_scale is not summed here (db is ",
            "Σ_rows of the unscaled dz)");
  Tensor part;
  if (db) part = Tensor::empty({(m + 127) / 128, 2 * h}, DType::f32, out.device());
  dispatch(out.dtype(), act, [&]<class T, Activation A>() {
    const T* bp = b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr;
    gemm::launch_act<T, A, true, true>(dy, w, dz, out, &z, bp, DeviceMask::from(d),
                                       db ? static_cast<float*>(part.data_ptr()) : nullptr, rs);
    if (db) sum_partials<T>(part, *db);
  });
}

}  // namespace ffn::cuda
