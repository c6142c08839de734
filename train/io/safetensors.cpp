// train/io/safetensors.cpp — safetensors read/write and CRC-32 (train/io/safetensors.h).
#include "train/io/safetensors.h"

#include <algorithm>
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
  // The reference implementation's checks (Note [Safetensors checks]).
  std::map<std::string, std::string> meta;
  if (const json::Value* m = h.find("__metadata__")) {
    FFN_CHECK(m->type == json::Value::Type::object, "[checkpoint] '", path,
              "': __metadata__ is not an object of strings");
    for (const auto& [k, v] : m->obj) {
      FFN_CHECK(v.type == json::Value::Type::string, "[checkpoint] '", path,
                "': __metadata__ value of '", k, "' is not a string");
      meta[k] = v.str;
    }
  }
  const size_t base = 8 + hn;
  const size_t data_size = bytes.size() - base;
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    size_t begin, end;
  };
  std::vector<Entry> entries;
  auto is_count = [](const json::Value& d) {
    return d.type == json::Value::Type::number && d.integer >= 0 &&
           d.num == static_cast<double>(d.integer);
  };
  for (const auto& [name, e] : h.obj) {
    if (name == "__metadata__") continue;
    const std::string where = "[checkpoint] '" + path + "': tensor '" + name + "'";
    FFN_CHECK(e.type == json::Value::Type::object, where, " is not an object");
    const json::Value* dt = e.find("dtype");
    const json::Value* sh = e.find("shape");
    const json::Value* off = e.find("data_offsets");
    FFN_CHECK(dt && dt->type == json::Value::Type::string, where, " has no dtype string");
    FFN_CHECK(sh && sh->type == json::Value::Type::array, where, " has no shape array");
    FFN_CHECK(off && off->type == json::Value::Type::array && off->arr.size() == 2 &&
                  is_count(off->arr[0]) && is_count(off->arr[1]),
              where, " has no data_offsets [begin, end] of two byte counts");
    Entry en{name, DType::f32, {}, static_cast<size_t>(off->arr[0].integer),
             static_cast<size_t>(off->arr[1].integer)};
    FFN_CHECK(parse_st_dtype(dt->str, &en.dtype), where, " has dtype '", dt->str,
              "', which this reader does not take (F64, F32, BF16, F16, I32)");
    for (const auto& d : sh->arr) {
      FFN_CHECK(is_count(d), where, " has a bad shape entry (a negative or non-integer size)");
      en.shape.push_back(d.integer);
    }
    FFN_CHECK(en.begin <= en.end, where, " has data_offsets [", en.begin, ", ", en.end,
              "] that end before they begin");
    FFN_CHECK(en.end <= data_size, "[checkpoint] '", path, "' is truncated: tensor '", name,
              "' needs bytes [", en.begin, ", ", en.end, ") of ", data_size);
    // The header's size is checked against its byte range before anything is allocated.
    double want = static_cast<double>(dtype_size(en.dtype));
    for (int64_t d : en.shape) want *= static_cast<double>(d);
    FFN_CHECK(want == static_cast<double>(en.end - en.begin), where, " has ", en.end - en.begin,
              " bytes for shape ", shape_str(en.shape), " ", dt->str);
    entries.push_back(std::move(en));
  }
  // Byte ranges in file order must tile the data exactly: from 0, each where the previous
  // ended, the last at the end of the file.
  std::vector<const Entry*> by_offset;
  for (const Entry& en : entries) by_offset.push_back(&en);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  size_t at = 0;
  const Entry* prev = nullptr;
  for (const Entry* en : by_offset) {
    if (en->begin < at)
      FFN_THROW("[checkpoint] '", path, "': tensors '", prev->name, "' [", prev->begin, ", ",
                prev->end, ") and '", en->name, "' [", en->begin, ", ", en->end,
                ") overlap (data_offsets must not share bytes)");
    if (en->begin > at)
      FFN_THROW("[checkpoint] '", path, "': bytes [", at, ", ", en->begin,
                ") before tensor '", en->name, "' belong to no tensor (data_offsets must be contiguous)");
    at = en->end;
    prev = en;
  }
  FFN_CHECK(at == data_size, "[checkpoint] '", path, "': ", data_size - at,
            " bytes of data after the last tensor belong to no tensor (corrupted or concatenated file)");
  NamedTensors out;
  for (const Entry& en : entries) {
    Tensor t = Tensor::empty(en.shape, en.dtype);
    std::memcpy(t.data_ptr(), bytes.data() + base + en.begin, en.end - en.begin);
    auto it = meta.find("crc32:" + en.name);
    if (it != meta.end()) {
      const std::string got = hex32(crc32(t.data_ptr(), t.nbytes()));
      FFN_CHECK(got == it->second, "[checkpoint] '", path, "': tensor '", en.name,
                "' is corrupted (CRC-32 ", got, ", recorded ", it->second, ")");
    }
    out.emplace_back(en.name, std::move(t));
  }
  if (metadata) *metadata = std::move(meta);
  return out;
}

}  // namespace ffn::train
