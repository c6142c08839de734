// train/ffn_train.cpp — `ffn-train CONFIG [--set k=v]… [--resume DIR]`: the main job.
//
// Exit codes: 0 done; 1 runtime failure (bad checkpoint, non-finite training, CUDA error);
// 2 configuration error (bad flags, unknown/mistyped/out-of-range config keys), reported
// before any device memory is allocated.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "core/error.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
  CLI::App app{
      "ffn-train: train a GPT with fused FFN kernels from a TOML config.\n"
      "Writes <run.dir>/{config.toml, metrics.jsonl, loss.svg, ckpt-*/, latest}.\n"
      "Example: ffn-train configs/tiny.toml --set train.iters=500 --set runtime.device=cpu",
      "ffn-train"};
  std::string config_path, resume;
  std::vector<std::string> sets;
  bool overwrite = false, quiet = false, print_config = false;
  int64_t stop_after = 0;
  app.add_option("config", config_path, "TOML config file (see configs/)")->required();
  app.add_option("--set", sets,
                 "Override a config key: section.key=value (repeatable), e.g. --set train.lr=3e-4");
  app.add_option("--resume", resume,
                 "Continue from a run directory (its latest checkpoint) or a ckpt-* directory");
  app.add_flag("--overwrite", overwrite,
               "Start fresh even if run.dir holds checkpoints (deletes them and the metrics)");
  app.add_option("--stop-after", stop_after,
                 "Run at most N iterations in this process, checkpoint and exit (resume later)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--quiet", quiet, "No progress display (metrics.jsonl is still written)");
  app.add_flag("--print-config", print_config, "Print the resolved config and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    const ffn::train::Config cfg = ffn::train::Config::load(config_path, sets);
    if (print_config) {
      std::fputs(cfg.to_toml().c_str(), stdout);
      return 0;
    }
    ffn::train::TrainOptions opt;
    opt.resume = resume;
    opt.overwrite = overwrite;
    opt.stop_after = stop_after;
    opt.quiet = quiet;
    ffn::train::run_training(cfg, opt);
    return 0;
  } catch (const ffn::Error& e) {
    std::fprintf(stderr, "\nffn-train: error: %s\n", e.what());
    return e.kind() == ffn::ErrorKind::config ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nffn-train: error: %s\n", e.what());
    return 1;
  }
}
