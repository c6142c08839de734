// train/config.h — the typed training configuration and its TOML front end.
//
// A config file has the sections of docs/design.md ([run], [runtime], [data], [model], [train]).
// Every key has a default here; a file only states what differs. Unknown sections or keys,
// values of the wrong type and values out of range are errors of kind ErrorKind::config
// whose message starts with the full key path, e.g.
//   [config] train.lr: expected a number > 0, got -1
// They are raised while parsing, before any device memory is touched (main maps them to
// exit code 2). `--set section.key=value` overrides are applied on top of the file with the
// same checks. to_toml() writes the resolved config (every key) into the run directory.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/names.h"
#include "layers/layers.h"       // FfnKind
#include "layers/transformer.h"  // Arch
#include "optim/adamw.h"    // LrSchedule

namespace ffn::train {

// runtime.precision; "auto" is bf16 on a GPU and fp32 on the CPU (compute_dtype).
enum class Precision : uint8_t { automatic, bf16, fp16, fp32 };
inline constexpr NameOf<Precision> kPrecisionNames[] = {{Precision::automatic, "auto"},
                                                        {Precision::bf16, "bf16"},
                                                        {Precision::fp16, "fp16"},
                                                        {Precision::fp32, "fp32"}};
// Throws Error(kind = config) with "[config] " + msg; msg starts with the key or file.
[[noreturn]] void config_error(const std::string& msg);

// The compute dtype of a run; a 16-bit precision on the CPU is a config error.
DType compute_dtype(Precision p, Device dev);

// data.kind.
enum class DataKind : uint8_t { synthetic, text, tokens };
inline constexpr NameOf<DataKind> kDataKindNames[] = {
    {DataKind::synthetic, "synthetic"}, {DataKind::text, "text"}, {DataKind::tokens, "tokens"}};

struct RunSection {
  std::string dir = "runs/default";
  int64_t seed = 1337;
  int64_t log_every = 10;
  int64_t eval_every = 250;
  int64_t eval_iters = 200;
  int64_t checkpoint_every = 0;  // 0: at every eval
  int64_t keep_checkpoints = 2;
};

struct RuntimeSection {
  DeviceRequest device;                     // "auto" | "cpu" | "cuda" | "cuda:N"
  Precision precision = Precision::automatic;  // kPrecisionNames
  int64_t nproc = 1;
  bool gemm_autotune = true;  // time cuBLASLt candidates, kept in checkpoints (Note [GEMM choices])
  bool gemm_epilogues = true;  // elementwise work in GEMM epilogues (Note [Activation epilogues])
  bool fp32_residual = true;   // bf16/fp16 runs: residual stream in fp32 (as PyTorch autocast)
  bool fused_attention = true;  // GPU bf16/fp16: flash-style attention kernels where they apply
  bool fused_classifier = true;  // the loss without the [B·T, V] logits (Note [Fused classifier])
  int64_t classifier_chunk = 0;  // its rows per chunk; 0: automatic (GPT::classifier_chunk)
  bool cuda_graph = true;  // the step captured once and replayed (Note [CUDA graph step])
};

struct DataSection {
  DataKind kind = DataKind::synthetic;
  std::string path;                // text file or uint16 .bin token file
  std::string val_path;            // tokens only: separate validation .bin (else split)
  double val_fraction = 0.1;
};

struct ModelSection {
  Arch arch = Arch::gpt;   // kArchNames (layers/transformer.h)
  int64_t vocab_size = 0;  // 0: from the data (text/synthetic); required for tokens
  int64_t vocab_pad_to = 128;  // Note [Padded vocabulary] (layers/transformer.h); 1: none
  int64_t context = 64;
  int64_t layers = 2;
  int64_t heads = 2;
  int64_t d_model = 64;
  FfnKind ffn = FfnKind::gelu;  // kFfnKindNames; ffn_activation() gives its math
  double ffn_mult = 4.0;
  double dropout = 0.0;
  bool bias = true;
  int64_t kv_heads = 0;        // llama: key/value heads (0: heads)
  double rope_theta = 10000.0;  // llama: the rotary embeddings' base
  double norm_eps = 1e-5;       // llama: RMSNorm's eps
  bool tie_embeddings = true;   // false: a separate LM head
};

struct TrainSection {
  int64_t batch_size = 16;  // global batch of one micro-batch (sequences, over all GPUs)
  int64_t grad_accum_steps = 1;  // micro-batches per optimizer step (Note [Gradient accumulation])
  int64_t zero = 0;  // 1: ZeRO-1, the optimizer state sharded over the ranks (Note [ZeRO-1])
  int64_t iters = 300;
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup = 20;
  int64_t decay_iters = 0;  // 0: iters
  LrSchedule schedule = LrSchedule::cosine;
  double weight_decay = 0.1;
  bool decay_matrices_only = true;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0: off
  int64_t max_nonfinite = 20;
};

struct Config {
  RunSection run;
  RuntimeSection runtime;
  DataSection data;
  ModelSection model;
  TrainSection train;

  // Parses TOML text (`origin` names it in errors), then applies "section.key=value"
  // overrides. Throws Error(kind = config) naming the key on any problem.
  static Config parse(const std::string& toml_text, const std::string& origin,
                      const std::vector<std::string>& overrides = {});
  static Config load(const std::string& path, const std::vector<std::string>& overrides = {});
  // Every key, resolved, as TOML (parse(to_toml()) gives back the same config); `resolved`
  // adds a "# resolved: ..." comment to keys whose "auto" the run turned into something.
  std::string to_toml(const std::map<std::string, std::string>& resolved = {}) const;
  // Every key with its default and a one-line description (ffn-train --help).
  static std::string keys_help();
  // Keys the reader takes without a description, and descriptions of no key (tests).
  static std::vector<std::string> undocumented_keys();
  // Every key as ("section.key", TOML value), in to_toml()'s order.
  std::vector<std::pair<std::string, std::string>> entries() const;
};

}  // namespace ffn::train
