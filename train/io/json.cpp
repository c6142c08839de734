// train/io/json.cpp — the recursive-descent reader behind train/io/json.h.
#include "train/io/json.h"

#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace ffn::train::json {

namespace {
struct Parser {
  const std::string& s;
  const std::string& origin;
  size_t i = 0;

  [[noreturn]] void fail(const std::string& what) {
    FFN_THROW("[json] ", origin, ": ", what, " at offset ", i);
  }
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
  }
  bool eat(char c) {
    ws();
    if (i < s.size() && s[i] == c) return ++i, true;
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  std::string string_() {
    expect('"');
    std::string out;
    while (true) {
      if (i >= s.size()) fail("unterminated string");
      const char c = s[i++];
      if (c == '"') break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size()) fail("unterminated escape");
      const char e = s[i++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i + 4 > s.size()) fail("bad \\u escape");
          const unsigned cp = static_cast<unsigned>(std::strtoul(s.substr(i, 4).c_str(), nullptr, 16));
          i += 4;
          if (cp < 0x80) {
            out += static_cast<char>(cp);
          } else if (cp < 0x800) {
            out += static_cast<char>(0xc0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3f));
          } else {
            out += static_cast<char>(0xe0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
            out += static_cast<char>(0x80 | (cp & 0x3f));
          }
          break;
        }
        default: out += e;
      }
    }
    return out;
  }
  Value value() {
    ws();
    if (i >= s.size()) fail("unexpected end");
    Value v;
    const char c = s[i];
    if (c == '{') {
      ++i;
      v.type = Value::Type::object;
      if (eat('}')) return v;
      do {
        ws();
        std::string k = string_();
        expect(':');
        v.obj[k] = value();
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++i;
      v.type = Value::Type::array;
      if (eat(']')) return v;
      do v.arr.push_back(value());
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.type = Value::Type::string;
      v.str = string_();
    } else if (s.compare(i, 4, "true") == 0 || s.compare(i, 5, "false") == 0) {
      v.type = Value::Type::boolean;
      v.b = s[i] == 't';
      i += v.b ? 4 : 5;
    } else if (s.compare(i, 4, "null") == 0) {
      i += 4;
    } else {
      const size_t start = i;
      while (i < s.size() && std::string("+-0123456789.eE").find(s[i]) != std::string::npos) ++i;
      if (start == i) fail("unexpected character");
      const std::string lit = s.substr(start, i - start);
      v.type = Value::Type::number;
      v.num = std::strtod(lit.c_str(), nullptr);
      v.integer = std::strtoll(lit.c_str(), nullptr, 10);
    }
    return v;
  }
};
}  // namespace

const Value* Value::find(const std::string& key) const {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &it->second;
}

Value parse(const std::string& text, const std::string& origin) {
  Parser p{text, origin};
  Value v = p.value();
  p.ws();
  if (p.i != text.size()) p.fail("trailing characters");
  return v;
}

std::string escape(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace ffn::train::json
