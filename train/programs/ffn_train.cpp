// train/programs/ffn_train.cpp — `ffn-train CONFIG [--set k=v]… [--resume DIR]`: the main job.
//
// Exit codes: 0 done, or stopped by a SIGTERM/SIGINT after writing a checkpoint (Note
// [Graceful stop]: the output and metrics.jsonl say "stopped"; a second signal aborts with
// 128 + signal); 1 runtime failure (bad checkpoint, non-finite training, CUDA/NCCL error, a
// peer lost); 2 configuration error (bad flags, unknown/mistyped/out-of-range config keys),
// reported before any device memory is allocated.
//
// Data parallel: `--nproc N` (or runtime.nproc) starts N local workers of this same command
// (train/dist/dist.h); under torchrun/srun/mpirun-style launchers the RANK/WORLD_SIZE/LOCAL_RANK/
// MASTER_ADDR/MASTER_PORT variables make each process one rank.
#include <CLI/CLI.hpp>

#include <cstdio>

#include <cstdlib>

#include "core/error.h"
#include "train/dist/dist.h"
#include "train/checkpoint.h"
#include "train/programs/cli_checks.h"
#include "train/run_dir.h"
#include "train/stop.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
  CLI::App app{
      "ffn-train: train a GPT with fused FFN kernels from a TOML config.\n"
      "Writes <run.dir>/{config.toml, metrics.jsonl, loss.svg, ckpt-*/, latest}.\n"
      "Example: ffn-train configs/tiny.toml --set train.iters=500 --set runtime.device=cpu",
      "ffn-train"};
  std::string config_path, resume, init_from;
  std::vector<std::string> sets;
  bool overwrite = false, quiet = false, print_config = false, profile_comm = false;
  int64_t stop_after = 0, nproc = 0, bucket_mb = 25;
  std::string grad_reduce = "nccl";
  double comm_timeout = 300;
  app.add_option("config", config_path,
                 "TOML config file (see configs/); with --resume it may be left out, and the "
                 "run's own config is used");
  app.add_option("--set", sets,
                 "Override a config key: section.key=value (repeatable), e.g. --set train.lr=3e-4");
  app.add_option("--resume", resume,
                 "Continue a run from its directory (its newest intact checkpoint) or a ckpt-* "
                 "directory, writing into that run; --set may change e.g. train.iters, not the "
                 "model, data, seed, batch size or precision. 'auto' (with a config file): "
                 "continue run.dir if it holds a checkpoint, else start it (for relaunches by "
                 "torchrun --max-restarts or a scheduler's requeue)");
  app.add_option("--init-from", init_from,
                 "Start a new run from these weights: a run or ckpt-* directory or a "
                 ".safetensors file in our, HuggingFace GPT-2's or nanoGPT's layout (see "
                 "ffn-convert), or for model.arch = llama with HuggingFace Llama's names; the "
                 "config's model must have the same shape");
  app.add_flag("--overwrite", overwrite,
               "Start fresh even if run.dir holds checkpoints (deletes them and the metrics)");
  app.add_option("--stop-after", stop_after,
                 "Run at most N iterations in this process, checkpoint and exit (resume later)")
      ->check(ffn::train::integer_at_least(0));
  app.add_flag("--quiet", quiet, "No progress display (metrics.jsonl is still written)");
  app.add_option("--nproc", nproc,
                 "Data parallel on N local GPUs: start N worker processes (default: runtime.nproc)")
      ->check(ffn::train::integer_at_least(1));
  app.add_option("--bucket-mb", bucket_mb, "Gradient all-reduce bucket size in MiB (data parallel)")
      ->check(ffn::train::integer_at_least(1));
  app.add_option("--grad-reduce", grad_reduce,
                 "Data parallel: how gradient buckets are reduced during backward: nccl "
                 "(default) or copy-engine (NCCL >= 2.28; Note [Copy-engine gradient reduction])")
      ->check(CLI::IsMember({"nccl", "copy-engine"}));
  app.add_option("--comm-timeout", comm_timeout,
                 "Seconds a collective may take before the run is aborted (data parallel)")
      ->check(ffn::train::number_at_least(0.0, /*strict=*/true));
  app.add_flag("--profile-comm", profile_comm,
               "Data parallel: time every collective and print where a step's time goes");
  app.add_flag("--print-config", print_config, "Print the resolved config and exit");
  app.footer(ffn::train::Config::keys_help());
  return ffn::train::run_program(app, argc, argv, "ffn-train", /*newline=*/true,
                                 [&]() -> int {
    if (nproc > 0) {
      std::string set = "runtime.nproc=";
      set += std::to_string(nproc);
      sets.push_back(set);
    }
    if (config_path.empty() && (resume.empty() || resume == "auto")) {
      std::fprintf(stderr, "ffn-train: a config file is required (or --resume RUN_DIR)%s\n%s",
                   resume == "auto" ? "; --resume auto looks in the config's run.dir" : "",
                   app.help().c_str());
      return 2;
    }
    const ffn::train::Config cfg = config_path.empty()
                                       ? ffn::train::resume_config(resume, sets)
                                       : ffn::train::Config::load(config_path, sets);
    if (resume == "auto")  // every rank decides alike: nothing is written before they start
      resume = ffn::train::list_checkpoints(cfg.run.dir).empty() ? "" : cfg.run.dir;
    if (cfg.runtime.nproc > 1 && !std::getenv("RANK") && !print_config) {
      // The launcher: N copies of this command, each a rank (they re-read the config).
      std::vector<std::string> args(argv, argv + argc);
      return ffn::train::launch_local(static_cast<int>(cfg.runtime.nproc), args);
    }
    if (print_config) {
      std::fputs(cfg.to_toml().c_str(), stdout);
      return 0;
    }
    ffn::train::TrainOptions opt;
    opt.resume = resume;
    opt.init_from = init_from;
    opt.overwrite = overwrite;
    opt.stop_after = stop_after;
    opt.quiet = quiet;
    opt.bucket_mb = bucket_mb;
    opt.grad_reduce = grad_reduce;
    opt.comm_timeout_s = comm_timeout;
    opt.profile_comm = profile_comm;
    ffn::train::install_stop_handlers();
    const ffn::train::TrainResult res = ffn::train::run_training(cfg, opt);
    if (res.stop_signal && quiet && !res.last_checkpoint.empty())  // the writing rank
      std::printf("stopped by %s at iter %lld (not finished): checkpoint %s\n"
                  "continue with: ffn-train --resume %s\n",
                  ffn::train::signal_name(res.stop_signal), static_cast<long long>(res.iters_done),
                  res.last_checkpoint.c_str(), res.run_dir.c_str());
    return 0;
  });
}
