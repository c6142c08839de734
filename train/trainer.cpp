// train/trainer.cpp — the training loop (train/trainer.h).
#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <type_traits>
#include <unordered_map>

#include "core/generator.h"
#include "kernels/gemm.h"
#include "layers/transformer.h"
#include "optim/adamw.h"
#include "train/checkpoint.h"
#include "train/dist/comm.h"
#include "train/dist/comm_profile.h"
#include "train/data.h"
#include "train/dist/ddp.h"
#include "train/dist/dist.h"
#include "train/dist/zero.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "train/run_dir.h"
#include "train/stop.h"
#include "train/weights.h"

#if FFN_WITH_CUDA
#include "core/cuda/context.h"
#endif

namespace fs = std::filesystem;

namespace ffn::train {

namespace {

std::string device_label(Device dev) {
#if FFN_WITH_CUDA
  if (dev.is_cuda()) return std::string(cuda::properties(dev.index).name) + " (" + dev.str() + ")";
#endif
  return "CPU (" + std::to_string(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN))) + " cores)";
}

// Mean loss over `iters` fixed batches of a split (eval mode, no graph). With several ranks
// each evaluates its rows of every batch and the means are averaged.
double estimate_loss(GPT& model, const std::vector<int32_t>& tokens, const Config& c,
                     uint64_t seed, Device dev, Comm* comm) {
  NoGradGuard ng;
  model.eval();
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->world() : 1;
  double sum = 0;
  for (int64_t i = 0; i < c.run.eval_iters; ++i) {
    const Batch b = sample_batch(tokens, c.train.batch_size, c.model.context, seed,
                                 static_cast<uint64_t>(i), rank, world);
    sum += model.loss(b.x.to(dev), b.y.to(dev), /*ids_in_range=*/true).value().item();
  }
  model.train();
  double mean = sum / static_cast<double>(c.run.eval_iters);
  if (world > 1) {
    Tensor t = Tensor::full({1}, mean, DType::f64, Device::cpu()).to(DType::f32).to(dev);
    comm->all_reduce(t, true, "eval loss");
    comm->sync();
    mean = t.item();
  }
  return mean;
}

// Debug check that data parallelism keeps every rank's parameters bitwise identical:
// rank 0's CRC-32 of all parameter bytes is broadcast and compared everywhere.
void check_replicas(const std::vector<std::pair<std::string, Var>>& params, Comm& comm,
                    Device dev, int64_t step) {
  uint32_t crc = 0;
  for (const auto& [n, v] : params) {
    const Tensor h = v.value().to(Device::cpu()).contiguous();
    crc = crc32(h.data_ptr(), h.nbytes(), crc);
  }
  Tensor c0 = Tensor::full({1}, static_cast<double>(crc), DType::f64, dev);
  comm.broadcast(c0, 0, "replica checksum");
  comm.sync();
  Tensor bad = Tensor::full({1}, c0.item() == static_cast<double>(crc) ? 0.0 : 1.0, DType::f32, dev);
  comm.all_reduce(bad, false, "replica check");
  comm.sync();
  FFN_CHECK(bad.item() == 0.0, "[ddp] parameters differ across ranks at step ", step, " (",
            bad.item(), " rank(s) differ from rank 0)");
}

bool has_checkpoints(const std::string& dir) {
  return fs::exists(fs::path(dir) / "latest");
}

// A step's activations cannot be smaller than its logits (B·T·vocab values); refuse batch
// sizes whose logits alone exceed the device's memory before anything is allocated.
void check_step_fits(const Config& c, int64_t vocab, Device dev, DType dt, int world) {
  GptConfig g;
  g.vocab_size = vocab;
  g.vocab_pad_to = c.model.vocab_pad_to;
  vocab = g.padded_vocab();
  const double tokens = static_cast<double>(c.train.batch_size / world) *
                        static_cast<double>(c.model.context);
  const double logits = tokens * static_cast<double>(vocab) * static_cast<double>(dtype_size(dt));
  const double have = static_cast<double>(device_memory_bytes(dev));
  if (have > 0 && logits > have)
    config_error("train.batch_size: " + std::to_string(c.train.batch_size) + " sequences of " +
                 std::to_string(c.model.context) + " tokens need at least " +
                 format_bytes(logits) + " per " + (world > 1 ? "GPU" : "step") +
                 " for the logits alone (vocab " + std::to_string(vocab) + ", " + dtype_name(dt) +
                 "), more than the " + format_bytes(have) + " of " +
                 (dev.is_cpu() ? std::string("host memory") : dev.str()));
}

}  // namespace

GptConfig gpt_config(const Config& c, int64_t vocab, Device dev, DType dt) {
  GptConfig g;
  g.vocab_size = vocab;
  g.vocab_pad_to = c.model.vocab_pad_to;
  g.context = c.model.context;
  g.layers = c.model.layers;
  g.heads = c.model.heads;
  g.d_model = c.model.d_model;
  g.ffn = c.model.ffn;
  g.ffn_mult = c.model.ffn_mult;
  g.dropout = static_cast<float>(c.model.dropout);
  g.bias = c.model.bias;
  g.arch = c.model.arch;
  g.kv_heads = c.model.kv_heads;
  g.rope_theta = c.model.rope_theta;
  g.norm_eps = c.model.norm_eps;
  g.tie_embeddings = c.model.tie_embeddings;
  g.fp32_residual = c.runtime.fp32_residual;
  g.fused_attention = c.runtime.fused_attention;
  g.place = ParamInit{dt, dev};
  return g;
}

// Everything a run holds between its steps.
struct Trainer::State {
  Config cfg;
  TrainOptions opt;
  std::chrono::steady_clock::time_point t_start = std::chrono::steady_clock::now();
  DistEnv denv;
  int world = 1, rank = 0;
  bool lead = true;  // rank 0 logs, writes metrics and pictures, and checkpoints
  Device dev;
  DType dt = DType::f32;
  std::string run_dir, resume_dir;
  Dataset data;
  int64_t vocab = 0;
  TrainState resumed;
  std::optional<RunLock> lock;
  std::unique_ptr<Comm> owned_comm;
  Comm* comm = nullptr;
  std::shared_ptr<Generator> rng;
  std::unique_ptr<GPT> model;
  std::vector<std::pair<std::string, Var>> params;
  std::unique_ptr<AdamW> optim;
  std::unique_ptr<LossScaler> scaler;
  std::unique_ptr<GradSync> sync;
  std::unique_ptr<ZeroShards> zero;  // train.zero = 1 under data parallelism (Note [ZeRO-1])
  // Note [Gradient accumulation]: fp32 sums of the earlier micro-batches' gradients.
  std::vector<Tensor> grad_acc;
  std::unordered_map<const VarImpl*, size_t> param_index;
  std::unique_ptr<Progress> progress;
  std::unique_ptr<RunRecord> record;
  std::string branch;
  std::optional<std::pair<int64_t, double>> pending;  // (done, lr) of a deferred step
  std::string last_checkpoint;                        // written by this process
  int64_t last_checkpoint_iter = -1;
  uint64_t cursor = 0, data_seed = 0, eval_seed = 0;
  int64_t start_iter = 0, end_iter = 0, decay_iters = 0;
  int64_t buckets_total = 0, buckets_overlapped = 0;
  // Note [Deferred collective check]: the collectives of the last queued step end here.
  int64_t comm_mark = 0;
  bool profiling = false;               // --profile-comm under data parallelism
  std::vector<CommEvent> comm_events;   // Note [Communication profile]
  double best_val = INFINITY, last_loss = NAN, first_val = NAN, last_val = NAN;
};

namespace {

constexpr int64_t kProfiledSteps = 200;  // --profile-comm times this many steps, then stops

// An allocation failure (ours, or std::bad_alloc from the C++ library) as an error that says
// where in the run it happened and what to lower; every other error passes unchanged.
// `stage` is text, or a callable giving it (built only on a failure: the per-step call
// stays free of string work).
template <class Stage, class F>
void with_oom_context(const Stage& stage, const Device& dev, F&& body) {
  auto advice = [&](const std::string& what) {
    std::string where;
    if constexpr (std::is_invocable_v<Stage>)
      where = stage();
    else
      where = stage;
    return "[train] out of memory " + where + " on " + dev.str() + ":\n  " + what +
           "\n  To fit, lower train.batch_size (train.grad_accum_steps keeps the global batch), "
           "model.context, model.d_model or model.layers.";
  };
  try {
    body();
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::out_of_memory) throw;
    throw Error(advice(e.what()), ErrorKind::out_of_memory);
  } catch (const std::bad_alloc&) {
    throw Error(advice("std::bad_alloc"), ErrorKind::out_of_memory);
  }
}

}  // namespace

Trainer::Trainer(const Config& cfg, const TrainOptions& opt) : s_(std::make_unique<State>()) {
  s_->cfg = cfg;
  s_->opt = opt;
  // Everything that can be a config error is decided before device memory is touched.
  place();
  validate_run();
  prepare_run_dir();
  connect();
  with_oom_context("building the model and optimizer (weights, gradients, AdamW state)",
                   s_->dev, [this] { build(); });
  restore();
  announce();
}

Trainer::~Trainer() = default;

TrainResult run_training(const Config& cfg, const TrainOptions& opt) {
  Trainer t(cfg, opt);
  return t.run();
}

// World, rank, device and dtype.
void Trainer::place() {
  State& s = *s_;
  s.denv = s.opt.comm ? DistEnv{} : dist_env_from_environment();
  s.world = s.opt.comm ? s.opt.comm->world() : s.denv.world;
  s.rank = s.opt.comm ? s.opt.comm->rank() : s.denv.rank;
  s.lead = s.rank == 0;
  // runtime.nproc is checked at config load; a world from the environment is checked here.
  if (s.world != s.cfg.runtime.nproc && s.cfg.train.batch_size % s.world != 0)
    config_error("train.batch_size: the global batch " + std::to_string(s.cfg.train.batch_size) +
                 " is not divisible by the " + std::to_string(s.world) + " processes");
  s.dev = resolve_device(s.cfg.runtime.device, "runtime.device");
  if (s.world > 1 && !s.opt.comm) {
    if (!s.dev.is_cuda())
      config_error("runtime.device: data parallelism across processes needs GPUs (NCCL); got \"" +
                   s.cfg.runtime.device.str() + "\"");
    s.dev = resolve_device({Device::cuda(s.denv.local_rank)}, "LOCAL_RANK");
  }
  s.dt = compute_dtype(s.cfg.runtime.precision, s.dev);
  // Timed GEMM autotuning may pick different algorithms in another process, which would
  // break bit-exact resume; it is opt-in for training runs.
  set_gemm_autotune(s.cfg.runtime.gemm_autotune);
}

// The run dir, the checkpoint to resume, the data and what they must agree on.
void Trainer::validate_run() {
  State& s = *s_;
  s.run_dir = s.cfg.run.dir;
  if (!s.opt.resume.empty() && !s.opt.init_from.empty())
    config_error("--init-from: a resumed run has its weights already (leave out --init-from, "
                 "or start a new run.dir)");
  if (!s.opt.resume.empty()) {
    // Note [Run directory ownership]: a resume continues in the checkpoint's own run.
    const ResumePoint at = resolve_resume(s.opt.resume);
    check_resume_config(s.cfg, at);
    s.resume_dir = at.ckpt_dir;
    if (s.lead)
      for (const std::string& why : at.skipped)
        std::fprintf(stderr, "[resume] passed over a damaged checkpoint (left in place): %s\n",
                     why.c_str());
    if (s.lead && !at.skipped.empty())
      std::fprintf(stderr, "[resume] continuing from %s, the newest intact checkpoint\n",
                   at.ckpt_dir.c_str());
  }
  if (s.resume_dir.empty() && has_checkpoints(s.run_dir) && !s.opt.overwrite)
    config_error("run.dir: '" + s.run_dir + "' already holds checkpoints; continue it with " +
                 "--resume " + s.run_dir + ", or start over with --overwrite, or pick another " +
                 "--set run.dir=...");
  s.data = load_dataset(s.cfg.data, s.cfg.model.context);
  s.vocab = s.cfg.model.vocab_size ? s.cfg.model.vocab_size : s.data.vocab_size;
  check_vocab(s.data, s.cfg.data, s.vocab);
  check_step_fits(s.cfg, s.vocab, s.dev, s.dt, s.world);
  if (s.resume_dir.empty()) return;
  s.resumed = read_train_state(s.resume_dir);
  if (s.resumed.world != s.world)
    config_error("runtime.nproc: the checkpoint was written by " +
                 std::to_string(s.resumed.world) + " process(es) and this run has " +
                 std::to_string(s.world) +
                 "; resume with the same world size (the data order and dropout streams "
                 "depend on it)");
  if (!s.data.chars.empty() && s.resumed.vocab != s.data.chars)
    config_error("data: the text's vocabulary differs from the checkpoint's");
}

// From here on this process writes the run (Note [Run directory ownership]).
void Trainer::prepare_run_dir() {
  State& s = *s_;
  if (!s.lead) return;
  s.lock.emplace(s.run_dir);
  if (!s.opt.overwrite || !s.resume_dir.empty()) return;
  for (const auto& e : fs::directory_iterator(s.run_dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("ckpt-", 0) == 0 || n.rfind("branch-", 0) == 0 || n == "latest" ||
        n == "metrics.jsonl" || n == "loss.svg")
      fs::remove_all(e.path());
  }
}

// The communicator: joins the other ranks (a missing peer is a timeout error).
void Trainer::connect() {
  State& s = *s_;
  s.comm = s.opt.comm;
  if (s.world == 1 || s.comm) return;
#if FFN_WITH_NCCL
  const std::string id = rendezvous(s.denv, s.lead ? nccl_unique_id() : std::string(),
                                    s.opt.rendezvous_timeout_s);
  s.owned_comm =
      make_nccl_comm(s.rank, s.world, s.dev.index, id, NcclOptions{s.opt.comm_timeout_s});
  s.comm = s.owned_comm.get();
#else
  config_error("runtime.nproc: this build has no NCCL, so it cannot run several processes");
#endif
}

// Model, optimizer, loss scaler, gradient sync and the run's fixed numbers.
void Trainer::build() {
  State& s = *s_;
  const Config& c = s.cfg;
  Generator init(static_cast<uint64_t>(c.run.seed));
  // Dropout streams: (seed, rank) pick the generator, the step and layer its offset, so
  // ranks draw different masks and a run is reproducible for a given world size.
  s.rng = std::make_shared<Generator>(static_cast<uint64_t>(c.run.seed) + 1 +
                                      static_cast<uint64_t>(s.rank) * 1000003ull);
  s.model = std::make_unique<GPT>(gpt_config(c, s.vocab, s.dev, s.dt), s.rng, init);
  AdamWOptions ao;
  ao.hyper = AdamWHyper{c.train.lr, c.train.beta1, c.train.beta2, c.train.eps,
                        c.train.weight_decay};
  ao.decay_matrices_only = c.train.decay_matrices_only;
  ao.grad_clip = c.train.grad_clip;
  ao.max_nonfinite_in_row = static_cast<int>(c.train.max_nonfinite);
  s.params = s.model->named_parameters();
  const bool zero = c.train.zero == 1 && s.world > 1;
  if (s.world > 1)
    s.sync = std::make_unique<GradSync>(s.params, *s.comm, s.opt.bucket_mb << 20, /*shard=*/zero);
  if (zero) {  // Note [ZeRO-1]: this rank's AdamW updates its slices only
    s.zero = std::make_unique<ZeroShards>(*s.sync, s.params, *s.comm);
    ao.decay = s.zero->decay(c.train.decay_matrices_only);
    ao.groups = s.zero->groups();
    ZeroShards* z = s.zero.get();
    ao.after_group = [z](size_t g) { z->gather_bucket(g); };
    Comm* comm = s.comm;
    ao.reduce_sumsq = [comm](Tensor& sumsq) {
      Tensor t = sumsq.to(DType::f64).clone();
      comm->all_reduce(t, /*average=*/false, "ZeRO-1 gradient norm");
      comm->wait();
      sumsq = t;
    };
    s.optim = std::make_unique<AdamW>(s.zero->slices(), ao);
  } else {
    s.optim = std::make_unique<AdamW>(s.params, ao);
  }
  s.scaler = std::make_unique<LossScaler>(s.dt == DType::f16);
  if (s.opt.profile_comm && s.sync) {
    s.profiling = true;
    s.comm->profile_start();
  } else if (s.opt.profile_comm && s.lead) {
    std::printf("--profile-comm: a single process has no communication to profile\n");
  }
  if (c.train.grad_accum_steps > 1)
    for (size_t k = 0; k < s.params.size(); ++k) {
      const Var& v = s.params[k].second;
      s.param_index[v.impl()] = k;
      s.grad_acc.push_back(Tensor::zeros(v.value().shape(), DType::f32, s.dev));
    }
  s.data_seed = static_cast<uint64_t>(c.run.seed) * 7919 + 17;
  s.eval_seed = s.data_seed ^ 0x5eedull;
  s.decay_iters = c.train.decay_iters ? c.train.decay_iters : c.train.iters;
  const double tokens_per_iter =
      static_cast<double>(c.train.batch_size * c.train.grad_accum_steps * c.model.context);
  const double flops_per_iter = s.model->flops_per_token(c.model.context) * tokens_per_iter;
  // MFU: the global batch's flops against the peak of all `world` GPUs.
  const double peak = s.dev.is_cuda() ? peak_flops(device_label(s.dev), is_half(s.dt)) *
                                            static_cast<double>(s.world)
                                      : 0.0;
  s.progress = std::make_unique<Progress>(!s.opt.quiet && s.lead, c.train.iters,
                                          c.run.eval_every, tokens_per_iter, flops_per_iter, peak);
}

// Weights, optimizer state, RNG offset and data cursor from the checkpoint; the branch
// set-aside; then (only now that the checkpoint loaded) the run's config.toml and record.
void Trainer::restore() {
  State& s = *s_;
  if (!s.resume_dir.empty()) {
    const TrainState& st = s.resumed;
    load_tensors_into((fs::path(s.resume_dir) / "model.safetensors").string(),
                      s.model->stored_view(values_of(s.params)));
    const std::string optim_file = (fs::path(s.resume_dir) / "optim.safetensors").string();
    if (s.zero) {  // Note [ZeRO-1]: the whole state read, this rank's slices kept
      s.zero->load_params();
      const NamedTensors full = s.zero->state_templates();
      load_tensors_into(optim_file, s.model->stored_view(full), /*allow_cast=*/false);
      s.zero->scatter_state(full, s.optim->state());
    } else {
      load_tensors_into(optim_file, s.model->stored_view(s.optim->state()), /*allow_cast=*/false);
    }
    s.optim->set_counters(st.optim_counters);
    if (s.scaler->enabled()) s.scaler->set_state(st.loss_scaler);
    s.rng->set_offset(st.rng_offset);
    s.cursor = st.data_cursor;
    s.start_iter = st.iter;
    s.best_val = st.best_val;
    if (s.lead)
      s.branch = set_aside_newer_checkpoints(s.run_dir, st.iter, fs::path(s.resume_dir).filename());
  }
  if (s.resume_dir.empty() && !s.opt.init_from.empty()) init_weights();
  if (s.lead) std::ofstream(fs::path(s.run_dir) / "config.toml") << s.cfg.to_toml(resolved_values());
  s.record = std::make_unique<RunRecord>(s.run_dir, s.lead,
                                         s.resume_dir.empty() ? -1 : s.start_iter);
  s.end_iter = s.opt.stop_after > 0 ? std::min(s.cfg.train.iters, s.start_iter + s.opt.stop_after)
                                    : s.cfg.train.iters;
}

void Trainer::announce() const {
  const State& s = *s_;
  const Config& c = s.cfg;
  if (!s.progress->shown()) return;
  std::ostringstream os;
  os << "fused-ffn train: " << device_label(s.dev)
     << (s.world > 1 ? " x " + std::to_string(s.world) + " processes (NCCL)" : "") << " | "
     << dtype_name(s.dt) << " | " << s.data.describe;
  s.progress->line(os.str());
  const GptConfig& g = s.model->config();
  const std::string vocab_text =
      std::to_string(g.vocab_size) +
      (g.padded_vocab() > g.vocab_size ? " (LM head padded to " + std::to_string(g.padded_vocab()) + ")"
                                       : std::string());
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "model: %s %lld layers, %lld heads, d_model %lld, context %lld, ffn %s, vocab "
                "%s, %.2fM params | batch %s (%s tokens/iter) | run dir %s",
                c.model.arch == Arch::llama ? "Llama" : "GPT",
                static_cast<long long>(c.model.layers), static_cast<long long>(c.model.heads),
                static_cast<long long>(c.model.d_model), static_cast<long long>(c.model.context),
                name_of(kFfnKindNames, c.model.ffn), vocab_text.c_str(),
                static_cast<double>(s.model->stored_parameters()) / 1e6,
                (c.train.grad_accum_steps > 1
                     ? std::to_string(c.train.batch_size) + " x " +
                           std::to_string(c.train.grad_accum_steps) + " micro-batches = " +
                           std::to_string(c.train.batch_size * c.train.grad_accum_steps)
                     : std::to_string(c.train.batch_size))
                    .c_str(),
                format_count(static_cast<double>(c.train.batch_size * c.train.grad_accum_steps *
                                                 c.model.context))
                    .c_str(),
                s.run_dir.c_str());
  s.progress->line(buf);
  if (!s.resume_dir.empty())
    s.progress->line("resumed from " + s.resume_dir + " at iter " + std::to_string(s.start_iter));
  if (!s.branch.empty())
    s.progress->line("resumed from an older checkpoint: the newer ones moved to " + s.branch);
  if (s.zero) {
    double held = 0, full = 0;  // optimizer state bytes: this rank's, and without ZeRO
    for (const auto& [n, t] : s.optim->state()) held += static_cast<double>(t.nbytes());
    for (const auto& [n, v] : s.params) {
      const Tensor& p = v.value();
      full += static_cast<double>(p.numel()) *
              (2.0 * static_cast<double>(dtype_size(acc_dtype(p.dtype()))) +
               (is_half(p.dtype()) ? 4.0 : 0.0));
    }
    s.progress->line("ZeRO-1: AdamW's state sharded over " + std::to_string(s.world) +
                     " ranks; rank 0 updates " +
                     format_count(static_cast<double>(s.zero->owned_numel())) + " of " +
                     format_count(static_cast<double>(s.model->num_parameters())) +
                     " parameters and holds " + format_bytes(held) + " of optimizer state (" +
                     format_bytes(full) + " without ZeRO; Note [ZeRO-1])");
  }
}

// --init-from: the weights of a file in any layout (Note [Weight layouts]), checked against
// the config's model tensor by tensor; position embeddings may be longer than the context
// (GPT-2's 1024 for a shorter fine-tuning context: the first rows are used).
void Trainer::init_weights() {
  State& s = *s_;
  std::string file;
  // Llama runs store HF Llama's names natively (layers/llama.h); GPT runs read any GPT layout.
  NamedTensors src = read_weights(s.opt.init_from, &file);
  if (s.cfg.model.arch != Arch::llama) src = to_ffn_layout(src, s.opt.init_from);
  std::map<std::string, Tensor> by_name(src.begin(), src.end());
  // 16-bit parameters have fp32 masters in AdamW, made from the random init: they take the
  // file's values too (at the file's precision).
  std::map<std::string, Tensor> masters;
  // Under ZeRO-1 the masters are the slices': gathered, set, and scattered back below.
  const NamedTensors state = s.zero ? s.zero->gather_state(s.optim->state()) : s.optim->state();
  for (const auto& [n, t] : s.model->stored_view(state))
    if (n.size() > 7 && n.compare(n.size() - 7, 7, ".master") == 0) masters[n.substr(0, n.size() - 7)] = t;
  for (auto& [name, dst] : s.model->stored_view(values_of(s.params))) {
    auto it = by_name.find(name);
    if (it == by_name.end())
      config_error("--init-from: '" + file + "' has no tensor for '" + name +
                   "' (a different model.ffn or model.bias?)");
    Tensor t = it->second;
    if (name == "wpe.weight" && t.dim() == 2 && t.size(0) > dst.size(0) && t.size(1) == dst.size(1))
      t = t.narrow(0, 0, dst.size(0)).contiguous();
    if (t.shape() != dst.shape())
      config_error("--init-from: '" + file + "': tensor '" + name + "' is " +
                   shape_str(t.shape()) + " but this config's model has " +
                   shape_str(dst.shape()) +
                   " (check model.vocab_size, context, layers, d_model and ffn_mult)");
    dst.copy_(t);
    if (auto m = masters.find(name); m != masters.end()) m->second.copy_(t);
    by_name.erase(it);
  }
  if (!by_name.empty())
    config_error("--init-from: '" + file + "' has tensors this config's model does not (e.g. '" +
                 by_name.begin()->first + "'): model.layers or model.bias differ?");
  if (s.zero) {
    s.zero->load_params();
    s.zero->scatter_state(state, s.optim->state());
  }
  if (s.lead) std::fprintf(stderr, "[init] weights from %s\n", file.c_str());
}

// What the config's "auto" values became (comments in the run's config.toml).
std::map<std::string, std::string> Trainer::resolved_values() const {
  const State& s = *s_;
  return {{"runtime.device", s.dev.str()}, {"runtime.precision", dtype_name(s.dt)}};
}

// Every rank calls it at the same iterations: under ZeRO-1 the optimizer state is first
// gathered from its owners (a collective); rank 0 writes.
std::string Trainer::checkpoint(int64_t done) {
  State& s = *s_;
  const NamedTensors optim = s.zero ? s.zero->gather_state(s.optim->state()) : s.optim->state();
  s.last_checkpoint_iter = done;
  if (!s.lead) return {};
  TrainState t;
  t.iter = done;
  t.rng_seed = s.rng->seed();
  t.rng_offset = s.rng->offset();
  t.data_cursor = s.cursor;
  t.optim_counters = s.optim->counters();
  t.loss_scaler = s.scaler->state();
  t.best_val = s.best_val;
  t.world = s.world;
  t.vocab = s.data.chars;
  s.last_checkpoint = save_checkpoint(
      s.run_dir, t, s.model->stored_view(values_of(s.params)), s.model->stored_view(optim),
      s.cfg.to_toml(resolved_values()), s.cfg.run.keep_checkpoints);
  return s.last_checkpoint;
}

void Trainer::evaluate(int64_t done) {
  State& s = *s_;
  const auto t0 = std::chrono::steady_clock::now();
  const double val = estimate_loss(*s.model, s.data.val, s.cfg, s.eval_seed, s.dev, s.comm);
  const double tr = estimate_loss(*s.model, s.data.train, s.cfg, s.eval_seed + 1, s.dev, s.comm);
  if (s.world > 1) check_replicas(s.params, *s.comm, s.dev, done);
  s.progress->add_eval_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  s.best_val = std::min(s.best_val, val);
  if (std::isnan(s.first_val)) s.first_val = val;
  s.last_val = val;
  s.record->eval(done, val, tr, s.best_val);
  s.progress->eval_line(done, val, tr, s.best_val);
}

bool Trainer::eval_after(int64_t done) const {
  return done % s_->cfg.run.eval_every == 0 || done == s_->cfg.train.iters;
}

bool Trainer::checkpoint_after(int64_t done) const {
  const RunSection& r = s_->cfg.run;
  return done == s_->end_iter ||
         (r.checkpoint_every > 0 ? done % r.checkpoint_every == 0 : eval_after(done));
}

// What is known of a step once its optimizer outcome is back (Note [Device-side step
// decision]): its time, logs, and the eval and checkpoint that follow it.
void Trainer::finish_step(int64_t done, double lr) {
  State& s = *s_;
  StepReport rep;
  if (s.profiling) {  // Note [Communication profile]: the first kProfiledSteps steps
    for (CommEvent& e : s.comm->profile_collect()) s.comm_events.push_back(std::move(e));
    if (done - s.start_iter >= kProfiledSteps) s.comm->profile_stop();
  }
  try {
    rep = s.optim->finish();
  } catch (const Error& e) {
    throw Error("[train] iter " + std::to_string(done) + ": " + e.what(), e.kind());
  }
  s.scaler->update(rep.skipped);
  s.last_loss = rep.loss;
  s.progress->step_finished();
  if (done % s.cfg.run.log_every == 0 || done == s.end_iter || rep.skipped) {
    const WindowStats w = s.progress->window();
    s.record->step(done, rep.loss, lr, rep.grad_norm, w, s.optim->skipped());
    s.progress->step_line(done, s.end_iter, rep.loss, lr, w, rep.skipped);
  }
  const bool eval_now = eval_after(done), ckpt_now = checkpoint_after(done);
  if (eval_now) evaluate(done);
  if (ckpt_now) {
    const std::string dir = checkpoint(done);
    if (done == s.end_iter) s.progress->line("checkpoint: " + dir);
  }
  if (eval_now || ckpt_now) s.progress->restart_clock();  // steps exclude evals and saves
}

// Queues one step's forward, backward and optimizer update; finishes it at once or after
// the next step is queued.
void Trainer::step(int64_t it) {
  State& s = *s_;
  const Config& c = s.cfg;
  const double lr = lr_at(c.train.schedule, it, c.train.lr, c.train.min_lr, c.train.warmup,
                          s.decay_iters);
  // The previous step's collectives (Note [Deferred collective check]): its update is
  // queued behind them, so the GPU stays busy while the host polls, and nothing below
  // (the batch upload waits for the compute stream) can block on a lost peer.
  if (s.comm) s.comm->sync_through(s.comm_mark);
  if (s.comm) s.comm->set_step(it + 1);
  if (s.profiling) s.comm->profile_point("step");
  // Note [Gradient accumulation]: micro-batch j of the step is shard j·world + rank of one
  // global batch of batch_size · A sequences drawn at the step's cursor, so A micro-batches
  // of B are the rows of one batch of A·B (A = 1: exactly the batches without accumulation).
  // Each backward is seeded with scale / A; the earlier micro-batches' gradients are summed
  // into fp32 buffers as each leaf finishes (and zeroed), the last one's leaf hook adds that
  // sum back (one rounding to the parameter dtype) before its data-parallel all-reduce.
  const int64_t A = c.train.grad_accum_steps;
  Tensor lt;
  for (int64_t j = 0; j < A; ++j) {
    const Batch b = sample_batch(s.data.train, c.train.batch_size * A, c.model.context,
                                 s.data_seed, s.cursor, static_cast<int>(j) * s.world + s.rank,
                                 static_cast<int>(A) * s.world);
    const bool last = j == A - 1;
    // Every token is < vocab_size (Note [Token ids in range]), so the per-step GPU range
    // checks and their syncs are skipped.
    Var loss = s.model->loss(b.x.to(s.dev), b.y.to(s.dev), /*ids_in_range=*/true);
    const Tensor seed = Tensor::full({}, s.scaler->scale() / static_cast<double>(A),
                                     loss.value().dtype(), s.dev);
    if (A == 1) {
      lt = loss.value().reshape({1});
    } else {
      if (j == 0) lt = Tensor::zeros({1}, DType::f32, s.dev);
      lt.add_(loss.value().reshape({1}), 1.0 / static_cast<double>(A));
    }
    Var::LeafHook hook;
    if (A > 1 && !last) {
      hook = [&s](const Var& v) {
        auto k = s.param_index.find(v.impl());
        if (k == s.param_index.end()) return;
        s.grad_acc[k->second].add_(v.grad());
        Tensor g = v.grad();
        g.zero_();
      };
    } else if (A > 1) {
      Var::LeafHook sync = s.sync ? s.sync->hook() : Var::LeafHook();
      hook = [&s, sync](const Var& v) {
        auto k = s.param_index.find(v.impl());
        if (k != s.param_index.end()) {
          Tensor g = v.grad();
          g.add_(s.grad_acc[k->second]);
          s.grad_acc[k->second].zero_();
        }
        if (sync) sync(v);
      };
    } else if (s.sync) {
      hook = s.sync->hook();
    }
    if (hook)
      loss.backward(seed, hook);
    else
      loss.backward(seed);
    loss = Var();
  }
  ++s.cursor;
  if (s.sync) {
    if (s.profiling) s.comm->profile_point("backward");
    s.sync->finish();  // averaged gradients on every rank
    s.buckets_total += s.sync->last().buckets;
    s.buckets_overlapped += s.sync->last().launched_in_backward;
    lt = lt.clone();
    s.comm->all_reduce(lt, true, "loss");  // a non-finite loss on any rank reaches all
    s.comm->wait();                        // the update reads the averaged loss
    if (s.zero) {  // Note [ZeRO-1]: the slices' gradients are this rank's chunks
      for (auto& [n, p] : s.params) p.zero_grad();
      s.zero->bind_grads();
    }
    if (s.profiling) s.comm->profile_point("synced");
  }
  if (s.pending) finish_step(s.pending->first, s.pending->second), s.pending.reset();
  s.optim->launch(lr, lt, s.scaler->scale());
  if (s.zero) s.zero->gather_params();  // Note [ZeRO-1]: all-gathered during the update
  if (s.profiling) s.comm->profile_point("optimizer");
  // Every collective of this step (ZeRO's norm and all-gathers included) is polled at the
  // start of the next one (Note [Deferred collective check]).
  if (s.comm) s.comm_mark = s.comm->enqueued();
  s.optim->zero_grad();
  const int64_t done = it + 1;
  // A step whose outcome nothing needs before the next step is queued is finished one
  // iteration later, after the next forward and backward are queued: the host then never
  // waits on an idle GPU. Finished at once: steps followed by an eval or checkpoint,
  // loss-scaled (fp16) steps (the next loss seed depends on the outcome) and CPU steps (the
  // step has already run, so there is nothing to overlap, and deferring would charge each
  // step its successor's forward and backward). A data-parallel step finished at once
  // first waits, polling, for its collectives (Note [NCCL timeouts]).
  const bool now =
      s.dev.is_cpu() || s.scaler->enabled() || eval_after(done) || checkpoint_after(done);
  if (now) {
    if (s.comm) s.comm->sync();
    finish_step(done, lr);
  } else {
    s.pending = std::make_pair(done, lr);
  }
}

// Note [Graceful stop]: the signal to stop on after `done` iterations, or 0; under data
// parallelism only every kStopAgreeEvery iterations, agreed by all ranks.
int Trainer::stop_requested(int64_t done) {
  State& s = *s_;
  const int local = stop_signal();
  if (done >= s.end_iter) return 0;  // finishing anyway
  if (s.world == 1) return local;
  if (done % kStopAgreeEvery != 0) return 0;
  Tensor flag = Tensor::full({1}, local ? 1.0 : 0.0, DType::f32, s.dev);
  s.comm->all_reduce(flag, false, "stop request");
  s.comm->sync();  // the sum, not the flag before it (it is reduced on the comm stream)
  return flag.to_vector()[0] > 0 ? (local ? local : SIGTERM) : 0;
}

TrainResult Trainer::run() {
  State& s = *s_;
  if (s.start_iter == 0)
    with_oom_context("evaluating the initial model", s.dev, [this] { evaluate(0); });
  int64_t done = s.end_iter;
  int stop = 0;
  for (int64_t it = s.start_iter; it < s.end_iter; ++it) {
    with_oom_context(
        [it] { return "in iteration " + std::to_string(it + 1) + " (forward, backward, update)"; },
        s.dev, [this, it] { step(it); });
    if (s.opt.after_step) s.opt.after_step(it + 1);
    if ((stop = stop_requested(it + 1)) != 0) {
      done = it + 1;
      break;
    }
  }
  if (s.pending) {
    if (s.comm) s.comm->sync();
    finish_step(s.pending->first, s.pending->second), s.pending.reset();
  }
  if (s.profiling) report_comm_profile(done);
  std::string ckpt = s.last_checkpoint;
  if (stop) {
    if (s.last_checkpoint_iter != done) ckpt = checkpoint(done);
    s.record->stopped(done, signal_name(stop));
  }
  s.progress->end();
  TrainResult res;
  res.run_dir = s.run_dir;
  res.iters_done = done;
  res.stop_signal = stop;
  res.last_checkpoint = ckpt;
  res.last_train_loss = s.last_loss;
  res.last_val_loss = s.last_val;
  res.first_val_loss = s.first_val;
  res.best_val_loss = s.best_val;
  res.skipped_steps = s.optim->skipped();
  res.world = s.world;
  res.overlap_share = s.buckets_total ? static_cast<double>(s.buckets_overlapped) /
                                            static_cast<double>(s.buckets_total)
                                      : 0.0;
  res.ms_per_iter = s.progress->median_ms();
  res.peak_bytes = memory_stats(s.dev).peak;
  if (res.ms_per_iter > 0)
    res.tokens_per_s = static_cast<double>(s.cfg.train.batch_size * s.cfg.train.grad_accum_steps *
                                           s.cfg.model.context) /
                       (res.ms_per_iter / 1e3);
  summarize(res);
  return res;
}

void Trainer::report_comm_profile(int64_t done) {
  State& s = *s_;
  for (CommEvent& e : s.comm->profile_collect()) s.comm_events.push_back(std::move(e));
  // The first steps warm up (allocator, GEMM choices); the median takes care of evals.
  const CommProfile p = summarize_comm_profile(s.comm_events, 5);
  s.record->note(done, comm_profile_fields(p));
  if (s.lead) std::printf("%s", format_comm_profile(p).c_str());
}

void Trainer::summarize(const TrainResult& res) const {
  const State& s = *s_;
  if (!s.progress->shown()) return;
  if (s.world > 1) {
    char buf[160];
    std::snprintf(buf, sizeof(buf),
                  "data parallel: %d processes, %.0f%% of gradient buckets reduced while backward "
                  "was still running", s.world, 100 * res.overlap_share);
    std::printf("%s\n", buf);
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - s.t_start).count();
  if (res.stop_signal) {
    std::printf("stopped by %s at iter %lld of %lld (not finished): checkpoint %s\n"
                "continue with: ffn-train --resume %s\n",
                signal_name(res.stop_signal), static_cast<long long>(res.iters_done),
                static_cast<long long>(s.cfg.train.iters), res.last_checkpoint.c_str(),
                s.run_dir.c_str());
    return;
  }
  std::printf("done: %lld iters in %s | best val loss %.4f | median %.1f ms/iter (%s tok/s) | "
              "peak memory %s | %lld skipped steps | curve: %s/loss.svg\n",
              static_cast<long long>(s.end_iter), format_duration(secs).c_str(), res.best_val_loss,
              res.ms_per_iter, format_count(res.tokens_per_s).c_str(),
              format_bytes(static_cast<double>(res.peak_bytes)).c_str(),
              static_cast<long long>(res.skipped_steps), s.run_dir.c_str());
}

}  // namespace ffn::train
