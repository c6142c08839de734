// train/trainer.cpp — the training loop (train/trainer.h).
#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "core/generator.h"
#include "kernels/gemm.h"
#include "layers/transformer.h"
#include "optim/adamw.h"
#include "train/checkpoint.h"
#include "train/comm.h"
#include "train/data.h"
#include "train/ddp.h"
#include "train/dist.h"
#include "train/json.h"
#include "train/metrics.h"
#include "train/run_dir.h"

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
  g.context = c.model.context;
  g.layers = c.model.layers;
  g.heads = c.model.heads;
  g.d_model = c.model.d_model;
  g.ffn = c.model.ffn;
  g.ffn_mult = c.model.ffn_mult;
  g.dropout = static_cast<float>(c.model.dropout);
  g.bias = c.model.bias;
  g.fp32_residual = c.runtime.fp32_residual;
  g.fused_attention = c.runtime.fused_attention;
  g.place = ParamInit{dt, dev};
  return g;
}

TrainResult run_training(const Config& cfg, const TrainOptions& opt) {
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  const bool tty = !opt.quiet && isatty(fileno(stdout));
  // Everything that can be a config error is decided before device memory is touched.
  const DistEnv denv = opt.comm ? DistEnv{} : dist_env_from_environment();
  const int world = opt.comm ? opt.comm->world() : denv.world;
  const int rank = opt.comm ? opt.comm->rank() : denv.rank;
  if (world != cfg.runtime.nproc && cfg.train.batch_size % world != 0)  // launched from the env
    config_error("train.batch_size: the global batch " + std::to_string(cfg.train.batch_size) +
                 " is not divisible by the " + std::to_string(world) + " processes");
  Device dev = resolve_device(cfg.runtime.device, "runtime.device");
  if (world > 1 && !opt.comm) {
    if (!dev.is_cuda())
      config_error("runtime.device: data parallelism across processes needs GPUs (NCCL); got \"" +
                   cfg.runtime.device.str() + "\"");
    dev = resolve_device({Device::cuda(denv.local_rank)}, "LOCAL_RANK");
  }
  const bool lead = rank == 0;  // logs, metrics, pictures and checkpoints come from rank 0
  const DType dt = compute_dtype(cfg.runtime.precision, dev);
  // Timed GEMM autotuning may pick different algorithms in another process, which would
  // break bit-exact resume; it is opt-in for training runs.
  set_gemm_autotune(cfg.runtime.gemm_autotune);
  const std::string run_dir = cfg.run.dir;
  std::string resume_dir;
  if (!opt.resume.empty()) {
    // Note [Run directory ownership]: a resume continues in the checkpoint's own run.
    const ResumePoint at = resolve_resume(opt.resume);
    check_resume_config(cfg, at);
    resume_dir = at.ckpt_dir;
  }
  if (resume_dir.empty() && has_checkpoints(run_dir) && !opt.overwrite)
    config_error("run.dir: '" + run_dir + "' already holds checkpoints; continue it with --resume " +
                 run_dir + ", or start over with --overwrite, or pick another --set run.dir=...");
  Dataset data = load_dataset(cfg.data, cfg.model.context);
  int64_t vocab = cfg.model.vocab_size ? cfg.model.vocab_size : data.vocab_size;
  check_vocab(data, cfg.data, vocab);
  check_step_fits(cfg, vocab, dev, dt, world);
  TrainState state;
  if (!resume_dir.empty()) {
    state = read_train_state(resume_dir);
    if (state.world != world)
      config_error("runtime.nproc: the checkpoint was written by " + std::to_string(state.world) +
                   " process(es) and this run has " + std::to_string(world) +
                   "; resume with the same world size (the data order and dropout streams "
                   "depend on it)");
    if (!data.chars.empty() && state.vocab != data.chars)
      config_error("data: the text's vocabulary differs from the checkpoint's");
  }
  // From here on this process writes the run (Note [Run directory ownership]).
  std::optional<RunLock> lock;
  if (lead) lock.emplace(run_dir);
  if (lead && opt.overwrite && resume_dir.empty()) {
    for (const auto& e : fs::directory_iterator(run_dir)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("ckpt-", 0) == 0 || n.rfind("branch-", 0) == 0 || n == "latest" ||
          n == "metrics.jsonl" || n == "loss.svg")
        fs::remove_all(e.path());
    }
  }
  // The communicator (joins the other ranks; a missing peer is a timeout error).
  std::unique_ptr<Comm> owned_comm;
  Comm* comm = opt.comm;
  if (world > 1 && !comm) {
#if FFN_WITH_NCCL
    const std::string id = rendezvous(denv, lead ? nccl_unique_id() : std::string(),
                                      opt.rendezvous_timeout_s);
    owned_comm = make_nccl_comm(rank, world, dev.index, id, NcclOptions{opt.comm_timeout_s});
    comm = owned_comm.get();
#else
    config_error("runtime.nproc: this build has no NCCL, so it cannot run several processes");
#endif
  }

  // Model, optimizer and RNG.
  Generator init(static_cast<uint64_t>(cfg.run.seed));
  // Dropout streams: (seed, rank) pick the generator, the step and layer its offset, so
  // ranks draw different masks and a run is reproducible for a given world size.
  auto rng = std::make_shared<Generator>(static_cast<uint64_t>(cfg.run.seed) + 1 +
                                         static_cast<uint64_t>(rank) * 1000003ull);
  GPT model(gpt_config(cfg, vocab, dev, dt), rng, init);
  AdamWOptions ao;
  ao.hyper = AdamWHyper{cfg.train.lr, cfg.train.beta1, cfg.train.beta2, cfg.train.eps,
                        cfg.train.weight_decay};
  ao.decay_matrices_only = cfg.train.decay_matrices_only;
  ao.grad_clip = cfg.train.grad_clip;
  ao.max_nonfinite_in_row = static_cast<int>(cfg.train.max_nonfinite);
  const auto params = model.named_parameters();
  AdamW optim(params, ao);
  LossScaler scaler(dt == DType::f16);
  std::unique_ptr<GradSync> sync;
  if (world > 1) sync = std::make_unique<GradSync>(params, *comm, opt.bucket_mb << 20);
  int64_t buckets_total = 0, buckets_overlapped = 0;
  uint64_t cursor = 0;
  int64_t start_iter = 0;
  double best_val = INFINITY;
  if (!resume_dir.empty()) {
    load_tensors_into((fs::path(resume_dir) / "model.safetensors").string(), values_of(params));
    load_tensors_into((fs::path(resume_dir) / "optim.safetensors").string(), optim.state());
    optim.set_counters(state.optim_counters);
    if (scaler.enabled()) scaler.set_state(state.loss_scaler);
    rng->set_offset(state.rng_offset);
    cursor = state.data_cursor;
    start_iter = state.iter;
    best_val = state.best_val;
  }
  std::string branch;
  if (lead && !resume_dir.empty())
    branch = set_aside_newer_checkpoints(run_dir, state.iter, fs::path(resume_dir).filename());
  // Written only once the checkpoint has loaded: a failed resume leaves the run as it was.
  if (lead) std::ofstream(fs::path(run_dir) / "config.toml") << cfg.to_toml();
  const uint64_t data_seed = static_cast<uint64_t>(cfg.run.seed) * 7919 + 17;
  const uint64_t eval_seed = data_seed ^ 0x5eedull;
  const int64_t iters = cfg.train.iters;
  const int64_t decay_iters = cfg.train.decay_iters ? cfg.train.decay_iters : iters;
  const LrSchedule sched = cfg.train.schedule;
  const int64_t tokens_per_iter = cfg.train.batch_size * cfg.model.context;
  const double flops_per_iter = model.flops_per_token(cfg.model.context) * tokens_per_iter;
  // MFU: the global batch's flops against the peak of all `world` GPUs.
  const double peak =
      dev.is_cuda() ? peak_flops(device_label(dev), is_half(dt)) * static_cast<double>(world) : 0.0;

  const bool show = !opt.quiet && lead;
  if (show) {
    std::printf("fused-ffn train: %s%s | %s | %s\n", device_label(dev).c_str(),
                world > 1 ? (" x " + std::to_string(world) + " processes (NCCL)").c_str() : "",
                dtype_name(dt), data.describe.c_str());
    std::printf("model: GPT %lld layers, %lld heads, d_model %lld, context %lld, ffn %s, %.2fM "
                "params | batch %lld (%s tokens/iter) | run dir %s\n",
                static_cast<long long>(cfg.model.layers), static_cast<long long>(cfg.model.heads),
                static_cast<long long>(cfg.model.d_model),
                static_cast<long long>(cfg.model.context), name_of(kFfnKindNames, cfg.model.ffn),
                static_cast<double>(model.num_parameters()) / 1e6,
                static_cast<long long>(cfg.train.batch_size),
                format_count(static_cast<double>(tokens_per_iter)).c_str(), run_dir.c_str());
    if (!resume_dir.empty())
      std::printf("resumed from %s at iter %lld\n", resume_dir.c_str(),
                  static_cast<long long>(start_iter));
    if (!branch.empty())
      std::printf("resumed from an older checkpoint: the newer ones moved to %s\n",
                  branch.c_str());
    std::fflush(stdout);
  }

  // Curves for the picture: on resume, keep (and reread) what earlier processes logged up
  // to the checkpoint; later lines came from iterations that are about to be redone.
  Curve train_curve{"train", "#1f77b4", {}}, val_curve{"val", "#d62728", {}};
  const std::string metrics_path = (fs::path(run_dir) / "metrics.jsonl").string();
  if (lead && !resume_dir.empty() && fs::exists(metrics_path)) {
    std::ifstream in(metrics_path);
    std::string line, kept;
    while (std::getline(in, line)) {
      json::Value v;
      try {
        v = json::parse(line, metrics_path);
      } catch (const Error&) {
        continue;  // a line cut short by a crash
      }
      const json::Value* iter = v.find("iter");
      if (!iter || iter->integer > start_iter) continue;
      kept += line + "\n";
      const double x = static_cast<double>(iter->integer);
      if (const json::Value* t = v.find("train_loss")) train_curve.points.emplace_back(x, t->num);
      if (const json::Value* t = v.find("val_loss")) val_curve.points.emplace_back(x, t->num);
    }
    in.close();
    std::ofstream(metrics_path, std::ios::trunc) << kept;
  }
  std::unique_ptr<MetricsLog> metrics_log;
  if (lead) metrics_log = std::make_unique<MetricsLog>(metrics_path);
  auto log_metrics = [&](const std::vector<std::pair<std::string, std::string>>& f) {
    if (metrics_log) metrics_log->write(f);
  };
  TrainResult res;
  res.run_dir = run_dir;
  res.last_val_loss = NAN;
  res.first_val_loss = NAN;
  std::vector<double> iter_ms;
  double window_ms = 0, ema_ms = 0;
  int64_t window_n = 0;
  double eval_seconds = 0;
  int64_t evals_done = 0;

  auto checkpoint = [&](int64_t done) {
    TrainState s;
    s.iter = done;
    s.rng_seed = rng->seed();
    s.rng_offset = rng->offset();
    s.data_cursor = cursor;
    s.optim_counters = optim.counters();
    s.loss_scaler = scaler.state();
    s.best_val = best_val;
    s.world = world;
    s.vocab = data.chars;
    if (!lead) return std::string();
    return save_checkpoint(run_dir, s, values_of(params), optim.state(), cfg.to_toml(),
                           cfg.run.keep_checkpoints);
  };
  auto evaluate = [&](int64_t done) {
    const auto t0 = clock::now();
    const double val = estimate_loss(model, data.val, cfg, eval_seed, dev, comm);
    const double tr = estimate_loss(model, data.train, cfg, eval_seed + 1, dev, comm);
    if (world > 1) check_replicas(params, *comm, dev, done);
    eval_seconds += std::chrono::duration<double>(clock::now() - t0).count();
    ++evals_done;
    best_val = std::min(best_val, val);
    if (std::isnan(res.first_val_loss)) res.first_val_loss = val;
    res.last_val_loss = val;
    log_metrics({{"iter", std::to_string(done)},
                   {"val_loss", json_number(val)},
                   {"train_eval_loss", json_number(tr)},
                   {"best_val_loss", json_number(best_val)}});
    val_curve.points.emplace_back(static_cast<double>(done), val);
    if (lead)
      write_loss_svg((fs::path(run_dir) / "loss.svg").string(), {train_curve, val_curve},
                     "fused-ffn: " + run_dir);
    if (show) {
      std::printf("%seval @ iter %lld: val loss %.4f, train loss %.4f (best val %.4f)\n",
                  tty ? "\r\033[K" : "", static_cast<long long>(done), val, tr, best_val);
      std::fflush(stdout);
    }
  };

  const int64_t end_iter =
      opt.stop_after > 0 ? std::min(iters, start_iter + opt.stop_after) : iters;
  if (start_iter == 0) evaluate(0);
  double last_loss = NAN;
  // What is known of a step once its optimizer outcome is back (Note [Device-side step
  // decision]): logs, and the eval and checkpoint that follow it.
  struct Launched {
    int64_t done;
    double lr;
  };
  auto eval_after = [&](int64_t done) { return done % cfg.run.eval_every == 0 || done == iters; };
  auto checkpoint_after = [&](int64_t done) {
    return done == end_iter || (cfg.run.checkpoint_every > 0 ? done % cfg.run.checkpoint_every == 0
                                                             : eval_after(done));
  };
  auto mark = clock::now();  // when the previous step's outcome came back
  auto finish_step = [&](const Launched& st) {
    StepReport rep;
    try {
      rep = optim.finish();
    } catch (const Error& e) {
      throw Error("[train] iter " + std::to_string(st.done) + ": " + e.what(), e.kind());
    }
    scaler.update(rep.skipped);
    const double lv = rep.loss;
    last_loss = lv;
    const auto now = clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - mark).count();
    mark = now;
    iter_ms.push_back(ms);
    window_ms += ms;
    ++window_n;
    ema_ms = ema_ms == 0 ? ms : 0.9 * ema_ms + 0.1 * ms;
    const int64_t done = st.done;
    if (done % cfg.run.log_every == 0 || done == end_iter || rep.skipped) {
      const double avg = window_ms / static_cast<double>(window_n);
      const double tps = static_cast<double>(tokens_per_iter) / (avg / 1e3);
      const double mfu = peak > 0 ? flops_per_iter / (avg / 1e3) / peak : NAN;
      window_ms = 0, window_n = 0;
      train_curve.points.emplace_back(static_cast<double>(done), lv);
      log_metrics({{"iter", std::to_string(done)},
                     {"train_loss", json_number(lv)},
                     {"lr", json_number(st.lr)},
                     {"grad_norm", json_number(rep.grad_norm)},
                     {"ms_per_iter", json_number(avg)},
                     {"tokens_per_s", json_number(tps)},
                     {"mfu", json_number(mfu)},
                     {"skipped_steps", std::to_string(optim.skipped())}});
      if (show) {
        const int64_t left = end_iter - done;
        const double evals_left = static_cast<double>(left / cfg.run.eval_every + 1);
        const double per_eval = evals_done ? eval_seconds / static_cast<double>(evals_done) : 0.0;
        const double eta = static_cast<double>(left) * ema_ms / 1e3 + evals_left * per_eval;
        char mfu_s[32] = "";
        if (peak > 0) std::snprintf(mfu_s, sizeof(mfu_s), " | MFU %4.1f%%", 100 * mfu);
        std::printf("%siter %lld/%lld | loss %.4f | lr %.2e | %s tok/s | %.1f ms/iter%s | ETA %s%s",
                    tty ? "\r\033[K" : "", static_cast<long long>(done),
                    static_cast<long long>(iters), lv, st.lr, format_count(tps).c_str(), avg,
                    mfu_s, format_duration(eta).c_str(),
                    rep.skipped ? " | step skipped (non-finite)" : "");
        std::printf(tty ? "" : "\n");
        std::fflush(stdout);
      }
    }
    const bool eval_now = eval_after(done), ckpt_now = checkpoint_after(done);
    if (eval_now) evaluate(done);
    if (ckpt_now) {
      const std::string dir = checkpoint(done);
      if (show && done == end_iter) {
        std::printf("%scheckpoint: %s\n", tty ? "\r\033[K" : "", dir.c_str());
        std::fflush(stdout);
      }
    }
    if (eval_now || ckpt_now) mark = clock::now();  // step times exclude evals and saves
  };
  // A step whose outcome nothing needs before the next step is queued is finished one
  // iteration later, after the next forward and backward are queued: the host then never
  // waits on an idle GPU. Steps followed by an eval or checkpoint, loss-scaled (fp16) steps
  // (the next loss seed depends on the outcome) and data-parallel steps (collectives are
  // polled for timeouts, Note [NCCL timeouts]) are finished at once.
  std::optional<Launched> pending;
  for (int64_t it = start_iter; it < end_iter; ++it) {
    const double lr = lr_at(sched, it, cfg.train.lr, cfg.train.min_lr, cfg.train.warmup, decay_iters);
    const Batch b = sample_batch(data.train, cfg.train.batch_size, cfg.model.context, data_seed,
                                 cursor++, rank, world);
    if (comm) comm->set_step(it + 1);
    // Every token is < vocab_size by construction (load_data; vocab checked above), so
    // the per-step GPU range checks and their syncs are skipped.
    Var loss = model.loss(b.x.to(dev), b.y.to(dev), /*ids_in_range=*/true);
    const Tensor seed = Tensor::full({}, scaler.scale(), loss.value().dtype(), dev);
    Tensor lt = loss.value().reshape({1});
    if (sync) {
      loss.backward(seed, sync->hook());
      sync->finish();  // averaged gradients on every rank
      buckets_total += sync->last().buckets;
      buckets_overlapped += sync->last().launched_in_backward;
      lt = lt.clone();
      comm->all_reduce(lt, true, "loss");  // a non-finite loss on any rank reaches all
      comm->sync();  // polls: a lost peer is an error, not a hang (Note [NCCL timeouts])
    } else {
      loss.backward(seed);
    }
    loss = Var();
    if (pending) finish_step(*pending), pending.reset();
    optim.launch(lr, lt, scaler.scale());
    optim.zero_grad();
    const int64_t done = it + 1;
    // On the CPU the step has already run, so there is nothing to overlap: finishing at once
    // also keeps each step's time its own (deferred, a step would be charged its successor's
    // forward and backward, and the step before a pause nothing).
    if (dev.is_cpu() || sync || scaler.enabled() || eval_after(done) || checkpoint_after(done))
      finish_step({done, lr});
    else
      pending = Launched{done, lr};
  }
  if (pending) finish_step(*pending);
  if (tty && lead) std::printf("\n");
  res.iters_done = end_iter;
  res.last_train_loss = last_loss;
  res.best_val_loss = best_val;
  res.skipped_steps = optim.skipped();
  res.world = world;
  res.overlap_share = buckets_total ? static_cast<double>(buckets_overlapped) /
                                          static_cast<double>(buckets_total)
                                    : 0.0;
  if (!iter_ms.empty()) {
    std::vector<double> s = iter_ms;
    std::nth_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(s.size() / 2), s.end());
    res.ms_per_iter = s[s.size() / 2];
    res.tokens_per_s = static_cast<double>(tokens_per_iter) / (res.ms_per_iter / 1e3);
  }
  if (show) {
    if (world > 1)
      std::printf("data parallel: %d processes, %.0f%% of gradient buckets reduced while "
                  "backward was still running\n", world, 100 * res.overlap_share);
    std::printf("done: %lld iters in %s | best val loss %.4f | median %.1f ms/iter (%s tok/s) | "
                "%lld skipped steps | curve: %s/loss.svg\n",
                static_cast<long long>(end_iter),
                format_duration(std::chrono::duration<double>(clock::now() - t_start).count()).c_str(),
                best_val, res.ms_per_iter, format_count(res.tokens_per_s).c_str(),
                static_cast<long long>(res.skipped_steps), run_dir.c_str());
  }
  return res;
}

}  // namespace ffn::train
