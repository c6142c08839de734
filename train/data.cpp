// train/data.cpp — data loading, the synthetic corpus and the batch sampler.
#include "train/data.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include "core/philox.h"
#include "train/metrics.h"  // format_count

namespace ffn::train {

namespace {
std::string read_file(const std::string& path, const char* key) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    config_error(std::string(key) + ": '" + path + "' is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) config_error(std::string(key) + ": cannot open '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

std::string synthetic_corpus() {
  // A tiny grammar: who does what to whom, where and how; fixed seed, ~300 KB.
  static const std::array<const char*, 12> who = {
      "the old king", "a young queen", "the tired farmer", "my brother",  "the cat",
      "a wise owl",   "the captain",   "her mother",       "the miller", "a stranger",
      "the children", "our neighbour"};
  static const std::array<const char*, 10> verb = {"saw",    "followed", "feared",
                                                   "helped", "loved",    "called",
                                                   "found",  "forgot",   "praised",
                                                   "watched"};
  static const std::array<const char*, 10> where = {
      "by the river", "in the castle", "at the market", "under the old bridge",
      "near the mill", "in the dark forest", "on the hill", "at dawn",
      "in the garden", "by the sea"};
  static const std::array<const char*, 8> how = {"quietly",  "at last",  "again", "with joy",
                                                 "in vain",  "gladly",   "twice", "for a while"};
  std::string out;
  out.reserve(320000);
  uint64_t n = 0;
  while (out.size() < 300000) {
    const U32x4 r = philox_block(20261122ull, 0, n++);
    std::string s = std::string(who[r.v[0] % who.size()]) + " " + verb[r.v[1] % verb.size()] +
                    " " + who[(r.v[0] / 16) % who.size()] + " " + where[r.v[2] % where.size()];
    if (r.v[3] % 3 == 0) s += std::string(" ") + how[(r.v[3] / 3) % how.size()];
    s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    s += (r.v[3] % 7 == 0) ? "!\n" : ".\n";
    out += s;
  }
  return out;
}

std::vector<int32_t> encode_chars(const std::vector<uint8_t>& chars, const std::string& text) {
  std::array<int32_t, 256> map;
  map.fill(-1);
  for (size_t i = 0; i < chars.size(); ++i) map[chars[i]] = static_cast<int32_t>(i);
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const int32_t id = map[static_cast<uint8_t>(text[i])];
    if (id < 0) {
      const auto byte = static_cast<uint8_t>(text[i]);
      char shown[32];
      if (byte >= 0x20 && byte < 0x7f)
        std::snprintf(shown, sizeof(shown), "'%c' (byte 0x%02x)", static_cast<char>(byte), byte);
      else
        std::snprintf(shown, sizeof(shown), "byte 0x%02x", byte);
      FFN_THROW("[vocab] ", shown, " at position ", i, " is not in the vocabulary (",
                chars.size(), " characters)");
    }
    ids[i] = id;
  }
  return ids;
}

std::string decode_chars(const std::vector<uint8_t>& chars, const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids)
    s += (id >= 0 && id < static_cast<int32_t>(chars.size())) ? static_cast<char>(chars[id]) : '?';
  return s;
}

// Note [Token file layouts]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// nanoGPT writes bare uint16 tokens; llm.c a 1024-byte header of 256 int32 (magic 20240520,
// version 1: uint16 tokens; version 2: uint32 tokens; then the token count) before them.
// A file whose first int32 is the magic is llm.c's and its version and count must agree
// with its size. A file that starts with another int32 but whose third int32 is a token
// count that, after a 1024-byte header, matches its size exactly is almost surely an llm.c
// file with a damaged or foreign magic, not tokens: it is refused, naming the file, rather
// than trained on with its header as 512 tokens.
TokenFile read_token_file_layout(const std::string& path, const char* key) {
  const std::string bytes = read_file(path, key);
  TokenFile f;
  size_t begin = 0, count = 0, width = 2;
  int32_t header[3] = {0, 0, 0};
  if (bytes.size() >= 1024) std::memcpy(header, bytes.data(), sizeof(header));
  const auto fits = [&](size_t w) {
    return header[2] > 0 && bytes.size() == 1024 + w * static_cast<size_t>(header[2]);
  };
  if (header[0] == 20240520) {
    if (header[1] != 1 && header[1] != 2)
      config_error(std::string(key) + ": '" + path + "' has llm.c header version " +
                   std::to_string(header[1]) + " (this build reads 1: uint16 tokens, 2: uint32)");
    begin = 1024;
    width = header[1] == 1 ? 2 : 4;
    count = static_cast<size_t>(std::max(header[2], 0));
    if (bytes.size() != begin + width * count)
      config_error(std::string(key) + ": '" + path + "' header says " + std::to_string(count) +
                   " tokens but the file holds " + std::to_string((bytes.size() - begin) / width) +
                   " (truncated?)");
    f.layout = "llm.c v" + std::to_string(header[1]) + " header";
  } else if (bytes.size() >= 1024 && (fits(2) || fits(4))) {
    config_error(std::string(key) + ": '" + path + "' looks like an llm.c token file (after a " +
                 "1024-byte header its third int32, " + std::to_string(header[2]) +
                 ", is the number of tokens the file holds) but its magic is " +
                 std::to_string(header[0]) + ", not 20240520; refusing to read the header as " +
                 "tokens. Rewrite the header, or strip the first 1024 bytes for a headerless file");
  } else {
    if (bytes.size() % 2 != 0)
      config_error(std::string(key) + ": '" + path + "' has an odd size (" +
                   std::to_string(bytes.size()) + " bytes); expected uint16 tokens");
    count = bytes.size() / 2;
    f.layout = "headerless uint16";
  }
  f.ids.resize(count);
  for (size_t i = 0; i < count; ++i) {
    if (width == 2) {
      uint16_t t;
      std::memcpy(&t, bytes.data() + begin + 2 * i, 2);
      f.ids[i] = t;
    } else {
      uint32_t t;
      std::memcpy(&t, bytes.data() + begin + 4 * i, 4);
      if (t > static_cast<uint32_t>(std::numeric_limits<int32_t>::max()))
        config_error(std::string(key) + ": '" + path + "' token " + std::to_string(i) + " is " +
                     std::to_string(t) + ", beyond int32");
      f.ids[i] = static_cast<int32_t>(t);
    }
  }
  return f;
}

std::vector<int32_t> read_token_file(const std::string& path, const char* key) {
  return read_token_file_layout(path, key).ids;
}

Dataset load_dataset(const DataSection& d, int64_t context) {
  Dataset ds;
  std::vector<int32_t> all;
  if (d.kind == DataKind::tokens) {
    TokenFile tf = read_token_file_layout(d.path, "data.path");
    all = std::move(tf.ids);
    ds.describe = "tokens from " + d.path + " (" + tf.layout + ", " +
                  format_count(static_cast<double>(all.size())) + " tokens)";
    if (!d.val_path.empty()) {
      ds.train = std::move(all);
      TokenFile vf = read_token_file_layout(d.val_path, "data.val_path");
      ds.val = std::move(vf.ids);
      ds.describe += ", val " + d.val_path + " (" + vf.layout + ", " +
                     format_count(static_cast<double>(ds.val.size())) + " tokens)";
    } else {
      ds.describe += ", val the last " + std::to_string(static_cast<int>(d.val_fraction * 100 + 0.5)) + "%";
    }
    auto max_of = [](const std::vector<int32_t>& v) {
      return v.empty() ? -1 : *std::max_element(v.begin(), v.end());
    };
    ds.train_max_id = max_of(ds.train.empty() ? all : ds.train);
    ds.val_max_id = d.val_path.empty() ? ds.train_max_id : max_of(ds.val);
    ds.vocab_size = std::max(ds.train_max_id, ds.val_max_id) + 1;
    ds.describe += "; vocab = largest id + 1 = " + std::to_string(ds.vocab_size);
  } else {
    const bool text_file = d.kind == DataKind::text;
    const std::string text = text_file ? read_file(d.path, "data.path") : synthetic_corpus();
    std::array<bool, 256> seen{};
    for (char c : text) seen[static_cast<uint8_t>(c)] = true;
    for (int c = 0; c < 256; ++c)
      if (seen[c]) ds.chars.push_back(static_cast<uint8_t>(c));
    all = encode_chars(ds.chars, text);
    ds.vocab_size = static_cast<int64_t>(ds.chars.size());
    ds.describe = (text_file ? "characters of " + d.path : std::string("synthetic corpus")) +
                  " (" + std::to_string(text.size()) + " chars, vocab " +
                  std::to_string(ds.vocab_size) + ")";
  }
  if (ds.train.empty()) {
    const size_t n_val = static_cast<size_t>(static_cast<double>(all.size()) * d.val_fraction);
    ds.train.assign(all.begin(), all.end() - static_cast<std::ptrdiff_t>(n_val));
    ds.val.assign(all.end() - static_cast<std::ptrdiff_t>(n_val), all.end());
  }
  for (const auto* split : {&ds.train, &ds.val})
    if (static_cast<int64_t>(split->size()) < context + 1)
      config_error(std::string("data.") + (split == &ds.train ? "path" : "val_fraction") + ": the " +
                 (split == &ds.train ? "train" : "val") + " split has " +
                 std::to_string(split->size()) + " tokens, fewer than context + 1 = " +
                 std::to_string(context + 1));
  return ds;
}

void check_vocab(const Dataset& ds, const DataSection& d, int64_t vocab) {
  if (!ds.chars.empty()) {
    if (vocab < ds.vocab_size)
      config_error("model.vocab_size: " + std::to_string(vocab) + " is smaller than the data's " +
                 std::to_string(ds.vocab_size) + " distinct characters");
    return;
  }
  // Token files: every id of both splits must index the embedding (Note [Token ids in range]).
  const bool split_file = d.val_path.empty();
  for (const auto& [key, path, mx] :
       {std::tuple{"data.path", d.path, ds.train_max_id},
        std::tuple{split_file ? "data.path" : "data.val_path", split_file ? d.path : d.val_path,
                   ds.val_max_id}})
    if (mx >= vocab)
      config_error(std::string(key) + ": '" + path + "' holds token id " + std::to_string(mx) +
                 ", but model.vocab_size = " + std::to_string(vocab) +
                 " (ids must be < vocab_size)");
}

Batch sample_batch(const std::vector<int32_t>& tokens, int64_t batch, int64_t context,
                   uint64_t seed, uint64_t n, int rank, int world) {
  const int64_t local = batch / world, first = rank * local;
  const uint64_t range = tokens.size() - static_cast<uint64_t>(context);  // offsets [0, range)
  std::vector<int32_t> x(static_cast<size_t>(local * context)), y(x.size());
  for (int64_t r = 0; r < local; ++r) {
    const int64_t row = first + r;
    const U32x4 rnd = philox_block(seed, n, static_cast<uint64_t>(row));
    const uint64_t wide = (static_cast<uint64_t>(rnd.v[0]) << 32) | rnd.v[1];
    const size_t o = static_cast<size_t>(wide % range);
    std::copy_n(tokens.begin() + o, context, x.begin() + r * context);
    std::copy_n(tokens.begin() + o + 1, context, y.begin() + r * context);
  }
  Batch b{Tensor::empty({local, context}, DType::i32), Tensor::empty({local, context}, DType::i32)};
  std::memcpy(b.x.data<int32_t>(), x.data(), x.size() * 4);
  std::memcpy(b.y.data<int32_t>(), y.data(), y.size() * 4);
  return b;
}

}  // namespace ffn::train
