// train/trainer_setup.cpp — everything a Trainer does before its first step (train/trainer.h):
// place, validate the run, prepare the run dir, connect, build, restore (or --init-from) and
// announce. The loop itself is train/trainer.cpp.
#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
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
#include "train/data.h"
#include "train/dist/ddp.h"
#include "train/dist/dist.h"
#include "train/dist/zero.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "train/run_dir.h"
#include "train/weights.h"

#if FFN_WITH_CUDA
#include "core/cuda/context.h"
#endif
#include "train/trainer_state.h"

namespace fs = std::filesystem;

namespace ffn::train {

using detail::with_oom_context;

namespace {

std::string device_label(Device dev) {
#if FFN_WITH_CUDA
  if (dev.is_cuda()) return std::string(cuda::properties(dev.index).name) + " (" + dev.str() + ")";
#endif
  return "CPU (" + std::to_string(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN))) + " cores)";
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
  g.fused_classifier = c.runtime.fused_classifier;
  g.classifier_chunk = c.runtime.classifier_chunk;
  g.place = ParamInit{dt, dev};
  return g;
}

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
  // Timed GEMM autotuning would pick its algorithms anew in a resumed process; the choices
  // travel in the checkpoints instead (Note [GEMM choices], restore() below).
  set_gemm_autotune(s.cfg.runtime.gemm_autotune);
  set_gemm_epilogues(s.cfg.runtime.gemm_epilogues);
  // Note [Dynamic unit order]: beside NCCL's kernels the activation GEMMs take tiles from a
  // counter; on one GPU the static order is faster.
  set_gemm_dynamic_order(s.world > 1);
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
  // Note [Copy-engine gradient reduction]
  const bool copy_engine = s.opt.grad_reduce == "copy-engine";
  FFN_CHECK(!copy_engine || nccl_has_copy_engine(),
            "[ddp] --grad-reduce copy-engine needs NCCL >= 2.28 (this process has an older one)");
  s.owned_comm = make_nccl_comm(s.rank, s.world, s.dev.index, id,
                                NcclOptions{s.opt.comm_timeout_s, copy_engine});
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
  // Note [CUDA graph step]: what keeps a GPU run's step from being captured, if anything.
  // A data-parallel step is captured with its collectives (Note [Captured collectives]).
  if (!s.dev.is_cuda())
    s.graph_off = "not a GPU run";
  else if (!c.runtime.cuda_graph)
    s.graph_off = "runtime.cuda_graph = false";
  else if (s.profiling)
    s.graph_off = "--profile-comm (its timing events are not replayed)";
  else if (s.scaler->enabled())
    s.graph_off = "fp16 loss scaling (the scale changes between steps)";
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
    restore_gemm_choices_from(s.resume_dir);
  }
  if (s.resume_dir.empty() && !s.opt.init_from.empty()) init_weights();
  if (s.lead) std::ofstream(fs::path(s.run_dir) / "config.toml") << s.cfg.to_toml(resolved_values());
  s.record = std::make_unique<RunRecord>(s.run_dir, s.lead,
                                         s.resume_dir.empty() ? -1 : s.start_iter);
  s.end_iter = s.opt.stop_after > 0 ? std::min(s.cfg.train.iters, s.start_iter + s.opt.stop_after)
                                    : s.cfg.train.iters;
}

// Note [GEMM choices]: the checkpoint's tuned GEMM algorithms, so the resumed steps compute
// what the uninterrupted run computed. Every rank reads the same file (rank 0's choices,
// which every rank took after the first step, Trainer::step).
void Trainer::restore_gemm_choices_from(const std::string& ckpt_dir) {
  State& s = *s_;
  if (!s.dev.is_cuda() || !gemm_autotune()) return;
  const std::string file = (fs::path(ckpt_dir) / "gemm_choices.txt").string();
  const std::string text = read_gemm_choices(ckpt_dir);
  std::string line;
  if (text.empty()) {
    line = "[resume] " + file +
           " does not exist (a checkpoint from before session 18, or a "
           "run with runtime.gemm_autotune = false): the GEMMs are tuned anew, so the resumed "
           "steps may differ from an uninterrupted run in the last bits";
  } else {
    RestoredGemmChoices r;
    try {
      r = restore_gemm_choices(text, file, /*replace=*/true);
    } catch (const Error& e) {
      throw Error(std::string(e.what()) +
                      "\n  (remove that file to resume with the GEMMs tuned anew; the resumed "
                      "steps may then differ from an uninterrupted run in the last bits)",
                  e.kind());
    }
    line = r.skipped.empty()
               ? "[resume] " + std::to_string(r.count) + " tuned GEMM algorithm(s) from " + file
               : "[resume] " + file + " was " + r.skipped +
                     ": the GEMMs are tuned anew, so the resumed steps may differ from an "
                     "uninterrupted run in the last bits";
  }
  if (s.lead) std::fprintf(stderr, "%s\n", line.c_str());
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
  if (s.dev.is_cuda())
    s.progress->line(s.graph_off.empty()
                         ? "CUDA graph: the step is captured at iter " +
                               std::to_string(s.start_iter + 2) + " and replayed after it"
                         : "CUDA graph: off, " + s.graph_off);
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

}  // namespace ffn::train
