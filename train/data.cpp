// train/data.cpp — data loading, the synthetic corpus and the batch sampler.
#include "train/data.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "core/philox.h"

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
    FFN_CHECK(id >= 0, "[vocab] byte 0x", std::hex, static_cast<int>(static_cast<uint8_t>(text[i])),
              std::dec, " at position ", i, " is not in the vocabulary (", chars.size(),
              " characters)");
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

std::vector<int32_t> read_token_file(const std::string& path, const char* key) {
  const std::string bytes = read_file(path, key);
  size_t begin = 0, count = 0;
  int32_t header[3] = {0, 0, 0};
  if (bytes.size() >= 1024) std::memcpy(header, bytes.data(), sizeof(header));
  if (header[0] == 20240520) {  // llm.c
    if (header[1] != 1)
      config_error(std::string(key) + ": '" + path + "' has llm.c header version " +
                 std::to_string(header[1]) + " (expected 1)");
    begin = 1024;
    count = static_cast<size_t>(header[2]);
    if (bytes.size() != begin + 2 * count)
      config_error(std::string(key) + ": '" + path + "' header says " + std::to_string(count) +
                 " tokens but the file holds " + std::to_string((bytes.size() - begin) / 2) +
                 " (truncated?)");
  } else {
    if (bytes.size() % 2 != 0)
      config_error(std::string(key) + ": '" + path + "' has an odd size (" + std::to_string(bytes.size()) +
                 " bytes); expected uint16 tokens");
    count = bytes.size() / 2;
  }
  std::vector<int32_t> out(count);
  for (size_t i = 0; i < count; ++i) {
    uint16_t t;
    std::memcpy(&t, bytes.data() + begin + 2 * i, 2);
    out[i] = t;
  }
  return out;
}

Dataset load_dataset(const DataSection& d, int64_t context) {
  Dataset ds;
  std::vector<int32_t> all;
  if (d.kind == DataKind::tokens) {
    all = read_token_file(d.path, "data.path");
    if (!d.val_path.empty()) {
      ds.train = std::move(all);
      ds.val = read_token_file(d.val_path, "data.val_path");
    }
    auto max_of = [](const std::vector<int32_t>& v) {
      return v.empty() ? -1 : *std::max_element(v.begin(), v.end());
    };
    ds.train_max_id = max_of(ds.train.empty() ? all : ds.train);
    ds.val_max_id = d.val_path.empty() ? ds.train_max_id : max_of(ds.val);
    ds.vocab_size = std::max(ds.train_max_id, ds.val_max_id) + 1;
    ds.describe = "tokens from " + d.path;
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
