// kernels/gemm.cpp — front door of kernels/gemm.h: argument checks, then the
// CPU reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/; a CPU-only build links
// kernels/cuda_stub.cpp, which throws "built without CUDA").
#include "kernels/gemm.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/dispatch.h"
#include "core/names.h"
#include "kernels/activation.h"

namespace ffn {

namespace {
void validate(const Tensor& a, const Tensor& b, const Tensor& c, const GemmArgs& args) {
  check_defined(a, "gemm", "a");
  check_defined(b, "gemm", "b");
  check_defined(c, "gemm", "c");
  check_dim(a, 2, "gemm", "a");
  check_dim(b, 2, "gemm", "b");
  check_dim(c, 2, "gemm", "c");
  check_same_device(a, b, "gemm", "a", "b");
  check_same_device(a, c, "gemm", "a", "c");
  check_same_dtype(a, b, "gemm", "a", "b");
  FFN_CHECK(is_float(c.dtype()), "[gemm] needs a float dtype, got ", dtype_name(c.dtype()));
  const bool f32_out = c.dtype() == DType::f32 && is_half(a.dtype());
  if (f32_out) {
    FFN_CHECK(c.is_cuda() && !args.bias.defined() && args.epilogue == GemmEpilogue::none,
              "[gemm] an f32 c for ", dtype_name(a.dtype()),
              " a and b needs the GPU, no bias and no epilogue");
  } else {
    check_same_dtype(a, c, "gemm", "a", "c");
  }
  const int64_t m = args.trans_a ? a.size(1) : a.size(0);
  const int64_t k = args.trans_a ? a.size(0) : a.size(1);
  const int64_t kb = args.trans_b ? b.size(1) : b.size(0);
  const int64_t n = args.trans_b ? b.size(0) : b.size(1);
  FFN_CHECK(k == kb, "[gemm] inner dimensions differ: op(a) is [", m, ", ", k,
            "] (a.shape=", shape_str(a.shape()), (args.trans_a ? ", transposed" : ""),
            ") but op(b) is [", kb, ", ", n, "] (b.shape=", shape_str(b.shape()),
            (args.trans_b ? ", transposed" : ""), ")");
  FFN_CHECK(c.size(0) == m && c.size(1) == n, "[gemm] c.shape=", shape_str(c.shape()),
            " but op(a)·op(b) is [", m, ", ", n, "]");
  FFN_CHECK(c.is_contiguous(), "[gemm] c must be contiguous");
  auto check_vec = [&](const Tensor& t, const Shape& shape, const char* name) {
    check_shape(t, shape, "gemm", name);
    check_same_device(t, c, "gemm", name, "c");
    check_same_dtype(t, c, "gemm", name, "c");
    FFN_CHECK(t.is_contiguous(), "[gemm] ", name, " must be contiguous");
  };
  if (args.bias.defined()) check_vec(args.bias, {n}, "bias");
  switch (args.epilogue) {
    case GemmEpilogue::none:
      break;
    case GemmEpilogue::gelu_aux_bias:
    case GemmEpilogue::dgelu_bgrad:
      FFN_CHECK(args.beta == 0.0, "[gemm] the GELU epilogues need beta = 0, got ", args.beta);
      check_defined(args.aux, "gemm", "aux");
      check_vec(args.aux, {m, n}, "aux");
      if (args.epilogue == GemmEpilogue::dgelu_bgrad) {
        FFN_CHECK(!args.bias.defined(), "[gemm] dgelu_bgrad takes no bias");
        if (args.bias_grad.defined()) check_vec(args.bias_grad, {n}, "bias_grad");
      }
      break;
    case GemmEpilogue::bgrad_a:
      check_defined(args.bias_grad, "gemm", "bias_grad");
      check_vec(args.bias_grad, {m}, "bias_grad");
      break;
  }
}
}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args) {
  validate(a, b, c, args);
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  if (c.is_cuda()) {
    cuda::gemm(ac, bc, c, args);
    return;
  }
  cpu::gemm(ac, bc, c, args);
}

namespace {
std::atomic<int> g_autotune{-1};   // -1: not decided yet (read FFN_GEMM_TUNE)
std::atomic<int> g_epilogues{-1};  // -1: not decided yet (read FFN_GEMM_EPILOGUES)
std::atomic<int> g_dynamic_order{0};
std::atomic<int> g_multicast{-1};  // -1: not decided yet (read FFN_GEMM_MULTICAST)
std::atomic<int> g_dependent_launch{-1};  // -1: not decided yet (read FFN_GEMM_PDL)
std::atomic<int> g_norm_epilogue{-1};  // -1: not decided yet (read FFN_NORM_EPILOGUE)
std::atomic<int> g_rms_fold{-1};       // -1: not decided yet (read FFN_RMS_FOLD)
std::atomic<int> g_group_rows{-1};  // -1: not decided yet (read FFN_GEMM_GROUP_ROWS)

// A switch read from the environment once: on by default unless `name` is "0", or (on = false)
// off by default unless it is "1".
bool env_switch(std::atomic<int>& v, const char* name, bool on = true) {
  int x = v.load();
  if (x < 0) {
    const char* e = std::getenv(name);
    x = on ? !(e && std::strcmp(e, "0") == 0) : (e && std::strcmp(e, "1") == 0);
    v = x;
  }
  return x == 1;
}

constexpr NameOf<OwnGemm> kOwnGemmNames[] = {
    {OwnGemm::never, "never"}, {OwnGemm::tuned, "tuned"}, {OwnGemm::always, "always"}};
std::atomic<int> g_own{-1};  // -1: not decided yet (read FFN_OWN_GEMM)
}  // namespace

void set_own_gemm(OwnGemm mode) {
  g_own = static_cast<int>(mode);
}

OwnGemm own_gemm() {
  int x = g_own.load();
  if (x < 0) {
    const char* e = std::getenv("FFN_OWN_GEMM");
    const auto v = e ? value_of(kOwnGemmNames, e) : std::optional<OwnGemm>(OwnGemm::tuned);
    FFN_CHECK(v, "[gemm] FFN_OWN_GEMM must be ", names_list(kOwnGemmNames), ", got \"", e, "\"");
    x = static_cast<int>(*v);
    g_own = x;
  }
  return static_cast<OwnGemm>(x);
}

void set_gemm_epilogues(bool on) {
  g_epilogues = on ? 1 : 0;
}

bool gemm_epilogues() {
  return env_switch(g_epilogues, "FFN_GEMM_EPILOGUES");
}

void set_gemm_dynamic_order(bool on) {
  g_dynamic_order = on ? 1 : 0;
}

bool gemm_dynamic_order() {
  static const char* env = std::getenv("FFN_GEMM_DYNAMIC_ORDER");
  if (env) return std::strcmp(env, "0") != 0;
  return g_dynamic_order.load() == 1;
}

void set_gemm_multicast(bool on) {
  g_multicast = on ? 1 : 0;
}

bool gemm_multicast() {
  return env_switch(g_multicast, "FFN_GEMM_MULTICAST");
}

void set_gemm_dependent_launch(bool on) {
  g_dependent_launch = on ? 1 : 0;
}

bool gemm_dependent_launch() {
  return env_switch(g_dependent_launch, "FFN_GEMM_PDL");
}

void set_norm_epilogue(bool on) {
  g_norm_epilogue = on ? 1 : 0;
}

bool norm_epilogue() {  // off unless FFN_NORM_EPILOGUE=1 (measured slower: kernels/gemm.h)
  return env_switch(g_norm_epilogue, "FFN_NORM_EPILOGUE", /*on=*/false);
}

void set_rms_fold(bool on) {
  g_rms_fold = on ? 1 : 0;
}

bool rms_fold() {  // off unless FFN_RMS_FOLD=1 (measured slower: kernels/gemm.h)
  return env_switch(g_rms_fold, "FFN_RMS_FOLD", /*on=*/false);
}

namespace {
// Note [Tile groups]: 0 (by shape) or a power of two up to 4096 tile rows.
bool group_rows_valid(long rows) {
  return rows >= 0 && rows <= 4096 && (rows & (rows - 1)) == 0;
}
}  // namespace

void set_gemm_group_rows(int rows) {
  FFN_CHECK(group_rows_valid(rows),
            "[gemm] group rows must be 0 (by shape) or a power of two up to 4096, got ", rows);
  g_group_rows = rows;
}

int gemm_group_rows() {
  int x = g_group_rows.load();
  if (x < 0) {
    const char* e = std::getenv("FFN_GEMM_GROUP_ROWS");
    x = 0;
    if (e && *e) {
      char* end = nullptr;
      const long v = std::strtol(e, &end, 10);
      FFN_CHECK(*end == '\0' && group_rows_valid(v),
                "[gemm] FFN_GEMM_GROUP_ROWS must be 0 (by shape) or a power of two up to 4096 "
                "(tile rows), got \"",
                e, "\"");
      x = static_cast<int>(v);
    }
    g_group_rows = x;
  }
  return x;
}

void set_gemm_autotune(bool on) {
  g_autotune = on ? 1 : 0;
}

bool gemm_autotune() {
  return env_switch(g_autotune, "FFN_GEMM_TUNE");
}

std::string gemm_choices() {
  return cuda::gemm_choices();
}

RestoredGemmChoices restore_gemm_choices(const std::string& text, const std::string& source,
                                         bool replace) {
  return cuda::restore_gemm_choices(text, source, replace);
}

GemmChoiceStats gemm_choice_stats() {
  return cuda::gemm_choice_stats();
}

void reset_gemm_choices() {
  cuda::reset_gemm_choices();
}

Tensor matmul(const Tensor& a, const Tensor& b, const GemmArgs& args) {
  check_dim(a, 2, "matmul", "a");
  check_dim(b, 2, "matmul", "b");
  const int64_t m = args.trans_a ? a.size(1) : a.size(0);
  const int64_t n = args.trans_b ? b.size(0) : b.size(1);
  Tensor c = Tensor::empty({m, n}, a.dtype(), a.device());
  GemmArgs g = args;
  g.beta = 0.0;
  gemm(a, b, c, g);
  return c;
}

void gemm_batched(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args) {
  check_dim(a, 3, "bmm", "a");
  check_dim(b, 3, "bmm", "b");
  check_dim(c, 3, "bmm", "c");
  FFN_CHECK(a.size(0) == b.size(0) && a.size(0) == c.size(0), "[bmm] batch sizes differ: a ",
            shape_str(a.shape()), ", b ", shape_str(b.shape()), ", c ", shape_str(c.shape()));
  FFN_CHECK(!args.bias.defined() && args.epilogue == GemmEpilogue::none,
            "[bmm] batched products take no bias or epilogue");
  FFN_CHECK(c.is_contiguous(), "[bmm] c must be contiguous");
  const int64_t batch = c.size(0);
  if (batch == 0) return;
  // Shapes, dtypes and devices are checked on the first entry (the others are alike).
  Tensor c0 = c.narrow(0, 0, 1).reshape({c.size(1), c.size(2)});
  validate(a.narrow(0, 0, 1).reshape({a.size(1), a.size(2)}),
           b.narrow(0, 0, 1).reshape({b.size(1), b.size(2)}), c0, args);
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  if (c.is_cuda()) {
    cuda::gemm_batched(ac, bc, c, args);
    return;
  }
  for (int64_t i = 0; i < batch; ++i) {
    Tensor ci = c.narrow(0, i, 1).reshape({c.size(1), c.size(2)});
    cpu::gemm(ac.narrow(0, i, 1).reshape({a.size(1), a.size(2)}),
              bc.narrow(0, i, 1).reshape({b.size(1), b.size(2)}), ci, args);
  }
}

Tensor bmm(const Tensor& a, const Tensor& b, const GemmArgs& args) {
  check_dim(a, 3, "bmm", "a");
  check_dim(b, 3, "bmm", "b");
  const int64_t m = args.trans_a ? a.size(2) : a.size(1);
  const int64_t n = args.trans_b ? b.size(1) : b.size(2);
  Tensor c = Tensor::empty({a.size(0), m, n}, a.dtype(), a.device());
  GemmArgs g = args;
  g.beta = 0.0;
  gemm_batched(a, b, c, g);
  return c;
}

}  // namespace ffn
