// train/data.h — training data: tokens in memory, a deterministic train/val split, and
// a seeded batch sampler whose whole position is one integer (saved in checkpoints).
//
// Sources (data.kind):
//   synthetic  an embedded generated corpus (a few hundred KB of English-like text from a
//              small fixed grammar), character-level; the main job needs no download
//   text       a plain-text file, character-level (byte) vocabulary built from the text
//   tokens     uint16 token files as nanoGPT writes them (headerless) or llm.c's (a
//              256×int32 header: magic 20240520, version, token count)
// The split is the last val_fraction of the tokens (or data.val_path for token files).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "train/config.h"

namespace ffn::train {

struct Dataset {
  std::vector<int32_t> train;
  std::vector<int32_t> val;
  int64_t vocab_size = 0;       // characters: distinct bytes; tokens: 1 + the largest id
  int32_t train_max_id = -1;    // tokens: the largest id of each split
  int32_t val_max_id = -1;
  std::vector<uint8_t> chars;  // character-level: token id → byte (empty for token files)
  std::string describe;        // one line for the log
};

// Throws config errors for missing/unreadable/invalid files naming the key and path.
Dataset load_dataset(const DataSection& d, int64_t context);

// Note [Token ids in range]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// The training loop and eval pass ids_in_range = true to the model (no per-step range
// check, no device sync), so every id of both splits is checked once here, before
// training: a config error naming the file's key (data.path or data.val_path), the
// largest id and vocab_size.
void check_vocab(const Dataset& ds, const DataSection& d, int64_t vocab);
// The embedded synthetic corpus (deterministic).
std::string synthetic_corpus();
// Reads a token file (Note [Token file layouts]); errors name `key` and the file.
struct TokenFile {
  std::vector<int32_t> ids;
  std::string layout;  // "headerless uint16", "llm.c v1 header", ...
};
TokenFile read_token_file_layout(const std::string& path, const char* key = "data.path");
std::vector<int32_t> read_token_file(const std::string& path, const char* key = "data.path");

// Encodes text with a character vocabulary; an unknown byte is an error naming it.
std::vector<int32_t> encode_chars(const std::vector<uint8_t>& chars, const std::string& text);
std::string decode_chars(const std::vector<uint8_t>& chars, const std::vector<int32_t>& ids);

// Batch n of a split: rows start at offsets drawn from Philox(seed, n), so batches are a
// pure function of (seed, n). Row r of the global batch is sequence tokens[o_r, o_r+T) and
// its targets tokens[o_r+1, o_r+T+1). `rank`/`world` take rows [rank·B/world, …).
struct Batch {
  Tensor x, y;  // i32 [B/world, T] on the host
};
Batch sample_batch(const std::vector<int32_t>& tokens, int64_t batch, int64_t context,
                   uint64_t seed, uint64_t n, int rank = 0, int world = 1);

}  // namespace ffn::train
