// train/io/json.h — a small JSON reader and string escaper: enough for safetensors headers
// (objects, arrays, strings, integers) and for checking our own metrics lines. Malformed
// input throws an error naming the offset.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ffn::train::json {

struct Value {
  enum class Type { null, boolean, number, string, array, object } type = Type::null;
  bool b = false;
  double num = 0;
  int64_t integer = 0;  // exact when the number is an integer literal
  std::string str;
  std::vector<Value> arr;
  std::map<std::string, Value> obj;

  const Value* find(const std::string& key) const;
};

Value parse(const std::string& text, const std::string& origin);
std::string escape(const std::string& s);  // a quoted JSON string

}  // namespace ffn::train::json
