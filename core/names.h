// core/names.h — name tables for the enums a user spells in configs and on command lines.
//
// Each such enum keeps one table of {value, name} beside its declaration; parsing, printing
// and the "expected one of ..." lists in errors all read that table, so a name means the
// same thing in every program (the first entry for a value is its canonical name; later
// entries are accepted aliases).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace ffn {

template <class E>
struct NameOf {
  E value;
  const char* name;
};

template <class E, size_t N>
const char* name_of(const NameOf<E> (&table)[N], E v) {
  for (const auto& e : table)
    if (e.value == v) return e.name;
  return "?";
}

template <class E, size_t N>
std::optional<E> value_of(const NameOf<E> (&table)[N], std::string_view s) {
  for (const auto& e : table)
    if (s == e.name) return e.value;
  return std::nullopt;
}

// "\"a\", \"b\" or \"c\"": the canonical names, for error messages.
template <class E, size_t N>
std::string names_list(const NameOf<E> (&table)[N]) {
  std::string out;
  size_t shown = 0, total = 0;
  for (size_t i = 0; i < N; ++i) total += name_of(table, table[i].value) == table[i].name;
  for (size_t i = 0; i < N; ++i) {
    if (name_of(table, table[i].value) != table[i].name) continue;  // an alias
    out += (shown == 0 ? "" : shown + 1 == total ? " or " : ", ");
    out.append("\"").append(table[i].name).append("\"");  // (gcc 12 -Wrestrict misfires on "\"" + s)
    ++shown;
  }
  return out;
}

}  // namespace ffn
