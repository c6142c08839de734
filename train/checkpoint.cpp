// train/checkpoint.cpp — safetensors I/O, CRC-32 and atomic checkpoint directories.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "train/json.h"

namespace fs = std::filesystem;

namespace ffn::train {

namespace {

const char* st_dtype(DType t) {
  switch (t) {
    case DType::f64: return "F64";
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
  }
  return "?";
}

bool parse_st_dtype(const std::string& s, DType* out) {
  for (DType t : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::i32})
    if (s == st_dtype(t)) return *out = t, true;
  return false;
}

void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    FFN_CHECK(w > 0, "[checkpoint] writing '", path, "' failed: ", std::strerror(errno));
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void write_file_synced(const std::string& path, const std::string& a, const std::string& b = {}) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  FFN_CHECK(fd >= 0, "[checkpoint] cannot create '", path, "': ", std::strerror(errno));
  write_all(fd, a.data(), a.size(), path);
  write_all(fd, b.data(), b.size(), path);
  FFN_CHECK(::fsync(fd) == 0, "[checkpoint] fsync '", path, "' failed: ", std::strerror(errno));
  ::close(fd);
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FFN_CHECK(in.good(), "[checkpoint] cannot open '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

}  // namespace

NamedTensors values_of(const std::vector<std::pair<std::string, Var>>& vars) {
  NamedTensors out;
  for (const auto& [n, v] : vars) out.emplace_back(n, v.value());
  return out;
}

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::string data;
  std::ostringstream header;
  header << "{";
  std::map<std::string, std::string> meta = metadata;
  bool first = true;
  for (const auto& [name, t] : tensors) {
    const Tensor h = t.to(Device::cpu()).contiguous();
    const size_t begin = data.size();
    data.append(static_cast<const char*>(h.data_ptr()), h.nbytes());
    meta["crc32:" + name] = hex32(crc32(h.data_ptr(), h.nbytes()));
    header << (first ? "" : ",") << json::escape(name) << ":{\"dtype\":\"" << st_dtype(h.dtype())
           << "\",\"shape\":[";
    for (int64_t d = 0; d < h.dim(); ++d) header << (d ? "," : "") << h.size(d);
    header << "],\"data_offsets\":[" << begin << "," << data.size() << "]}";
    first = false;
  }
  header << (first ? "" : ",") << "\"__metadata__\":{";
  first = true;
  for (const auto& [k, v] : meta) {
    header << (first ? "" : ",") << json::escape(k) << ":" << json::escape(v);
    first = false;
  }
  header << "}}";
  std::string hs = header.str();
  while (hs.size() % 8 != 0) hs += ' ';
  std::string prefix(8, '\0');
  const uint64_t hn = hs.size();
  std::memcpy(prefix.data(), &hn, 8);  // little-endian hosts only (x86-64, aarch64)
  write_file_synced(path, prefix + hs, data);
}

NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  const std::string bytes = read_bytes(path);
  FFN_CHECK(bytes.size() >= 8, "[checkpoint] '", path, "' is truncated (", bytes.size(),
            " bytes, no safetensors header)");
  uint64_t hn = 0;
  std::memcpy(&hn, bytes.data(), 8);
  FFN_CHECK(hn <= bytes.size() - 8, "[checkpoint] '", path, "' is truncated: header of ", hn,
            " bytes but the file has ", bytes.size());
  const json::Value h = json::parse(bytes.substr(8, hn), path);
  FFN_CHECK(h.type == json::Value::Type::object, "[checkpoint] '", path, "': header is not an object");
  std::map<std::string, std::string> meta;
  if (const json::Value* m = h.find("__metadata__"))
    for (const auto& [k, v] : m->obj) meta[k] = v.str;
  const size_t base = 8 + hn;
  const size_t data_size = bytes.size() - base;
  NamedTensors out;
  size_t covered = 0;
  for (const auto& [name, e] : h.obj) {
    if (name == "__metadata__") continue;
    const json::Value* dt = e.find("dtype");
    const json::Value* sh = e.find("shape");
    const json::Value* off = e.find("data_offsets");
    DType dtype;
    FFN_CHECK(dt && sh && off && off->arr.size() == 2 && parse_st_dtype(dt->str, &dtype),
              "[checkpoint] '", path, "': bad or unsupported entry for tensor '", name, "'");
    Shape shape;
    for (const auto& d : sh->arr) {
      FFN_CHECK(d.type == json::Value::Type::number && d.integer >= 0 &&
                    d.num == static_cast<double>(d.integer), "[checkpoint] '", path,
                "': tensor '", name, "' has a bad shape entry (a negative or non-integer size)");
      shape.push_back(d.integer);
    }
    const size_t b = static_cast<size_t>(off->arr[0].integer), en = static_cast<size_t>(off->arr[1].integer);
    FFN_CHECK(b <= en && en <= data_size, "[checkpoint] '", path, "' is truncated: tensor '", name,
              "' needs bytes [", b, ", ", en, ") of ", data_size);
    // The header's size is checked against its byte range before anything is allocated.
    double want = static_cast<double>(dtype_size(dtype));
    for (int64_t d : shape) want *= static_cast<double>(d);
    FFN_CHECK(want == static_cast<double>(en - b), "[checkpoint] '", path, "': tensor '", name,
              "' has ", en - b, " bytes for shape ", shape_str(shape), " ", dt->str);
    Tensor t = Tensor::empty(shape, dtype);
    std::memcpy(t.data_ptr(), bytes.data() + base + b, en - b);
    covered += en - b;
    auto it = meta.find("crc32:" + name);
    if (it != meta.end()) {
      const std::string got = hex32(crc32(t.data_ptr(), t.nbytes()));
      FFN_CHECK(got == it->second, "[checkpoint] '", path, "': tensor '", name,
                "' is corrupted (CRC-32 ", got, ", recorded ", it->second, ")");
    }
    out.emplace_back(name, std::move(t));
  }
  FFN_CHECK(covered == data_size, "[checkpoint] '", path, "': ", data_size - covered,
            " bytes of data belong to no tensor (corrupted or concatenated file)");
  if (metadata) *metadata = std::move(meta);
  return out;
}

std::string save_checkpoint(const std::string& run_dir, const TrainState& s,
                            const NamedTensors& model, const NamedTensors& optim,
                            const std::string& config_toml, int64_t keep) {
  const std::string name = "ckpt-" + std::to_string(s.iter);
  const fs::path final_dir = fs::path(run_dir) / name;
  const fs::path tmp = fs::path(run_dir) / (name + ".tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  save_safetensors((tmp / "model.safetensors").string(), model, {{"format", "pt"}});
  save_safetensors((tmp / "optim.safetensors").string(), optim, {{"format", "pt"}});
  write_file_synced((tmp / "config.toml").string(), config_toml);
  auto file_crc = [&](const char* f) {
    const std::string b = read_bytes((tmp / f).string());
    return std::make_pair(hex32(crc32(b.data(), b.size())), b.size());
  };
  const auto [mcrc, msize] = file_crc("model.safetensors");
  const auto [ocrc, osize] = file_crc("optim.safetensors");
  std::ostringstream st;
  st.precision(17);
  st << "# fused-ffn checkpoint state (Note [Checkpoint layout])\n"
     << "version = " << kCheckpointVersion << "\niter = " << s.iter
     << "\nrng_seed = " << static_cast<int64_t>(s.rng_seed)
     << "\nrng_offset = " << static_cast<int64_t>(s.rng_offset)
     << "\ndata_cursor = " << static_cast<int64_t>(s.data_cursor) << "\nworld = " << s.world
     << "\nbest_val = " << (std::isfinite(s.best_val) ? s.best_val : 1e308) << "\noptim_counters = [";
  for (size_t i = 0; i < s.optim_counters.size(); ++i) st << (i ? ", " : "") << s.optim_counters[i];
  st << "]\nloss_scaler = [";
  for (size_t i = 0; i < s.loss_scaler.size(); ++i) st << (i ? ", " : "") << s.loss_scaler[i];
  st << "]\nvocab = [";
  for (size_t i = 0; i < s.vocab.size(); ++i) st << (i ? ", " : "") << int{s.vocab[i]};
  st << "]\nmodel_crc32 = \"" << mcrc << "\"\nmodel_bytes = " << msize << "\noptim_crc32 = \""
     << ocrc << "\"\noptim_bytes = " << osize << "\n";
  write_file_synced((tmp / "state.toml").string(), st.str());
  fsync_dir(tmp.string());
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  fsync_dir(run_dir);
  write_latest(run_dir, name);
  // Prune: keep the newest `keep` complete checkpoints. A resumed branch has moved the
  // checkpoints newer than its start aside (Note [Run directory ownership]), so the newest
  // by iteration are the newest written.
  const auto all = list_checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) fs::remove_all(all[i].second);
  return final_dir.string();
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> all;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || n.rfind("ckpt-", 0) != 0 || n.size() == 5 ||
        n.find_first_not_of("0123456789", 5) != std::string::npos)
      continue;  // ckpt-<iter> only: not *.tmp, not a stray name
    all.emplace_back(std::stoll(n.substr(5)), e.path().string());
  }
  std::sort(all.begin(), all.end());
  return all;
}

void write_latest(const std::string& run_dir, const std::string& ckpt_name) {
  const fs::path latest_tmp = fs::path(run_dir) / "latest.tmp";
  write_file_synced(latest_tmp.string(), ckpt_name + "\n");
  fs::rename(latest_tmp, fs::path(run_dir) / "latest");
  fsync_dir(run_dir);
}

std::string resolve_checkpoint(const std::string& path) {
  const fs::path p(path);
  FFN_CHECK(fs::exists(p), "[checkpoint] '", path, "' does not exist");
  if (fs::exists(p / "state.toml")) return p.string();
  const fs::path latest = p / "latest";
  FFN_CHECK(fs::exists(latest), "[checkpoint] '", path,
            "' is neither a checkpoint directory (no state.toml) nor a run directory (no latest)");
  std::string name = read_bytes(latest.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  const fs::path dir = p / name;
  FFN_CHECK(!name.empty() && fs::exists(dir / "state.toml"), "[checkpoint] '", latest.string(),
            "' names '", name, "', which is not a complete checkpoint");
  return dir.string();
}

TrainState read_train_state(const std::string& dir) {
  const std::string path = (fs::path(dir) / "state.toml").string();
  toml::table t;
  try {
    t = toml::parse(read_bytes(path), path);
  } catch (const toml::parse_error& e) {
    FFN_THROW("[checkpoint] '", path, "' is corrupted: ", e.description());
  }
  auto get_i = [&](const char* k) -> int64_t {
    auto v = t[k].value<int64_t>();
    FFN_CHECK(v.has_value(), "[checkpoint] '", path, "' lacks integer '", k, "'");
    return *v;
  };
  const int64_t version = get_i("version");
  FFN_CHECK(version <= kCheckpointVersion, "[checkpoint] '", path, "' has format version ",
            version, ", newer than this build understands (", kCheckpointVersion,
            "); use a newer fused-ffn");
  TrainState s;
  s.iter = get_i("iter");
  s.rng_seed = static_cast<uint64_t>(get_i("rng_seed"));
  s.rng_offset = static_cast<uint64_t>(get_i("rng_offset"));
  s.data_cursor = static_cast<uint64_t>(get_i("data_cursor"));
  s.world = get_i("world");
  s.best_val = t["best_val"].value<double>().value_or(INFINITY);
  if (s.best_val >= 1e308) s.best_val = INFINITY;
  if (auto* a = t["optim_counters"].as_array())
    for (auto& e : *a) s.optim_counters.push_back(e.value<int64_t>().value_or(-1));
  if (auto* a = t["loss_scaler"].as_array())
    for (auto& e : *a) s.loss_scaler.push_back(e.value<double>().value_or(-1));
  if (auto* a = t["vocab"].as_array())
    for (auto& e : *a) s.vocab.push_back(static_cast<uint8_t>(e.value<int64_t>().value_or(0)));
  for (const char* f : {"model", "optim"}) {
    const std::string file = (fs::path(dir) / (std::string(f) + ".safetensors")).string();
    FFN_CHECK(fs::exists(file), "[checkpoint] '", file, "' is missing");
    const std::string b = read_bytes(file);
    const int64_t want = get_i((std::string(f) + "_bytes").c_str());
    FFN_CHECK(static_cast<int64_t>(b.size()) == want, "[checkpoint] '", file, "' has ", b.size(),
              " bytes, expected ", want, (static_cast<int64_t>(b.size()) < want ? " (truncated)" : ""));
    const std::string crc = t[std::string(f) + "_crc32"].value<std::string>().value_or("");
    FFN_CHECK(hex32(crc32(b.data(), b.size())) == crc, "[checkpoint] '", file,
              "' is corrupted (file CRC-32 ", hex32(crc32(b.data(), b.size())), ", recorded ", crc,
              ")");
  }
  return s;
}

void load_tensors_into(const std::string& file, const NamedTensors& into, bool allow_cast) {
  NamedTensors stored = load_safetensors(file);
  std::map<std::string, Tensor> by_name;
  for (auto& [n, t] : stored) by_name[n] = t;
  for (const auto& [name, dst] : into) {
    auto it = by_name.find(name);
    FFN_CHECK(it != by_name.end(), "[checkpoint] '", file, "' has no tensor '", name,
              "' (a different model config?)");
    const Tensor& src = it->second;
    FFN_CHECK(src.shape() == dst.shape(), "[checkpoint] '", file, "': tensor '", name, "' is ",
              shape_str(src.shape()), " but the model expects ", shape_str(dst.shape()));
    FFN_CHECK(allow_cast || src.dtype() == dst.dtype(), "[checkpoint] '", file, "': tensor '", name,
              "' is ", dtype_name(src.dtype()), " but the run uses ", dtype_name(dst.dtype()),
              " (resume with the same runtime.precision)");
    Tensor d = dst;
    d.copy_(src);
    by_name.erase(it);
  }
  if (!by_name.empty())
    FFN_THROW("[checkpoint] '", file, "' has ", by_name.size(), " tensors the model does not (e.g. '",
              by_name.begin()->first, "'): a different model config?");
}

}  // namespace ffn::train
