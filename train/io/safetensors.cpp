// train/io/safetensors.cpp — safetensors read/write and CRC-32 (train/io/safetensors.h).
#include "train/io/safetensors.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "train/io/files.h"
#include "train/io/json.h"

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

}  // namespace

std::string hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

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

}  // namespace ffn::train
