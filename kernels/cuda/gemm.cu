// kernels/cuda/gemm.cu — row-major GEMMs through cuBLASLt (kernels/gemm.h).
//
// cuBLASLt is column-major; a row-major [r, c] buffer is a column-major [c, r]
// matrix, so C = op(A)·op(B) is computed as Cᵀ = op(B)ᵀ·op(A)ᵀ with B passed
// first. The row bias of C is then cuBLASLt's per-row (BIAS epilogue) vector.
// Descriptors and the chosen algorithm are cached per (device, shape, transposes,
// dtype, bias, pointer alignment), so a training step performs no heuristic
// queries once warm. For large products (m·n·k ≥ 2^30) the first call times the
// heuristic's top candidates on a scratch output and keeps the fastest (the first
// candidate alone was up to 24% slower than PyTorch's choice on geglu_d1024's
// GEMMs, H100); FFN_GEMM_TUNE=0 turns that off. The choice is fixed for the rest of
// the process, so repeated steps stay bitwise identical, and can be carried to another
// process (Note [GEMM choices]: a resumed run). Where our own Hopper GEMM can run a
// bf16/f16 product, the timing includes it and a plan may run it instead of cuBLASLt (Note
// [Own GEMM in gemm()] in kernels/gemm.h). fp32 runs in true fp32
// (no TF32); bf16/f16 use fp32 accumulation; f64 runs in f64. A cached plan's bias
// pointer is set per call, so GEMMs on one device are issued from one thread (the
// owner of its compute stream, Note [One compute stream]).
#define FFN_CUBLAS_CHECKS 1
#include <cublasLt.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <tuple>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/timer.h"
#include "core/names.h"
#include "kernels/bias_act_dropout.h"
#include "kernels/cuda/gemm/sm90_gemm.h"
#include "kernels/gemm.h"

namespace ffn::cuda {

namespace {

struct Key {
  int device;
  int64_t batch;
  int64_t m, n, k;
  bool ta, tb;
  int epi;  // cublasLtEpilogue_t
  DType dtype;  // c's
  DType in;     // a's and b's (c's, or bf16/f16 under an f32 c)
  int align;  // min alignment (bytes, up to 16) of the pointers
  bool tuned;  // planned with autotuning on (a program may switch it; benchmarks time both)
  OwnGemm own;  // the own-GEMM mode it was planned under (likewise)
  bool own_ok;  // the own GEMM can run this product (Note [Own GEMM in gemm()])
  auto tie() const {
    return std::tie(device, batch, m, n, k, ta, tb, epi, dtype, in, align, tuned, own, own_ok);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

// A product as Note [GEMM choices] names it: Key without the device and the tuning switch.
struct Shape {
  int64_t batch, m, n, k;
  bool ta, tb;
  int epi;
  DType dtype, in;
  int align;
  auto tie() const { return std::tie(batch, m, n, k, ta, tb, epi, dtype, in, align); }
  bool operator<(const Shape& o) const { return tie() < o.tie(); }
};

Shape shape_of(const Key& k) {
  return {k.batch, k.m, k.n, k.k, k.ta, k.tb, k.epi, k.dtype, k.in, k.align};
}

// The pointers of one call. `vec` is the bias (BIAS, GELU_AUX_BIAS) or the bias
// gradient (DGELU_BGRAD, BGRADB); `aux` the GELU epilogues' [m, n] buffer.
struct Call {
  const void* a;
  const void* b;
  const void* vec;
  const void* aux;
};

cublasLtEpilogue_t epilogue_of(const GemmArgs& args) {
  switch (args.epilogue) {
    case GemmEpilogue::none:
      return args.bias.defined() ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::gelu_aux_bias:
      return args.bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case GemmEpilogue::dgelu_bgrad:
      return args.bias_grad.defined() ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    case GemmEpilogue::bgrad_a:
      return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// How a plan's algorithm was chosen: the heuristic's first candidate, the fastest of its
// candidates timed here, or a choice restored from another process (Note [GEMM choices]).
enum class Chosen : uint8_t { heuristic, timed, restored };

// The kernel a plan runs for calls the own GEMM can take (Note [Own GEMM in gemm()]):
// cuBLASLt's algorithm, or the own GEMM with one schedule (automatic: its own choice from the
// shape and the SM count, what OwnGemm::always runs).
enum class Engine : uint8_t { cublaslt, sm90_cooperative, sm90_pingpong, sm90_automatic };
constexpr NameOf<Engine> kEngineNames[] = {{Engine::sm90_cooperative, "cooperative"},
                                           {Engine::sm90_pingpong, "pingpong"},
                                           {Engine::sm90_automatic, "automatic"}};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};  // also for calls the own GEMM does not take (beta != 0, ...)
  Chosen chosen = Chosen::heuristic;
  Engine engine = Engine::cublaslt;
};

// One line of a choices file (Note [GEMM choices]).
struct Choice {
  cublasLtMatmulAlgo_t algo{};
  Engine engine = Engine::cublaslt;
};

std::mutex g_mu;
std::map<Key, Plan> g_plans;
std::map<Shape, Choice> g_restored;  // Note [GEMM choices]
GemmChoiceStats g_stats;

// The engine a plan of `key` runs given the engine it was timed or restored with: only what
// the mode allows and the product can take.
Engine allowed(const Key& key, Engine e) {
  if (!key.own_ok || key.own == OwnGemm::never) return Engine::cublaslt;
  return key.own == OwnGemm::always ? Engine::sm90_automatic : e;
}

// Note [GEMM choices]: `plan` takes the restored choice if cuBLASLt accepts its algorithm for
// the plan's product within our workspace (counted as restored), else keeps what it has
// (rejected).
bool take_restored(const Key& key, Plan& plan, const Choice& choice) {
  cublasLtMatmulHeuristicResult_t check{};
  if (cublasLtMatmulAlgoCheck(cublaslt(key.device), plan.op, plan.a, plan.b, plan.c, plan.c,
                              &choice.algo, &check) != CUBLAS_STATUS_SUCCESS ||
      check.workspaceSize > workspace_bytes()) {
    ++g_stats.rejected;
    return false;
  }
  plan.algo = choice.algo;
  plan.engine = allowed(key, choice.engine);
  plan.chosen = Chosen::restored;
  ++g_stats.restored;
  return true;
}

int alignment_of(std::initializer_list<const void*> ptrs) {
  int al = 16;
  for (const void* p : ptrs) {
    if (!p) continue;
    const auto v = reinterpret_cast<uintptr_t>(p);
    while (al > 1 && v % al != 0) al /= 2;
  }
  return al;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f64:
      return CUDA_R_64F;
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      break;
  }
  FFN_THROW("[gemm] dtype ", dtype_name(t), " has no cuBLASLt type");
}

bool tuning_enabled() {
  return gemm_autotune();
}

// FFN_GEMM_TUNE_LOG=1 prints each timed product's candidates (for measurements).
bool tune_log() {
  static const bool on = [] {
    const char* e = std::getenv("FFN_GEMM_TUNE_LOG");
    return e && std::strcmp(e, "1") == 0;
  }();
  return on;
}

// Note [Tuning with a cold L2]: FFN_GEMM_TUNE_COLD=0 times the candidates with L2 left warm
// (every launch after the one before, as before session 34).
bool tune_cold() {
  static const bool on = [] {
    const char* e = std::getenv("FFN_GEMM_TUNE_COLD");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

void set_pointers(const Plan& p, const Call& call) {
  if (call.vec)
    FFN_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &call.vec, sizeof(call.vec)));
  if (call.aux)
    FFN_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                    &call.aux, sizeof(call.aux)));
}

// Note [Tuning with a cold L2]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The candidates of a product (cuBLASLt's algorithms and the own GEMM's schedules) are timed
// in rounds, each candidate once a round in the same order, and each keeps the median of its
// kRounds times: a drift of the clock (the power cap swings it about once a second, Note
// [Timing window] in bench/timing.h) then moves every candidate alike instead of whichever
// ran during a dip. Before each timed launch a memset of at least twice L2's size evicts L2,
// as a training step's other kernels do between two uses of an operand, and keeps the GPU
// busy while the host launches the candidate, so neither the host's launch time nor a warm
// L2 is counted. The memset writes the candidates' scratch output, allocated at twice L2's
// size where the product's output is smaller, so tuning needs no memory beyond the larger of
// the two: a buffer of its own raised gpt2_small's peak from 7.70 to 7.90 GiB, since the first
// step tunes its products while its activations are alive.
// Before (the method until session 34, still FFN_GEMM_TUNE_COLD=0): candidate after
// candidate, each the median of three runs of four back-to-back launches with L2 warm. For
// gpt2_small's fc2 weight gradient (768 × 3072 × 16384, Aᵀ) that picked a split-K kernel in
// two of three processes, measured at 0.113-0.118 ms with its reduce, which ran 113.6 +
// 18.6 us in the training step where a 128×160 kernel (cuBLASLt's first candidate, 0.108 when
// it won) runs 109; timed as here the 128×160 kernel won in both processes, 3-5% ahead of the
// split-K one (H100, session 34, bench/RESULTS-2026-11-27-s33-34.md).
constexpr int kRounds = 5;

// The bytes of the candidates' scratch output: the product's output, at least twice L2's size
// when the timing evicts L2 (Note [Tuning with a cold L2]).
size_t scratch_bytes(int dev, size_t out_bytes) {
  return tune_cold() ? std::max(out_bytes, 2 * static_cast<size_t>(properties(dev).l2CacheSize))
                     : out_bytes;
}

// The candidates' times in ms (INFINITY where the first, untimed run failed). runs[i]() launches
// candidate i on the stream and returns whether it could; `scratch` (scratch_bytes of it) is
// the output they write, overwritten before each timed launch.
std::vector<float> time_candidates(int dev, const std::vector<std::function<bool()>>& runs,
                                   void* scratch, size_t bytes) {
  cudaStream_t s = stream(dev);
  std::vector<float> best(runs.size(), INFINITY);
  std::vector<bool> ok(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) ok[i] = runs[i]();
  cudaGetLastError();  // a candidate that failed to launch left no error behind
  if (!tune_cold()) {
    for (size_t i = 0; i < runs.size(); ++i) {
      if (!ok[i]) continue;
      const auto four = [&] {
        for (int r = 0; r < 4; ++r) runs[i]();
      };
      best[i] = static_cast<float>(median_event_ms(s, 1, 3, four) / 4);
    }
    return best;
  }
  std::vector<std::vector<float>> ms(runs.size());
  cudaEvent_t a, b;
  FFN_CHECK_CUDA(cudaEventCreate(&a));
  FFN_CHECK_CUDA(cudaEventCreate(&b));
  for (int r = 0; r < kRounds; ++r)
    for (size_t i = 0; i < runs.size(); ++i) {
      if (!ok[i]) continue;
      FFN_CHECK_CUDA(cudaMemsetAsync(scratch, r, bytes, s));
      FFN_CHECK_CUDA(cudaEventRecord(a, s));
      runs[i]();
      FFN_CHECK_CUDA(cudaEventRecord(b, s));
      FFN_CHECK_CUDA(cudaEventSynchronize(b));
      float t = 0;
      FFN_CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
      ms[i].push_back(t);
    }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!ok[i]) continue;
    std::sort(ms[i].begin(), ms[i].end());
    best[i] = ms[i][ms[i].size() / 2];
  }
  return best;
}

// cuBLASLt algorithm `algo` writing a scratch output (beta = 0); false if it cannot run.
bool run_algo(const Key& key, const Plan& p, const cublasLtMatmulAlgo_t& algo, const void* a,
              const void* b, void* scratch) {
  const float one = 1.0f, zero = 0.0f;
  const double one64 = 1.0, zero64 = 0.0;
  const bool f64 = key.dtype == DType::f64;
  const void* alpha = f64 ? static_cast<const void*>(&one64) : &one;
  const void* beta = f64 ? static_cast<const void*>(&zero64) : &zero;
  return cublasLtMatmul(cublaslt(key.device), p.op, alpha, b, p.a, a, p.b, beta, scratch, p.c,
                        scratch, p.c, &algo, workspace(key.device), workspace_bytes(),
                        stream(key.device)) == CUBLAS_STATUS_SUCCESS;
}

// For FFN_GEMM_TUNE_LOG: an algorithm's tile, stages and split-K count (cuBLASLt's ids).
std::string algo_config(const cublasLtMatmulAlgo_t& algo) {
  uint32_t tile = 0, stages = 0;
  int32_t splits = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile,
                                       nullptr);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                       sizeof stages, nullptr);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                       sizeof splits, nullptr);
  std::ostringstream o;
  o << "tile " << tile << " stages " << stages << " splitK " << splits;
  return o.str();
}

// The operands of the call that makes a plan, for timing the own GEMM on them.
struct OwnCall {
  const Tensor& a;
  const Tensor& b;
  const Tensor& bias;
};

Sm90GemmArgs own_args(const Key& key, const Tensor& bias, Engine e) {
  return {.trans_a = key.ta,
          .trans_b = key.tb,
          .bias = bias,
          .schedule = e == Engine::sm90_cooperative ? Sm90Schedule::cooperative
                      : e == Engine::sm90_pingpong  ? Sm90Schedule::pingpong
                                                    : Sm90Schedule::automatic,
          .splits = e == Engine::sm90_automatic ? 0 : 1};
}

Plan make_plan(const Key& key, const Call& call, const OwnCall& own) {
  Plan p;
  const cudaDataType_t dt = cuda_type(key.dtype);
  const bool f64 = key.dtype == DType::f64;
  FFN_CHECK_CUBLAS(cublasLtMatmulDescCreate(&p.op, f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
                                            f64 ? CUDA_R_64F : CUDA_R_32F));
  // Cᵀ[n, m] = op(B')[n, k] · op(A')[k, m] with B' = row-major B, A' = row-major A.
  const cublasOperation_t opa = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  FFN_CHECK_CUBLAS(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  FFN_CHECK_CUBLAS(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  const auto epi = static_cast<cublasLtEpilogue_t>(key.epi);
  FFN_CHECK_CUBLAS(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (call.aux) {  // the aux buffer is laid out like Cᵀ (column-major [n, m], ld n)
    const int64_t ld = key.n;
    FFN_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                                    sizeof(ld)));
  }
  // Column-major shapes of the row-major buffers: B is [k, n] (or [n, k] when tb).
  const uint64_t b_rows = key.tb ? key.k : key.n, b_cols = key.tb ? key.n : key.k;
  const uint64_t a_rows = key.ta ? key.m : key.k, a_cols = key.ta ? key.k : key.m;
  const cudaDataType_t in = cuda_type(key.in);
  FFN_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p.a, in, b_rows, b_cols, b_rows));
  FFN_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p.b, in, a_rows, a_cols, a_rows));
  FFN_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p.c, dt, key.n, key.m, key.n));
  if (key.batch > 1) {  // contiguous [batch, rows, cols] buffers
    const int32_t count = static_cast<int32_t>(key.batch);
    const int64_t strides[3] = {static_cast<int64_t>(b_rows * b_cols),
                                static_cast<int64_t>(a_rows * a_cols), key.m * key.n};
    const cublasLtMatrixLayout_t layouts[3] = {p.a, p.b, p.c};
    for (int i = 0; i < 3; ++i) {
      FFN_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(
          layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      FFN_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(
          layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof(int64_t)));
    }
  }

  cublasLtMatmulPreference_t pref = nullptr;
  FFN_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = workspace_bytes();
  FFN_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t al = static_cast<uint32_t>(key.align);
  // Split-K partial sums in the compute type only: reducing in bf16/f16 would lose the
  // fp32 accumulation this API promises.
  const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_INPLACE |
                           CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  FFN_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes)));
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    FFN_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al)));
  constexpr int kCandidates = 8;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      cublaslt(key.device), p.op, p.a, p.b, p.c, p.c, pref, kCandidates, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  FFN_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0, "[gemm] cuBLASLt has no algorithm for ",
            dtype_name(key.in), (key.in != key.dtype ? " → " : ""),
            (key.in != key.dtype ? dtype_name(key.dtype) : ""), " m=", key.m, " n=", key.n,
            " k=", key.k, (key.ta ? " Aᵀ" : ""), (key.tb ? " Bᵀ" : ""), " (alignment ", key.align,
            " bytes): ", cublasGetStatusString(st));
  p.algo = results[0].algo;
  p.engine = allowed(key, Engine::cublaslt);  // the own GEMM under OwnGemm::always
  const bool time_own = p.engine == Engine::cublaslt && key.own_ok && key.own == OwnGemm::tuned;
  const double volume = static_cast<double>(key.batch) * key.m * key.n * key.k;
  if ((found > 1 || time_own) && volume >= 1073741824.0 && key.tuned) {
    // A choice restored from another process (Note [GEMM choices]) replaces the timing if
    // cuBLASLt still accepts it for this product.
    const auto r = g_restored.find(shape_of(key));
    if (r != g_restored.end() && take_restored(key, p, r->second)) {
      if (p.engine != Engine::cublaslt) ++g_stats.own;
      return p;
    }
    set_pointers(p, call);  // epilogue outputs are rewritten by the real call
    const int64_t out_elems = key.batch * key.m * key.n;
    const size_t bytes =
        scratch_bytes(key.device, static_cast<size_t>(out_elems) * dtype_size(key.dtype));
    const Tensor scratch = Tensor::empty(
        {static_cast<int64_t>((bytes + dtype_size(key.dtype) - 1) / dtype_size(key.dtype))},
        key.dtype, Device::cuda(key.device));
    // Note [Tuning with a cold L2]: cuBLASLt's candidates, then the own GEMM's schedules.
    std::vector<std::function<bool()>> runs;
    for (int i = 0; i < found; ++i)
      runs.push_back([&, i] {
        return run_algo(key, p, results[i].algo, call.a, call.b, scratch.data_ptr());
      });
    const Engine own_engines[] = {Engine::sm90_cooperative, Engine::sm90_pingpong,
                                  Engine::sm90_automatic};
    Tensor c = scratch.narrow(0, 0, out_elems).reshape({key.batch * key.m, key.n});
    if (time_own)  // Note [Own GEMM in gemm()]
      for (Engine e : own_engines)
        runs.push_back([&, e] {
          sm90_gemm(own.a, own.b, c, own_args(key, own.bias, e));
          return true;
        });
    const std::vector<float> t = time_candidates(key.device, runs, scratch.data_ptr(), bytes);
    std::ostringstream log;  // FFN_GEMM_TUNE_LOG=1: every candidate's time, on stderr
    log << "[gemm tune] " << dtype_name(key.in) << ' ' << key.m << 'x' << key.n << 'x' << key.k
        << (key.ta ? " Aᵀ" : "") << (key.tb ? " Bᵀ" : "") << (tune_cold() ? " (cold L2)" : "")
        << ':';
    float best = INFINITY;
    for (int i = 0; i < found; ++i) {
      log << "\n  cuBLASLt #" << i << " (" << algo_config(results[i].algo) << ") " << t[i];
      if (t[i] < best) best = t[i], p.algo = results[i].algo;
    }
    for (size_t j = found; j < t.size(); ++j) {
      const Engine e = own_engines[j - found];
      log << "\n  own " << name_of(kEngineNames, e) << ' ' << t[j];
      if (t[j] < best) best = t[j], p.engine = e;
    }
    if (tune_log())
      std::fprintf(stderr, "%s -> %s\n", log.str().c_str(),
                   p.engine == Engine::cublaslt ? "cuBLASLt" : name_of(kEngineNames, p.engine));
    p.chosen = Chosen::timed;
    ++g_stats.timed;
  }
  if (p.engine != Engine::cublaslt) ++g_stats.own;
  return p;
}

// c = op(a)·op(b) for `batch` contiguous matrices of c's last two dimensions.
void gemm_impl(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args, int64_t batch) {
  const int dev = c.device().index;
  DeviceGuard guard(dev);
  const int64_t m = c.size(-2), n = c.size(-1);
  const int64_t k = args.trans_a ? a.size(-2) : a.size(-1);
  if (m == 0 || n == 0 || batch == 0) return;
  FFN_CHECK(args.epilogue == GemmEpilogue::none || k > 0, "[gemm] epilogues need k > 0");
  if (k == 0) {  // empty reduction: c = beta·c (+ bias)
    if (args.beta == 0.0)
      c.zero_();
    else if (args.beta != 1.0)
      c.add_(c.clone(), args.beta - 1.0);
    if (args.bias.defined()) bias_add(c, args.bias, c);
    return;
  }
  const cublasLtEpilogue_t epi = epilogue_of(args);
  const bool uses_aux =
      args.epilogue == GemmEpilogue::gelu_aux_bias || args.epilogue == GemmEpilogue::dgelu_bgrad;
  FFN_CHECK(!uses_aux || is_half(c.dtype()), "[gemm] cuBLASLt's GELU epilogues evaluate tanh ",
            "approximately (absolute error up to 4e-6, relative up to 6e-3 in the negative tail, ",
            "measured on an H100), so they are offered for bf16/f16 only; got ",
            dtype_name(c.dtype()), " (use bias_act_dropout)");
  FFN_CHECK(!uses_aux || n % 8 == 0, "[gemm] cuBLASLt's GELU epilogues need n % 8 == 0, got n=", n);
  const Tensor& vec =
      args.epilogue == GemmEpilogue::none || args.epilogue == GemmEpilogue::gelu_aux_bias
          ? args.bias
          : args.bias_grad;
  const Call call{a.data_ptr(), b.data_ptr(), vec.defined() ? vec.data_ptr() : nullptr,
                  uses_aux ? args.aux.data_ptr() : nullptr};
  // Note [Own GEMM in gemm()]: the products our Hopper GEMM takes.
  const OwnGemm own = own_gemm();
  const bool own_ok = own != OwnGemm::never && batch == 1 && c.dtype() == a.dtype() &&
                      args.epilogue == GemmEpilogue::none &&
                      sm90_gemm_supported(a, b, c, args.trans_a, args.trans_b);
  const Key key{dev,
                batch,
                m,
                n,
                k,
                args.trans_a,
                args.trans_b,
                static_cast<int>(epi),
                c.dtype(),
                a.dtype(),
                alignment_of({call.a, call.b, c.data_ptr(), call.vec, call.aux}),
                tuning_enabled(),
                own,
                own_ok};
  Plan plan;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_plans.find(key);
    if (it == g_plans.end())
      it = g_plans.emplace(key, make_plan(key, call, OwnCall{a, b, args.bias})).first;
    plan = it->second;
  }
  if (plan.engine != Engine::cublaslt && args.alpha == 1.0 && args.beta == 0.0) {
    sm90_gemm(a, b, c, own_args(key, args.bias, plan.engine));
    return;
  }
  set_pointers(plan, call);
  const double alpha64 = args.alpha, beta64 = args.beta;
  const float alpha32 = static_cast<float>(args.alpha), beta32 = static_cast<float>(args.beta);
  const bool f64 = c.dtype() == DType::f64;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = f64 ? static_cast<const void*>(&beta64) : &beta32;
  FFN_CHECK_CUBLAS(cublasLtMatmul(cublaslt(dev), plan.op, alpha, b.data_ptr(), plan.a, a.data_ptr(),
                                  plan.b, beta, c.data_ptr(), plan.c, c.data_ptr(), plan.c,
                                  &plan.algo, workspace(dev), workspace_bytes(), stream(dev)));
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args) {
  gemm_impl(a, b, c, args, 1);
}

void gemm_batched(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args) {
  gemm_impl(a, b, c, args, c.size(0));
}

// Note [GEMM choices]: the header line that must match for choices to carry over.
namespace {
// Version 2 adds the own GEMM's field, and the SM count to the context line (the own GEMM's
// automatic schedule cuts a product by it); version 1 files still read.
constexpr const char* kChoicesMagic = "# fused-ffn GEMM choices ";
constexpr const char* kChoicesVersion = "2";

std::string choices_context(int version = 2) {
  int dev = 0;
  FFN_CHECK_CUDA(cudaGetDevice(&dev));
  const cudaDeviceProp& prop = properties(dev);
  std::string c = "cublaslt " + std::to_string(cublasLtGetVersion()) + " sm_" +
                  std::to_string(prop.major * 10 + prop.minor);
  if (version >= 2) c += " sms " + std::to_string(prop.multiProcessorCount);
  return c;
}
}  // namespace

std::string gemm_choices() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::map<Shape, Choice> chosen;  // one line per product, whatever the device
  for (const auto& [key, plan] : g_plans)
    if (plan.chosen != Chosen::heuristic)
      chosen.emplace(shape_of(key), Choice{plan.algo, plan.engine});
  if (chosen.empty()) return {};
  std::ostringstream out;
  out << kChoicesMagic << kChoicesVersion << " (kernels/gemm.h)\n" << choices_context() << "\n";
  for (const auto& [sh, choice] : chosen) {
    const cublasLtMatmulAlgo_t& algo = choice.algo;
    out << "gemm " << sh.batch << ' ' << sh.m << ' ' << sh.n << ' ' << sh.k << ' ' << sh.ta << ' '
        << sh.tb << ' ' << sh.epi << ' ' << dtype_name(sh.dtype) << ' ' << dtype_name(sh.in) << ' '
        << sh.align;
    static_assert(sizeof(algo.data) == 8 * sizeof(uint64_t));
    for (uint64_t w : algo.data) {
      char hex[20];
      std::snprintf(hex, sizeof(hex), " %016" PRIx64, w);
      out << hex;
    }
    if (choice.engine != Engine::cublaslt) out << " sm90 " << name_of(kEngineNames, choice.engine);
    out << "\n";
  }
  return out.str();
}

RestoredGemmChoices restore_gemm_choices(const std::string& text, const std::string& source,
                                         bool replace) {
  RestoredGemmChoices res;
  std::istringstream in(text);
  std::string line;
  int no = 0;
  auto bad = [&](const std::string& why) {
    FFN_THROW("[gemm] ", source, " line ", no, ": ", why, " (got '", line.substr(0, 80), "')");
  };
  std::map<Shape, Choice> parsed;
  int version = 0;
  while (std::getline(in, line)) {
    ++no;
    if (no == 1) {
      const size_t v = std::strlen(kChoicesMagic);
      if (line.rfind(kChoicesMagic, 0) != 0 || line.size() <= v) bad("not a GEMM choices file");
      version = line[v] - '0';
      if (version < 1 || version > 2 || (line.size() > v + 1 && line[v + 1] != ' '))
        bad("a GEMM choices file of a version this build does not read (it reads 1 and 2)");
      continue;
    }
    if (no == 2) {
      const std::string here = choices_context(version);
      if (line != here) {  // another cuBLASLt or GPU: its algorithms may not exist here
        res.skipped = "written with " + line + ", this process has " + here;
        return res;
      }
      continue;
    }
    if (line.empty()) continue;
    std::istringstream f(line);
    std::string tag, dt, din;
    Shape sh{};
    int ta = -1, tb = -1;
    if (!(f >> tag >> sh.batch >> sh.m >> sh.n >> sh.k >> ta >> tb >> sh.epi >> dt >> din >>
          sh.align) ||
        tag != "gemm" || (ta != 0 && ta != 1) || (tb != 0 && tb != 1) || sh.batch < 1 || sh.m < 1 ||
        sh.n < 1 || sh.k < 1)
      bad("expected 'gemm batch m n k ta tb epilogue dtype in align' and 8 hex words");
    sh.ta = ta == 1;
    sh.tb = tb == 1;
    try {
      sh.dtype = parse_dtype(dt);
      sh.in = parse_dtype(din);
    } catch (const Error& e) {
      bad(e.what());
    }
    Choice choice;
    for (uint64_t& w : choice.algo.data) {
      std::string h;
      if (!(f >> h) || h.size() != 16 || h.find_first_not_of("0123456789abcdef") != h.npos)
        bad("the algorithm is 8 words of 16 hex digits");
      w = std::strtoull(h.c_str(), nullptr, 16);
    }
    std::string extra;
    if (version >= 2 && f >> extra) {  // Note [Own GEMM in gemm()]
      std::string schedule;
      const auto e = f >> schedule ? value_of(kEngineNames, schedule) : std::nullopt;
      if (extra != "sm90" || !e)
        bad("after the algorithm only 'sm90 " + names_list(kEngineNames) + "' may follow");
      choice.engine = *e;
    }
    if (f >> extra) bad("trailing text");
    parsed[sh] = choice;
  }
  if (no < 2) {
    line.clear();
    bad("the file ends before its header");
  }
  std::lock_guard<std::mutex> lock(g_mu);
  for (const auto& [sh, choice] : parsed) g_restored[sh] = choice;
  res.count = static_cast<int64_t>(parsed.size());
  if (replace) {  // plans made before the restore take the restored algorithm too
    for (auto& [key, plan] : g_plans) {
      if (!key.tuned || plan.chosen == Chosen::heuristic) continue;
      const auto r = parsed.find(shape_of(key));
      if (r == parsed.end()) continue;
      const bool was_own = plan.engine != Engine::cublaslt;
      if (take_restored(key, plan, r->second))
        g_stats.own += (plan.engine != Engine::cublaslt) - was_own;
    }
  }
  return res;
}

GemmChoiceStats gemm_choice_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_stats;
}

void reset_gemm_choices() {
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto& [key, plan] : g_plans) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.c);
    cublasLtMatmulDescDestroy(plan.op);
  }
  g_plans.clear();
  g_restored.clear();
  g_stats = {};
}

}  // namespace ffn::cuda
